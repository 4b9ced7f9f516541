"""Counting (the CoPE paper, Golovneva et al. 2024, section 4.3: count what matters, skipping what does not).

A program of ``size`` operations on ``variables`` variables: ``set v`` (v becomes 0), ``inc v`` (v grows by one)
and ``pass`` (nothing); after an operation, with probability 1/4, and after the last, a query ``? v`` asks
v's value, the answer. Values stay below
``MAXIMUM`` (an ``inc`` that would reach it is a ``set`` instead), so that longer programs ask for no value
unseen in training. Training draws a ``pass`` with probability 0.3; the out-of-distribution splits are dense
(no ``pass``) and sparse (``pass`` with probability 0.8), at the training length; the longer splits keep the
training mixture.
"""

import random
from typing import Dict, List, Sequence

from posattn_tasks.tasks.base import Example, Sizes, Split, Task, length_splits, next_token_answers

SET, INC, PASS, QUERY = range(4)
FIRST_VARIABLE = 4
VARIABLES = 3
MAXIMUM = 10
TRAINING_P_PASS = 0.3
P_QUERY = 0.25
P_SET = 0.1


class Counting(Task):
    name = "counting"
    citation = "Golovneva et al. 2024, arXiv 2405.18719, section 4.3"
    unit = "operations"
    about = "answer each query with the count of increments of its variable since it was last set"
    tiers = {"quick": Sizes(size=8, steps=60, batch_size=16), "cpu": Sizes(size=16, steps=1200, batch_size=64),
             "gpu": Sizes(size=128, steps=10000, batch_size=64, learning_rate=1e-3)}

    def vocabulary_size(self) -> int:
        return FIRST_VARIABLE + VARIABLES + MAXIMUM

    def answer_tokens(self) -> Sequence[int]:
        return range(self.first_value(), self.first_value() + MAXIMUM)

    def first_value(self) -> int:
        return FIRST_VARIABLE + VARIABLES

    def tokens_at(self, size: int) -> int:
        return 2 * size + 3 * size

    def example(self, rng: random.Random, size: int, p_pass: float = TRAINING_P_PASS) -> Example:
        values = [0] * VARIABLES
        tokens: List[int] = []
        answers: List[int] = []
        for step in range(size):
            variable = rng.randrange(VARIABLES)
            draw = rng.random()
            if draw < p_pass:
                tokens.append(PASS)
            else:
                operation = SET if draw < p_pass + P_SET * (1 - p_pass) or values[variable] == MAXIMUM - 1 else INC
                values[variable] = 0 if operation == SET else values[variable] + 1
                tokens += [operation, FIRST_VARIABLE + variable]
            if rng.random() < P_QUERY or step == size - 1:
                asked = rng.randrange(VARIABLES)
                tokens += [QUERY, FIRST_VARIABLE + asked, self.first_value() + values[asked]]
                answers.append(len(tokens) - 1)
        return Example.of(tokens, next_token_answers(tokens, answers))

    def solve(self, tokens: Sequence[int]) -> Dict[int, int]:
        answers = {}
        for position in range(len(tokens) - 1):
            if tokens[position - 1] != QUERY or position == 0:
                continue
            asked, count = tokens[position], 0
            for back in range(position - 2, 0, -1):
                if tokens[back] == asked and tokens[back - 1] in (SET, INC):
                    if tokens[back - 1] == SET:
                        break
                    count += 1
            answers[position] = self.first_value() + count
        return answers

    def splits(self) -> List[Split]:
        return length_splits() + [
            Split("dense", 1, {"p_pass": 0.0}, "no pass operations"),
            Split("sparse", 1, {"p_pass": 0.8}, "pass in four operations of five")]
