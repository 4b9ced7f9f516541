"""The suite's tasks, one file each; :data:`TASKS` names them in the report's order."""

from pathlib import Path
from typing import Callable, Dict, List, Optional

from posattn.errors import UserError
from posattn_tasks.tasks.algorithmic import Addition, Copy, Reverse
from posattn_tasks.tasks.associative_recall import AssociativeRecall
from posattn_tasks.tasks.base import Task
from posattn_tasks.tasks.counting import Counting
from posattn_tasks.tasks.flip_flop import FlipFlop
from posattn_tasks.tasks.language_model import LanguageModelling, default_corpus
from posattn_tasks.tasks.passkey import Passkey
from posattn_tasks.tasks.selective_copy import SelectiveCopy
from posattn_tasks.tasks.state_tracking import StateTracking

#: the generated tasks, by name
GENERATED: Dict[str, Callable[[], Task]] = {task.name: task for task in (
    FlipFlop, SelectiveCopy, Counting, AssociativeRecall, Passkey, Copy, Reverse, Addition, StateTracking)}
TASKS: List[str] = [*GENERATED, LanguageModelling.name]


class UnknownTask(UserError, KeyError):
    """A task the suite does not have."""

    def __str__(self) -> str:
        return str(self.args[0])


def build_task(name: str, corpus: Optional[Path] = None, tier: str = "cpu") -> Task:
    """The task ``name`` at ``tier`` (state tracking's group); the language model reads ``corpus`` (default:
    :func:`default_corpus`)."""
    if name == LanguageModelling.name:
        return LanguageModelling(corpus or default_corpus())
    if name == StateTracking.name:
        return StateTracking(tier)
    if name not in GENERATED:
        raise UnknownTask(f"unknown task {name!r}; the tasks: {', '.join(TASKS)}")
    return GENERATED[name]()
