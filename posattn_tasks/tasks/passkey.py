"""Passkey retrieval (Mohtashami and Jaggi 2023, "Landmark Attention", section 4.2 and appendix).

A filler phrase repeated (the paper's "The grass is green. The sky is blue. ...": here a cycle of ``FILLER``
tokens, from a random point of the cycle), a passkey of ``DIGITS`` random digits after a marker at a depth of
the filler, and at the end a question marker after which the passkey's digits are the answers. ``size`` is the
whole length in tokens. Training draws the depth uniformly; the test splits cross lengths (1 to 8 times the
training length) with depths 0 (the passkey first), 1/4, 1/2, 3/4 and 1 (just before the question): the usual
heat map.
"""

import random
from typing import Dict, List, Optional, Sequence

from posattn_tasks.tasks.base import Example, Sizes, Split, Task, next_token_answers

FILLER = 8
KEY_MARKER, QUESTION_MARKER = FILLER, FILLER + 1
FIRST_DIGIT = FILLER + 2
DIGITS = 5
DEPTHS = (0.0, 0.25, 0.5, 0.75, 1.0)
MULTIPLES = (1, 2, 4, 8)


def split_name(multiple: int, depth: float) -> str:
    return f"{multiple}x-depth{round(100 * depth)}"


class Passkey(Task):
    name = "passkey"
    citation = "Mohtashami and Jaggi 2023, arXiv 2305.16300, section 4.2"
    unit = "tokens"
    about = "after the question marker, repeat the passkey hidden in the filler"
    tiers = {"quick": Sizes(size=32, steps=60, batch_size=16), "cpu": Sizes(size=64, steps=1200),
             "gpu": Sizes(size=512, steps=5000, batch_size=64, learning_rate=1e-3)}

    def vocabulary_size(self) -> int:
        return FIRST_DIGIT + 10

    def answer_tokens(self) -> Sequence[int]:
        return range(FIRST_DIGIT, FIRST_DIGIT + 10)

    def tokens_at(self, size: int) -> int:
        return size

    def example(self, rng: random.Random, size: int, depth: Optional[float] = None) -> Example:
        filler_length = size - 2 * (1 + DIGITS)
        if filler_length < 0:
            raise ValueError(f"a passkey example needs at least {2 * (1 + DIGITS)} tokens, asked for {size}")
        start = rng.randrange(FILLER)
        filler = [(start + i) % FILLER for i in range(filler_length)]
        where = round((rng.random() if depth is None else depth) * filler_length)
        key = [FIRST_DIGIT + rng.randrange(10) for _ in range(DIGITS)]
        tokens: List[int] = filler[:where] + [KEY_MARKER] + key + filler[where:] + [QUESTION_MARKER] + key
        return Example.of(tokens, next_token_answers(tokens, range(len(tokens) - DIGITS, len(tokens))))

    def solve(self, tokens: Sequence[int]) -> Dict[int, int]:
        marker, question = tokens.index(KEY_MARKER), tokens.index(QUESTION_MARKER)
        return {question + k: tokens[marker + 1 + k] for k in range(DIGITS)}

    def splits(self) -> List[Split]:
        return [Split(split_name(multiple, depth), multiple, {"depth": depth},
                      f"{multiple} times the training length, the passkey at depth {depth:g}")
                for multiple in MULTIPLES for depth in DEPTHS]
