"""Length generalisation of algorithmic tasks (Kazemnejad et al. 2023, "The Impact of Positional Encoding on
Length Generalization in Transformers", section 3: copy, reverse, addition).

An input of n items, a separator, then the output and an end token, all of them answers. Training draws n
uniformly from 1 to ``size``; the split at m times the training size (m > 1) draws n from above m/2 times to m
times ``size``, lengths never seen in training. Addition writes both n-digit operands and the n + 1-digit sum
least significant digit first (the order in which a left-to-right reader can carry; the paper's own formats
differ per task, see docs/comparison.md).
"""

import random
from typing import Dict, List, Sequence

from posattn_tasks.tasks.base import Example, Sizes, Split, Task, length_splits, next_token_answers

SEPARATOR, PLUS, END = 10, 11, 12


class Algorithmic(Task):
    """An input of n digits, a separator, the output of :meth:`output` and ``END``."""

    citation = "Kazemnejad et al. 2023, arXiv 2305.19466, section 3"
    unit = "input items"
    tiers = {"quick": Sizes(size=4, steps=60, batch_size=16), "cpu": Sizes(size=8, steps=800, batch_size=64),
             "gpu": Sizes(size=20, steps=20000, batch_size=64, learning_rate=1e-3)}

    def vocabulary_size(self) -> int:
        return END + 1

    def answer_tokens(self) -> Sequence[int]:
        return (*range(10), END)

    def items(self, size: int) -> int:
        return size

    def tokens_at(self, size: int) -> int:
        return 2 * self.items(size) + 4

    def draw_items(self, rng: random.Random, size: int, longer_than_half: bool) -> int:
        return rng.randint(size // 2 + 1 if longer_than_half else 1, size)

    def example(self, rng: random.Random, size: int, longer_than_half: bool = False) -> Example:
        prompt = self.prompt(rng, self.draw_items(rng, size, longer_than_half))
        tokens = prompt + [SEPARATOR] + self.output(prompt) + [END]
        return Example.of(tokens, next_token_answers(tokens, range(len(prompt) + 1, len(tokens))))

    def prompt(self, rng: random.Random, n: int) -> List[int]:
        return [rng.randrange(10) for _ in range(n)]

    def output(self, prompt: List[int]) -> List[int]:
        raise NotImplementedError

    def splits(self) -> List[Split]:
        return [Split(split.name, split.multiple, {"longer_than_half": split.multiple > 1}, split.about)
                for split in length_splits()]


class Copy(Algorithmic):
    name = "copy"
    about = "repeat the input after the separator"

    def output(self, prompt: List[int]) -> List[int]:
        return list(prompt)

    def solve(self, tokens: Sequence[int]) -> Dict[int, int]:
        separator = tokens.index(SEPARATOR)
        wanted = list(tokens[:separator]) + [END]
        return {separator + k: token for k, token in enumerate(wanted)}


class Reverse(Algorithmic):
    name = "reverse"
    about = "write the input backwards after the separator"

    def output(self, prompt: List[int]) -> List[int]:
        return prompt[::-1]

    def solve(self, tokens: Sequence[int]) -> Dict[int, int]:
        separator = tokens.index(SEPARATOR)
        wanted = [tokens[separator - 1 - k] for k in range(separator)] + [END]
        return {separator + k: token for k, token in enumerate(wanted)}


class Addition(Algorithmic):
    name = "addition"
    about = "add two numbers written least significant digit first"
    tiers = {**Algorithmic.tiers, "cpu": Sizes(size=4, steps=1500, batch_size=64)}

    def items(self, size: int) -> int:
        return 2 * size + 2

    def prompt(self, rng: random.Random, n: int) -> List[int]:
        return [rng.randrange(10) for _ in range(n)] + [PLUS] + [rng.randrange(10) for _ in range(n)]

    def output(self, prompt: List[int]) -> List[int]:
        n = len(prompt) // 2
        digits, carry = [], 0
        for a, b in zip(prompt[:n], prompt[n + 1 :]):
            carry, digit = divmod(a + b + carry, 10)
            digits.append(digit)
        return digits + [carry]

    def solve(self, tokens: Sequence[int]) -> Dict[int, int]:
        plus, separator = tokens.index(PLUS), tokens.index(SEPARATOR)

        def number(digits: Sequence[int]) -> int:
            return int("".join(str(d) for d in reversed(digits)))

        total = number(tokens[:plus]) + number(tokens[plus + 1 : separator])
        n = plus
        wanted = [int(d) for d in reversed(str(total).rjust(n + 1, "0"))] + [END]
        return {separator + k: token for k, token in enumerate(wanted)}
