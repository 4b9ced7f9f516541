"""Selective copy (Gu and Dao 2023, "Mamba", section 3.1; the CoPE paper's section 4.2 with its dense and sparse
splits).

A context of ``size`` data tokens scattered among blanks, a separator, then the data tokens again in their
order: every token after the separator is an answer. Training draws as many blanks as data tokens (the CoPE
paper's 128 blank / 128 non-blank at its size); its out-of-distribution splits are dense (half as many blanks)
and sparse (twice as many), at the training number of data tokens; the longer splits scale both.
"""

import random
from typing import Dict, List, Sequence

from posattn_tasks.tasks.base import Example, Sizes, Split, Task, length_splits, next_token_answers

BLANK, SEPARATOR = 0, 1
SYMBOLS = 8
FIRST_SYMBOL = 2


class SelectiveCopy(Task):
    name = "selective-copy"
    citation = "Gu and Dao 2023, arXiv 2312.00752, section 3.1; Golovneva et al. 2024, section 4.2"
    unit = "data tokens"
    about = "after the separator, copy the non-blank tokens of the context in order"
    tiers = {"quick": Sizes(size=4, steps=60, batch_size=16), "cpu": Sizes(size=8, steps=400, batch_size=64),
             "gpu": Sizes(size=64, steps=10000, batch_size=64, learning_rate=1e-3)}

    def vocabulary_size(self) -> int:
        return FIRST_SYMBOL + SYMBOLS

    def answer_tokens(self) -> Sequence[int]:
        return range(FIRST_SYMBOL, FIRST_SYMBOL + SYMBOLS)

    def tokens_at(self, size: int) -> int:
        return 2 * size + 2 * size + 1  # the sparse split's blanks

    def example(self, rng: random.Random, size: int, blanks_per_token: float = 1.0) -> Example:
        data = [rng.randrange(FIRST_SYMBOL, FIRST_SYMBOL + SYMBOLS) for _ in range(size)]
        blanks = round(blanks_per_token * size)
        slots = sorted(rng.sample(range(size + blanks), size))
        context: List[int] = [BLANK] * (size + blanks)
        for slot, token in zip(slots, data):
            context[slot] = token
        tokens = context + [SEPARATOR] + data
        return Example.of(tokens, next_token_answers(tokens, range(len(context) + 1, len(tokens))))

    def solve(self, tokens: Sequence[int]) -> Dict[int, int]:
        separator = tokens.index(SEPARATOR)
        kept = [token for token in tokens[:separator] if token != BLANK]
        return {separator + k: token for k, token in enumerate(kept)}

    def splits(self) -> List[Split]:
        return length_splits() + [
            Split("dense", 1, {"blanks_per_token": 0.5}, "half as many blanks as data tokens"),
            Split("sparse", 1, {"blanks_per_token": 2.0}, "twice as many blanks as data tokens")]
