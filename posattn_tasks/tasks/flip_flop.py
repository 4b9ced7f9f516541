"""Flip-flop language modelling (Liu et al. 2023, "Exposing Attention Glitches with Flip-Flop Language
Modeling", section 3; the CoPE paper's section 4.1 uses it too).

A sequence is ``size`` pairs of an instruction and a bit: ``w b`` writes the bit b, ``i b`` ignores it,
``r b`` reads: b is the last written bit. The first instruction is ``w`` and the last ``r``; in between each is
``i`` with probability ``p_ignore`` and ``w`` or ``r`` with the rest, half each (FFL(p_i)). The answers are the
bits after every ``r``. Training draws FFL(0.8); the out-of-distribution splits are the paper's: dense,
FFL(0.1), and sparse, FFL(0.98), at the training length, and FFL(0.8) at longer lengths.
"""

import random
from typing import Dict, List, Sequence

from posattn_tasks.tasks.base import Example, Sizes, Split, Task, length_splits, next_token_answers

WRITE, READ, IGNORE_INSTRUCTION, ZERO, ONE = range(5)
TRAINING_P_IGNORE = 0.8


class FlipFlop(Task):
    name = "flip-flop"
    citation = "Liu et al. 2023, arXiv 2306.00946, section 3 (FFL(p)); Golovneva et al. 2024, section 4.1"
    unit = "instruction-bit pairs"
    about = "output the last written bit at every read, ignoring the ignored bits"
    tiers = {"quick": Sizes(size=16, steps=60, batch_size=16), "cpu": Sizes(size=32, steps=400),
             "gpu": Sizes(size=256, steps=10000, batch_size=64, learning_rate=1e-3)}

    def vocabulary_size(self) -> int:
        return 5

    def answer_tokens(self) -> Sequence[int]:
        return (ZERO, ONE)

    def tokens_at(self, size: int) -> int:
        return 2 * size

    def example(self, rng: random.Random, size: int, p_ignore: float = TRAINING_P_IGNORE) -> Example:
        tokens: List[int] = []
        for pair in range(size):
            if pair == 0:
                instruction = WRITE
            elif pair == size - 1:
                instruction = READ
            elif rng.random() < p_ignore:
                instruction = IGNORE_INSTRUCTION
            else:
                instruction = WRITE if rng.random() < 0.5 else READ
            if instruction == READ:
                bit = last_written
            else:
                bit = rng.choice((ZERO, ONE))
                if instruction == WRITE:
                    last_written = bit
            tokens += [instruction, bit]
        reads = [i + 1 for i in range(0, len(tokens), 2) if tokens[i] == READ]
        return Example.of(tokens, next_token_answers(tokens, reads))

    def solve(self, tokens: Sequence[int]) -> Dict[int, int]:
        answers = {}
        for position in range(1, len(tokens), 2):
            if tokens[position - 1] == READ:
                writes = [tokens[j + 1] for j in range(0, position - 1, 2) if tokens[j] == WRITE]
                answers[position - 1] = writes[-1]
        return answers

    def splits(self) -> List[Split]:
        return length_splits() + [
            Split("dense", 1, {"p_ignore": 0.1}, "FFL(0.1): reads and writes in most pairs"),
            Split("sparse", 1, {"p_ignore": 0.98}, "FFL(0.98): long stretches of ignored bits")]
