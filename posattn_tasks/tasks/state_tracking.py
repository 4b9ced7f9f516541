"""State tracking: the word problem of a permutation group (Merrill, Petty and Sabharwal 2024, "The Illusion of
State in State-Space Models", section 4; the data of their jopetty/word-problem code).

A sequence of ``size`` group elements; at every position the answer is the product of the elements so far (a
token per element of the group), read after that position's element: the model tracks a state through every
move. The group is S3 (the permutations of three objects: the smallest group that does not commute) at the
CPU tiers and A5 (the smallest unsolvable one, the paper's hard case) on a GPU. Elements are numbered in the
lexicographic order of their permutations.
"""

import itertools
import random
from typing import Dict, List, Sequence, Tuple

from posattn_tasks.tasks.base import Example, Sizes, Task

Permutation = Tuple[int, ...]


def parity(permutation: Permutation) -> int:
    return sum(a > b for a, b in itertools.combinations(permutation, 2)) % 2


def group_elements(group: str) -> List[Permutation]:
    """The elements of ``group`` (``S3``, ``S5``, ``A5``), lexicographically."""
    degree, even_only = int(group[1:]), group[0] == "A"
    return [p for p in itertools.permutations(range(degree)) if not even_only or parity(p) == 0]


def compose(first: Permutation, then: Permutation) -> Permutation:
    """The permutation that applies ``first``, then ``then``."""
    return tuple(then[first[i]] for i in range(len(first)))


class StateTracking(Task):
    name = "state-tracking"
    citation = "Merrill, Petty and Sabharwal 2024, arXiv 2404.08819, section 4"
    unit = "moves"
    about = "after every move, name the product of the group elements so far"
    tiers = {"quick": Sizes(size=4, steps=60, batch_size=16), "cpu": Sizes(size=4, steps=1500, batch_size=64),
             "gpu": Sizes(size=16, steps=20000, batch_size=64, learning_rate=1e-3)}

    #: the group at each tier
    groups = {"quick": "S3", "cpu": "S3", "gpu": "A5"}

    def __init__(self, tier: str = "cpu"):
        self.group = self.groups[tier]
        self.elements = group_elements(self.group)

    def settings(self) -> Dict[str, object]:
        return {"group": self.group}

    def vocabulary_size(self) -> int:
        return len(self.elements)

    def answer_tokens(self) -> Sequence[int]:
        return range(len(self.elements))

    def tokens_at(self, size: int) -> int:
        return size

    def example(self, rng: random.Random, size: int) -> Example:
        moves = [rng.randrange(len(self.elements)) for _ in range(size)]
        state, answers = self.elements.index(tuple(range(len(self.elements[0])))), {}
        for position, move in enumerate(moves):
            state = self.elements.index(compose(self.elements[state], self.elements[move]))
            answers[position] = state
        return Example.of(moves, answers)

    def solve(self, tokens: Sequence[int]) -> Dict[int, int]:
        answers = {}
        for position in range(len(tokens)):
            arrangement = list(range(len(self.elements[0])))
            for move in tokens[: position + 1]:
                arrangement = [self.elements[move][slot] for slot in arrangement]
            answers[position] = self.elements.index(tuple(arrangement))
        return answers
