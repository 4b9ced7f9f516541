"""The evidence runs' records: what each finished run measured, kept in git beside the code.

A recipe writes its checkpoints, binarized data and full outputs under ``EVIDENCE_OUT`` (not in git: a
fresh clone or another machine has none of it). When a run finishes, the runner copies what the
results page reads into ``examples/evidence/records/<run id>/``, small plain-text files that are
committed, so that the evidence accumulates across machines and sessions:

- ``run.json``: the run's id, exact command, budget, the wall time of every attempt, when it was
  recorded and the commit it ran;
- ``train.log``: its fairseq-train log (the logs of interrupted attempts first, in order);
- what the task is scored on: fairseq-eval-lm / fairseq-validate logs; the detokenized translations
  of the validation and test sets (sacreBLEU's input, for BLEU and the paired bootstrap); the
  predicted dev tags, one sentence per line (for the tagging bootstrap); the references of Multi30k
  (the preparation run's record).

A run counts as finished, for the runner and for the page, when its record exists with the budget the
plan gives it now; a record made under another budget is ignored and the run is done again. Delete a
record to run it again. ``EVIDENCE_RECORDS`` moves the folder (the tests use their own).
"""

import datetime
import json
import os
import re
import shutil
import sys
from pathlib import Path
from typing import Dict, Iterable, List, Mapping, Optional

from evidence_plan import REPO, Run, Settings

from posattn_tools.json_files import read_json
from posattn_tools.runs import capture, read_log

RUN_FILE = "run.json"
TRAIN_LOG = "train.log"
SETTINGS_FILE = "settings.json"


REPOSITORY_RECORDS = REPO / "examples" / "evidence" / "records"
REPOSITORY_PAGE = REPO / "docs" / "results.md"


def records_root(env: Mapping[str, str] = os.environ) -> Path:
    return Path(env.get("EVIDENCE_RECORDS") or REPOSITORY_RECORDS).resolve()


def default_page(env: Mapping[str, str] = os.environ) -> Path:
    """docs/results.md for the repository's records; ``results.md`` inside any other records folder, so that
    runs recorded elsewhere (``EVIDENCE_RECORDS``: a smoke run, a test) never overwrite the repository's page
    and its pictures."""
    root = records_root(env)
    return REPOSITORY_PAGE if root == REPOSITORY_RECORDS.resolve() else root / "results.md"


def record_dir(run: Run, root: Optional[Path] = None) -> Path:
    return (root or records_root()) / run.id


def record_remedy(folder: Path) -> str:
    """What to do with a damaged file of the record ``folder``."""
    return f"restore it from git (git checkout -- {folder}), or delete the record {folder} to run it again"


def read_record(run: Run, root: Optional[Path] = None) -> Optional[Dict[str, object]]:
    """The run's ``run.json`` if its record exists and was made under the run's present budget; a damaged one
    stops the command in one line (:class:`posattn_tools.json_files.DamagedFile`)."""
    folder = record_dir(run, root)
    if not (folder / RUN_FILE).is_file():
        return None
    record = read_json(folder / RUN_FILE, record_remedy(folder))
    return record if record.get("budget") == run.budget else None  # type: ignore[union-attr]


def is_recorded(run: Run, root: Optional[Path] = None) -> bool:
    return read_record(run, root) is not None


def without_machine_paths(line: str) -> str:
    """A log line with this machine's paths made relative: the repository's to it, the shared data folder
    beside it to ``../shared``, the Python environment (where it lies outside the repository, e.g. a
    worktree run with another clone's ``.venv``, or with a link to it) to ``<python-env>``, the home folder to ``~``.

    Only these: other paths (``/tmp/plasma`` in fairseq's logged configuration, pytest's temporary folders)
    stay as they are, wherever the clone lies. A path is rewritten only where it starts (after a space, quote,
    ``=`` or the like), not where it merely ends another path.
    """
    environment = Path(sys.prefix)  # and where it really lies: a linked .venv logs its target in its commands'
    rules = {REPO: "", REPO.parent / "shared": "../shared/", environment: "<python-env>/",
             environment.resolve(): "<python-env>/", Path.home(): "~/"}  # in this order, each path once
    for path, shown in rules.items():
        line = re.sub(rf"(?<![\w./~-]){re.escape(str(path))}/", lambda _: shown, line)
    return line


ATTEMPT_SUFFIX = ".attempt"


def attempt_log(log: Path, number: int) -> Path:
    """``<log>.attempt<number>``: where the runner keeps the log of an interrupted training's attempt
    ``number`` before its recipe resumes it (and overwrites ``<log>``)."""
    return log.with_name(f"{log.name}{ATTEMPT_SUFFIX}{number}")


def attempt_number(path: Path) -> int:
    """N of ``<log>.attemptN``."""
    return int(path.suffix[len(ATTEMPT_SUFFIX):])


def attempt_logs(log: Optional[Path]) -> List[Path]:
    """The logs of a run's training, oldest first: ``<log>.attempt1``, ``.attempt2``, ..., ``<log>``."""
    if log is None:
        return []
    attempts = sorted(log.parent.glob(log.name + ATTEMPT_SUFFIX + "*"), key=attempt_number)
    return attempts + ([log] if log.exists() else [])


def next_attempt_log(log: Path) -> Path:
    """The name for the current ``<log>`` of an interrupted training: one past the highest kept attempt,
    so that no kept attempt is ever overwritten."""
    kept = [path for path in attempt_logs(log) if path != log]
    return attempt_log(log, attempt_number(kept[-1]) + 1 if kept else 1)


def train_log_lines(run: Run) -> List[str]:
    """The training log of every attempt, oldest first."""
    lines: List[str] = []
    for path in attempt_logs(run.train_log):
        lines += read_log(path).splitlines()
    return lines


def current_commit() -> str:
    try:
        completed = capture(["git", "rev-parse", "--short", "HEAD"], cwd=REPO)
    except OSError:
        return ""
    return completed.stdout.strip() if completed.returncode == 0 else ""


def write_record(run: Run, attempts: Iterable[Mapping[str, object]], root: Optional[Path] = None) -> Path:
    """Record a finished run (replacing an older record of it) and return its folder. The files are written
    into a temporary folder beside it and moved in place at once: a record is complete or absent."""
    final = record_dir(run, root)
    final.parent.mkdir(parents=True, exist_ok=True)
    temporary = final.with_name(f".{final.name}.tmp-{os.getpid()}")
    shutil.rmtree(temporary, ignore_errors=True)
    temporary.mkdir()
    try:
        files = {k.name: k.lines() for k in run.kept}
        if run.train_log is not None:
            files[TRAIN_LOG] = train_log_lines(run)
        for name, lines in files.items():
            (temporary / name).write_text("".join(without_machine_paths(line) + "\n" for line in lines),
                                          encoding="utf-8")
        attempts = [dict(a) for a in attempts]
        meta = {"id": run.id, "task": run.task, "system": run.system, "seed": run.seed, "group": run.group,
                "command": without_machine_paths(run.shell()), "budget": run.budget, "attempts": attempts,
                "seconds": round(sum(float(a.get("seconds", 0.0)) for a in attempts), 1),
                "recorded": datetime.datetime.now().isoformat(timespec="seconds"), "commit": current_commit()}
        (temporary / RUN_FILE).write_text(json.dumps(meta, indent=1, sort_keys=True) + "\n", encoding="utf-8")
        old = final.with_name(f".{final.name}.old-{os.getpid()}")
        if final.exists():
            final.rename(old)
        temporary.rename(final)
        shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(temporary, ignore_errors=True)
        raise
    return final


def save_settings(settings: Settings, root: Optional[Path] = None) -> None:
    """The plan's settings beside the records, without this machine's paths: the page plans from them."""
    from fairseq_posattn.atomic_io import atomic_write  # imports fairseq: only where settings are written

    values = {k: v for k, v in settings.to_json().items() if k not in ("out", "data", "tasks")}
    root = root or records_root()
    root.mkdir(parents=True, exist_ok=True)
    with atomic_write(str(root / SETTINGS_FILE)) as out:
        json.dump(values, out, indent=1, sort_keys=True)
        out.write("\n")


def load_settings(base: Settings, root: Optional[Path] = None) -> Settings:
    """``base`` (the environment's settings) with the seeds, systems and budgets the records were made under (per
    task: a task without recorded settings keeps the base's)."""
    path = (root or records_root()) / SETTINGS_FILE
    if not path.exists():
        return base
    saved = read_json(path, f"restore it from git (git checkout -- {path}), or delete it: the next runner writes "
                            "it from the environment's settings")
    values = base.to_json()
    for name in ("seeds", "systems"):  # per task: a task added since the records were made keeps the base's
        saved[name] = {**values[name], **saved.get(name, {})}  # type: ignore[dict-item]
    return Settings.from_json({**values, **saved, "out": str(base.out)})
