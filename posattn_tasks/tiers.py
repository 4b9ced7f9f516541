"""The tiers: how large the models and the evaluation are. A task's own sizes per tier (training length,
steps, batch, learning rate) are declared in its file."""

from dataclasses import dataclass
from typing import Dict

from posattn_tasks.model import ModelSize


@dataclass(frozen=True)
class Tier:
    """A tier's model and how many test examples each split draws."""

    model: ModelSize
    test_examples: int
    about: str


TIERS: Dict[str, Tier] = {
    "quick": Tier(ModelSize(dim=32, layers=2, heads=2), 32, "a few methods on every task in about a minute (CI)"),
    "cpu": Tier(ModelSize(dim=64, layers=2, heads=4), 256, "every method on every task, a few core-hours"),
    "gpu": Tier(ModelSize(dim=256, layers=4, heads=8), 1000, "the papers' lengths and larger models, on a GPU"),
}
