"""Multi-query associative recall, MQAR (Arora et al. 2023, "Zoology", section 3.1).

``size`` key-value pairs (distinct keys), then every key again in a random order, each followed by its value:
the values of the second half are the answers. The keys and values have vocabularies of their own, large
enough for the longest split (8 times the training number of pairs), so that every key and value a test uses
is seen in training.
"""

import random
from typing import Dict, Sequence

from posattn_tasks.tasks.base import Example, Sizes, Task, next_token_answers

SEPARATOR = 0
KEYS = 64
FIRST_KEY = 1
VALUES = 64


class AssociativeRecall(Task):
    name = "associative-recall"
    citation = "Arora et al. 2023, arXiv 2312.04927, section 3.1 (MQAR)"
    unit = "key-value pairs"
    about = "after the pairs, answer each key asked again with its value"
    tiers = {"quick": Sizes(size=4, steps=60, batch_size=16), "cpu": Sizes(size=8, steps=700, batch_size=64),
             "gpu": Sizes(size=32, steps=10000, batch_size=64, learning_rate=1e-3)}

    def first_value(self) -> int:
        return FIRST_KEY + KEYS

    def vocabulary_size(self) -> int:
        return self.first_value() + VALUES

    def answer_tokens(self) -> Sequence[int]:
        return range(self.first_value(), self.first_value() + VALUES)

    def tokens_at(self, size: int) -> int:
        return 4 * size + 1

    def example(self, rng: random.Random, size: int) -> Example:
        if size > KEYS:
            raise ValueError(f"associative recall draws at most {KEYS} distinct keys, asked for {size}")
        keys = rng.sample(range(FIRST_KEY, FIRST_KEY + KEYS), size)
        values = {key: rng.randrange(self.first_value(), self.first_value() + VALUES) for key in keys}
        tokens = [token for key in keys for token in (key, values[key])] + [SEPARATOR]
        for key in rng.sample(keys, size):
            tokens += [key, values[key]]
        return Example.of(tokens, next_token_answers(tokens, range(2 * size + 2, len(tokens), 2)))

    def solve(self, tokens: Sequence[int]) -> Dict[int, int]:
        separator = tokens.index(SEPARATOR)
        stored = dict(zip(tokens[0:separator:2], tokens[1:separator:2]))
        return {position: stored[tokens[position]] for position in range(separator + 1, len(tokens), 2)}
