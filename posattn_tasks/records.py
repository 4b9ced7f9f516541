"""The suite's records: one JSON file per run (task, method, seed) under
``RECORDS/<tier>/<model>/<task>/<method>/seed<N>.json``.

A record is written whole or not at all (a temporary file in the same folder, renamed). It holds the run's
settings (the tier's sizes, the model's size, the evaluation's size, what the task reads): a run whose record
exists with the same settings is finished and is not run again; a record made with other settings stops the
command in one line (never mixed into a table, never overwritten), as does a damaged file.
"""

import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Iterator, List, Mapping, Optional

from posattn.errors import UserError


class RecordError(UserError, ValueError):
    """A record that cannot be used: damaged, or made with other settings."""


@dataclass(frozen=True)
class RunKey:
    """Which run a record belongs to."""

    tier: str
    model: str
    task: str
    method: str
    seed: int

    def path(self, root: Path) -> Path:
        return root / self.tier / self.model / self.task / self.method / f"seed{self.seed}.json"


def read_record(path: Path) -> Dict[str, Any]:
    """A record's contents; :class:`RecordError` naming the file if it is damaged."""
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise RecordError(f"{path} is cut short or damaged ({error}): restore it from git, or delete it to "
                          f"run that run again") from None
    if not isinstance(record, dict) or "settings" not in record or "scores" not in record:
        raise RecordError(f"{path} is not a record of posattn-tasks (no settings or scores): restore it from "
                          f"git, or delete it to run that run again")
    return record


def finished(key: RunKey, root: Path, settings: Mapping[str, Any]) -> bool:
    """True when ``key``'s record exists with ``settings``; :class:`RecordError` when it exists with others."""
    path = key.path(root)
    if not path.is_file():
        return False
    recorded = read_record(path)["settings"]
    if recorded != json.loads(json.dumps(settings)):
        differ = sorted(name for name in set(recorded) | set(settings)
                        if recorded.get(name) != json.loads(json.dumps(settings.get(name))))
        raise RecordError(f"{path} was made with other settings ({', '.join(differ)} differ): run with the "
                          f"settings it was made with, write to another --records folder, or delete the "
                          f"records of {root / key.tier / key.model} to run them again")
    return True


def write_record(key: RunKey, root: Path, record: Mapping[str, Any]) -> Path:
    """Write ``record`` as ``key``'s file, atomically."""
    path = key.path(root)
    path.parent.mkdir(parents=True, exist_ok=True)
    descriptor, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(descriptor, "w", encoding="utf-8") as f:
            json.dump(record, f, indent=1, sort_keys=True)
            f.write("\n")
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    return path


def all_records(root: Path, tier: Optional[str] = None) -> Iterator[Dict[str, Any]]:
    """Every record under ``root`` (of ``tier``), in path order."""
    base = root / tier if tier else root
    for path in sorted(base.rglob("seed*.json")):
        yield read_record(path)


def tiers_recorded(root: Path) -> List[str]:
    return sorted(p.name for p in root.iterdir() if p.is_dir()) if root.is_dir() else []
