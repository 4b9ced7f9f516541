"""What a task of the comparison suite declares, and the examples it makes.

A task is a small generative language: :meth:`Task.example` draws one sequence of token ids of about a given
length from a seeded :class:`random.Random`, with its *answers*: the positions where the model's output is
scored (and trained), each with the token it must predict there, having read the tokens up to and including
that position. An answer that is the next token of the sequence (a copied item, the bit after a read) sits
at the position before it; an answer that is not in the sequence (the state after each move of a word
problem) sits at the position of the last token it depends on. :meth:`Task.solve` is the task's reference
solver: from an example's tokens it recomputes every answer from the tokens it may read, with code written
apart from the generator's, so that the tests can check that the two agree on every example of a large
sample.

Lengths are the task's own unit, the *size* (pairs of flip-flop, items to copy, ...): a split asks for
examples at a multiple of the training size, and the task turns it into tokens. Every split of a task is a
:class:`Split`: a name, the size multiple, and the generator's settings where they differ from training's
(flip-flop's dense and sparse instructions, for instance).
"""

import random
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Sequence, Tuple

#: the label of unscored positions in a batch's targets (``torch.nn.functional.cross_entropy``'s default)
IGNORE = -100


@dataclass(frozen=True)
class Example:
    """One sequence: its ``tokens`` and its ``answers``, position -> the token the model must output there having
    read ``tokens[: position + 1]``."""

    tokens: Tuple[int, ...]
    answers: Mapping[int, int]

    @classmethod
    def of(cls, tokens: Sequence[int], answers: Mapping[int, int]) -> "Example":
        return cls(tuple(tokens), dict(answers))


def next_token_answers(tokens: Sequence[int], indices: Sequence[int]) -> Dict[int, int]:
    """Answers that are tokens of the sequence: ``tokens[i]``, output at position ``i - 1``."""
    return {i - 1: tokens[i] for i in indices}


@dataclass(frozen=True)
class Split:
    """A test split: examples of ``multiple`` times the training size, drawn with ``settings`` (the generator's
    keyword arguments that differ from training's)."""

    name: str
    multiple: int = 1
    settings: Mapping[str, object] = field(default_factory=dict)
    #: what the split tests, for the report
    about: str = ""


@dataclass(frozen=True)
class Sizes:
    """A task's sizes at one tier: the training size (in the task's unit), training steps and batch size."""

    size: int
    steps: int
    batch_size: int = 32
    learning_rate: float = 3e-3


class Task:
    """Base class of the suite's tasks (one file each in :mod:`posattn_tasks.tasks`)."""

    #: the task's name on the command line and in records
    name: str = ""
    #: the paper the task follows, with its section
    citation: str = ""
    #: the task's unit of length, as the report states it ("pairs", "items", ...)
    unit: str = ""
    #: one line: what the model must do
    about: str = ""
    #: the sizes at each tier ("quick", "cpu", "gpu")
    tiers: Mapping[str, Sizes] = {}

    def vocabulary_size(self) -> int:
        raise NotImplementedError

    def answer_tokens(self) -> Sequence[int]:
        """The tokens an answer can be: predictions are the model's most likely of these."""
        raise NotImplementedError

    def example(self, rng: random.Random, size: int, **settings: object) -> Example:
        """One example of about ``size`` units, drawn from ``rng``."""
        raise NotImplementedError

    def solve(self, tokens: Sequence[int]) -> Dict[int, int]:
        """The reference solver: position -> the answer there, each computed from the tokens up to that position."""
        raise NotImplementedError

    def splits(self) -> List[Split]:
        """The test splits: by default the training distribution at 1, 2, 4 and 8 times the training size."""
        return length_splits()

    def tokens_at(self, size: int) -> int:
        """The longest sequence, in tokens, of an example of ``size`` units (the model's positions are sized
        from it)."""
        raise NotImplementedError

    def settings(self) -> Dict[str, object]:
        """What a record must agree on besides the tier's sizes (the data a task reads)."""
        return {}

    def evaluate(self, model: Any, size: int, seed: int, count: int, device: Any) -> Dict[str, Dict[str, Any]]:
        """The scores of a trained ``model`` on every split, ``count`` examples each (JSON-ready)."""
        from posattn_tasks.evaluation import evaluate_splits  # the scoring needs torch; the tasks do not

        return evaluate_splits(model, self, size, seed, count, device)


def length_splits(multiples: Sequence[int] = (1, 2, 4, 8)) -> List[Split]:
    """The training distribution at each multiple of the training size."""
    return [Split(f"{m}x", m, about="in distribution" if m == 1 else f"{m} times the training length")
            for m in multiples]


def examples(task: Task, seed: int, count: int, size: int, **settings: object) -> List[Example]:
    """``count`` examples of ``size`` drawn from the seed's own stream (the same for every method)."""
    rng = random.Random(seed)
    return [task.example(rng, size, **settings) for _ in range(count)]
