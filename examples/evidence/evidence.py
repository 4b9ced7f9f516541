#!/usr/bin/env python
"""Plan, run and resume the evidence runs; keep their status in a JSON manifest.

    python examples/evidence/evidence.py plan      # every run, its status and exact command
    python examples/evidence/evidence.py run       # run what is not finished, JOBS at a time
    python examples/evidence/evidence.py status    # counts and wall time per task
    python examples/evidence/evidence.py record    # record the finished runs (done by ``run`` too)
    python examples/evidence/evidence.py progress  # per training: epochs done, time per epoch, time left

Settings come from the environment (``evidence_plan.Settings.from_env``: TASKS, SEEDS, budgets, JOBS,
data folders). ``run`` records every finished run in ``examples/evidence/records/`` (:mod:`records`:
the small files the results page reads, committed with the code), skips every recorded run, resumes
the others (each recipe resumes its fairseq-train from checkpoint_last.pt and skips its finished
steps), writes ``EVIDENCE_OUT/manifest.json`` atomically after every change, and on SIGTERM or Ctrl-C
stops its recipes (SIGTERM to every process group of each one's session), marks them interrupted and exits with status
143 (130). Running the same command again carries on, on this machine or, from the records, on another
one. When every run has been tried it regenerates the results page of its records (docs/results.md, or results.md
inside ``EVIDENCE_RECORDS`` when that names another folder; ``--no-results`` to skip).

``progress`` reads the trainings' logs: per run the time per epoch as soon as it is known (first an estimate
from fairseq's updates per second over the first logged updates, then the measured epochs, validation
included) and what that makes for the run's epochs; ``--changed STATE`` prints only what changed since the
last call with the same STATE file, ``--collect DEST`` writes the plan's records and training logs so far
into two archives in DEST (``examples/evidence/run_lstm_authors_budget.sh`` polls it, so that a session cut
off still leaves them).
"""

import argparse
import contextlib
import dataclasses
import datetime
import fcntl
import json
import os
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path
from typing import IO, Dict, Iterator, List, Optional, Tuple

if __name__ == "__main__":  # run as a script: the tools' shared module, scripts/posattn_tools/runs.py, by name
    sys.path.insert(1, str(Path(__file__).resolve().parents[2] / "scripts"))

from evidence_plan import REPO, TASKS, PlanError, Run, Settings, build_plan, systems_of  # noqa: E402
from records import (attempt_logs, is_recorded, load_settings, next_attempt_log, read_record,  # noqa: E402
                     record_dir, save_settings, write_record)

from posattn_tools.json_files import read_json  # noqa: E402
from posattn_tools.runs import (BEGIN_EPOCH, DONE_TRAINING, END_EPOCH, STAMP, TRAIN_INNER, VALID_PPL,  # noqa: E402
                                read_log, signal_group, start, tool_env)

MANIFEST = "manifest.json"
#: what to do with a damaged manifest
REBUILT_MANIFEST = ("delete it: the next command rebuilds it from the records and the runs' folders (only the "
                    "attempts of runs not yet recorded are forgotten)")
POLL_SECONDS = 1.0
GRACE_SECONDS = 60.0  # after SIGTERM, how long a recipe may take to stop before SIGKILL
FINISHED, FAILED, INTERRUPTED, RUNNING, PENDING = "finished", "failed", "interrupted", "running", "pending"


def now() -> str:
    return datetime.datetime.now().isoformat(timespec="seconds")


def log(message: str) -> None:
    print(f"[{now()}] {message}", flush=True)


class Manifest:
    """``EVIDENCE_OUT/manifest.json``: the settings and, per run id, its status and attempts. A damaged one stops
    the command in one line: deleted, it is rebuilt from the records and the runs' folders."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.data: Dict[str, object] = {"runs": {}}
        if path.exists():
            self.data = read_json(path, REBUILT_MANIFEST)  # type: ignore[assignment]

    @property
    def runs(self) -> Dict[str, Dict[str, object]]:
        return self.data.setdefault("runs", {})  # type: ignore[return-value]

    def entry(self, run: Run) -> Dict[str, object]:
        entry = self.runs.setdefault(run.id, {"status": PENDING, "attempts": []})
        entry.update(task=run.task, system=run.system, seed=run.seed, group=run.group, out_dir=str(run.out_dir),
                     command=run.shell(), budget=run.budget)
        return entry

    def save(self, settings: Settings) -> None:
        from fairseq_posattn.atomic_io import atomic_write  # imports fairseq: only where a manifest is written

        self.data["settings"] = settings.to_json()
        self.data["updated"] = now()
        with atomic_write(str(self.path)) as out:
            json.dump(self.data, out, indent=1, sort_keys=True)
            out.write("\n")


@contextlib.contextmanager
def exclusive(out: Path) -> Iterator[None]:
    """One runner per output folder: a second one fails at once, naming the first one's process."""
    out.mkdir(parents=True, exist_ok=True)
    lock_path = out / ".runner.lock"
    with open(lock_path, "a+", encoding="utf-8") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.seek(0)
            raise SystemExit(f"evidence.py: another runner is working in {out} (process {lock.read().strip() or '?'}); "
                             "wait for it, or stop it with kill -TERM <that process>") from None
        lock.seek(0)
        lock.truncate()
        lock.write(str(os.getpid()))
        lock.flush()
        yield


def rotate_train_log(run: Run) -> None:
    """An unfinished training's log is overwritten when its recipe resumes it: keep it as
    ``<log>.attempt<N>`` so that the learning curve keeps the validations before the interruption. A
    training finished under another budget (its log lacks the plan's ``trained_under`` values) counts as
    unfinished: without its log the recipe trains again, from its ``checkpoint_last.pt``."""
    log_path = run.train_log
    if log_path is None or not log_path.exists():
        return
    budget = [text for path, text in run.done_when if path == log_path]
    text = read_log(log_path)
    if DONE_TRAINING in text and all(value in text for value in budget):
        return  # finished training: the recipe skips it and keeps its log
    log_path.rename(next_attempt_log(log_path))


def remove_final_artifacts(run: Run) -> None:
    """A trained run that starts is unfinished: its final artifacts (evaluations) on disk, if any, were made
    by an earlier budget or attempt, and would make it look finished if this attempt were cut before its
    recipe rewrites them. The recipes re-evaluate every time, so nothing is lost."""
    if run.train_log is None:
        return  # a preparation: its recipe skips the steps whose outputs exist
    for path, _ in run.done_when:
        if path != run.train_log:
            path.unlink(missing_ok=True)


def close_lost_attempt(run: Run, attempts: List[Dict[str, object]]) -> None:
    """The last attempt of a run whose runner was killed (SIGKILL, the machine's session ended) has a start
    and no end: it ended with the last write into the run's folder, which gives its wall time."""
    if not attempts or "end" in attempts[-1]:
        return
    start = datetime.datetime.fromisoformat(str(attempts[-1]["start"])).timestamp()
    end = max([start, *(path.stat().st_mtime for path in run.out_dir.rglob("*") if path.is_file())])
    attempts[-1].update(end=datetime.datetime.fromtimestamp(end).isoformat(timespec="seconds"),
                        seconds=round(end - start, 1), outcome=INTERRUPTED, end_from="the last write in its folder")


def process_start(pid: int) -> Optional[str]:
    """The start time of process ``pid`` (field 22 of /proc/PID/stat), None if there is no such process:
    with the pid it identifies a process even after the pid is reused."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as f:
            return f.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


class Runner:
    """Starts the plan's unfinished runs, ``jobs`` at a time, in plan order once their dependency is done."""

    def __init__(self, settings: Settings, runs: List[Run]) -> None:
        self.settings = settings
        self.runs = runs
        self.manifest = Manifest(settings.out / MANIFEST)
        self.running: Dict[str, subprocess.Popen] = {}
        self.log_files: Dict[str, IO[str]] = {}
        self.started: Dict[str, float] = {}
        self.stop_signal: Optional[int] = None

    # ------------------------------------------------------------------------------------ state
    def sync_with_disk(self) -> None:
        """Every run's status from its record and artifacts, whatever the manifest says: recorded = finished;
        finished on disk = recorded now and finished. A preparation other runs need counts as finished
        only while its output is on disk, or once every run that needs it is recorded."""
        needed = {r.depends_on for r in self.runs if r.depends_on and not is_recorded(r)}
        for run in self.runs:
            entry = self.manifest.entry(run)
            if run.finished():
                entry["status"] = FINISHED if is_recorded(run) or record(run, entry["attempts"]) else FAILED
            elif is_recorded(run) and run.id not in needed:
                entry["status"] = FINISHED
            elif entry["status"] == RUNNING:
                pgid = entry.get("pgid")
                if isinstance(pgid, int) and process_start(pgid) == entry.get("pgid_start"):
                    raise SystemExit(f"evidence.py: {run.id} is still being run by process group {pgid}, left by "
                                     f"a runner that was killed; stop it first: kill -TERM -- -{pgid}")
                entry["status"] = INTERRUPTED
                close_lost_attempt(run, entry["attempts"])  # type: ignore[arg-type]
            elif entry["status"] == FINISHED:
                entry["status"] = PENDING  # its artifacts are gone: run it again
        self.manifest.save(self.settings)

    def status(self, run: Run) -> str:
        return str(self.manifest.runs[run.id]["status"])

    # ------------------------------------------------------------------------------------ signals
    def _on_signal(self, signum: int, frame: object) -> None:
        self.stop_signal = signum  # only a flag: printing here could interrupt a print of the main loop

    # ------------------------------------------------------------------------------------ runs
    def start(self, run: Run) -> None:
        entry = self.manifest.runs[run.id]
        rotate_train_log(run)
        remove_final_artifacts(run)
        run.out_dir.mkdir(parents=True, exist_ok=True)
        attempt = len(entry["attempts"]) + 1  # type: ignore[arg-type]
        output = open(run.out_dir / "recipe.log", "a", encoding="utf-8")
        output.write(f"\n=== attempt {attempt}, {now()}\n{run.shell()}\n")
        output.flush()
        process = start(run.command(), output, tool_env(run.env), cwd=REPO, stdin=subprocess.DEVNULL)
        self.running[run.id], self.log_files[run.id], self.started[run.id] = process, output, time.time()
        entry.update(status=RUNNING, pgid=process.pid, pgid_start=process_start(process.pid))
        entry["attempts"].append({"start": now()})  # type: ignore[union-attr]
        self.manifest.save(self.settings)
        done = sum(self.status(r) == FINISHED for r in self.runs)
        log(f"start {run.id} (attempt {attempt}; {done} of {len(self.runs)} runs finished; "
            f"log: {run.out_dir / 'recipe.log'})")

    def finish(self, run: Run, returncode: int, interrupted: bool = False) -> None:
        entry = self.manifest.runs[run.id]
        seconds = time.time() - self.started.pop(run.id)
        self.log_files.pop(run.id).close()
        del self.running[run.id]
        complete = run.finished()  # its final artifacts: even if a later step (a summary table) failed or was stopped
        status = FINISHED if complete else INTERRUPTED if interrupted else FAILED
        attempts = entry["attempts"]
        attempts[-1].update(end=now(), seconds=round(seconds, 1), returncode=returncode,  # type: ignore[index]
                            outcome=status)
        if complete and not record(run, attempts):  # type: ignore[arg-type]
            status = attempts[-1]["outcome"] = FAILED  # type: ignore[index]
        entry["status"] = status
        entry.pop("pgid", None)
        entry.pop("pgid_start", None)
        self.manifest.save(self.settings)
        if complete and returncode != 0:
            log(f"{run.id}: the recipe exited with status {returncode} after writing its final artifacts")
        why = "" if complete or interrupted else (
            f" (exit status {returncode}; " if returncode else " (the recipe exited 0 but left no final artifact; ") \
            + f"see {run.out_dir / 'recipe.log'})"
        log(f"{status} {run.id} in {seconds:.0f} s{why}")

    def ready(self, run: Run, tried: set) -> bool:
        if run.id in tried or run.id in self.running or self.status(run) == FINISHED:
            return False
        return run.depends_on is None or self.status_of(run.depends_on) == FINISHED

    def status_of(self, run_id: str) -> str:
        return str(self.manifest.runs.get(run_id, {}).get("status", PENDING))

    def stop_all(self) -> None:
        for process in self.running.values():
            signal_group(process, signal.SIGTERM)
        deadline = time.time() + GRACE_SECONDS
        for run_id, process in list(self.running.items()):
            try:
                process.wait(max(0.1, deadline - time.time()))
            except subprocess.TimeoutExpired:
                signal_group(process, signal.SIGKILL)
                process.wait()
            run = next(r for r in self.runs if r.id == run_id)
            self.finish(run, process.returncode, interrupted=True)

    def loop(self) -> int:
        """Run until every run was tried once (or a signal came); the exit status."""
        tried: set = set()
        previous = {signum: signal.signal(signum, self._on_signal) for signum in (signal.SIGTERM, signal.SIGINT)}
        try:
            while self.stop_signal is None:
                for run in self.runs:
                    if len(self.running) >= self.settings.jobs or self.stop_signal is not None:
                        break
                    if self.ready(run, tried):
                        tried.add(run.id)
                        self.start(run)
                if not self.running:
                    break
                time.sleep(POLL_SECONDS)
                for run in [r for r in self.runs if r.id in self.running]:
                    returncode = self.running[run.id].poll()
                    if returncode is not None:
                        self.finish(run, returncode)
            if self.stop_signal is not None:
                log(f"{signal.Signals(self.stop_signal).name}: stopping the {len(self.running)} running recipe(s)")
                self.stop_all()
                return 128 + self.stop_signal
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)
        return self.summary()

    def summary(self) -> int:
        counts: Dict[str, int] = {}
        for run in self.runs:
            counts[self.status(run)] = counts.get(self.status(run), 0) + 1
        blocked = [r.id for r in self.runs if self.status(r) != FINISHED and r.depends_on
                   and self.status_of(r.depends_on) != FINISHED]
        log("runs: " + ", ".join(f"{n} {s}" for s, n in sorted(counts.items()))
            + (f" ({len(blocked)} waiting for a failed preparation)" if blocked else ""))
        return 0 if counts.get(FINISHED, 0) == len(self.runs) else 1


def record(run: Run, attempts: List[Dict[str, object]]) -> bool:
    """Record a run finished on disk; False (and why, in the log) if its outputs cannot be read."""
    try:
        log(f"recorded {run.id} in {write_record(run, attempts)}")
        return True
    except (OSError, ValueError) as error:
        log(f"{run.id}: finished, but its record could not be made: {error}")
        return False


def record_finished(settings: Settings, runs: List[Run]) -> int:
    """Record every run finished on disk and not recorded yet (a runner records the runs it finishes);
    the exit status: 1 if a record could not be made."""
    manifest = Manifest(settings.out / MANIFEST)
    made = [record(run, manifest.runs.get(run.id, {}).get("attempts", []))  # type: ignore[arg-type]
            for run in runs if run.finished() and not is_recorded(run)]
    return 0 if all(made) else 1


def print_plan(settings: Settings, runs: List[Run]) -> None:
    manifest = Manifest(settings.out / MANIFEST)
    for run in runs:
        status = FINISHED if is_recorded(run) else manifest.runs.get(run.id, {}).get("status", PENDING)
        print(f"{run.id}\t{status}\t{run.shell()}")


def print_status(settings: Settings, runs: List[Run]) -> None:
    manifest = Manifest(settings.out / MANIFEST)
    print("| task | runs | finished | failed | interrupted | wall time of the finished (h) |")
    print("|---|---:|---:|---:|---:|---:|")
    for task in settings.tasks:
        mine = [r for r in runs if r.task == task]
        entries = [manifest.runs.get(r.id, {}) for r in mine]
        records = [read_record(r) for r in mine]
        finished = [record for record in records if record is not None]
        failed = sum(e.get("status") == FAILED for e in entries)
        interrupted = sum(e.get("status") == INTERRUPTED for e in entries)
        hours = sum(float(record["seconds"]) for record in finished) / 3600  # type: ignore[arg-type]
        print(f"| {task} | {len(mine)} | {len(finished)} | {failed} | {interrupted} | {hours:.2f} |")


# ------------------------------------------------------------------------------------ progress
@dataclasses.dataclass
class Progress:
    """A training's progress, from its logs (every attempt's, oldest first)."""

    epochs_done: int = 0
    epoch_seconds: Dict[int, float] = dataclasses.field(default_factory=dict)  # per finished epoch, validation in
    updates_per_epoch: int = 0
    first_updates: int = 0  # the first logged updates of the first epoch ...
    first_ups: float = 0.0  # ... and fairseq's updates per second over them
    valid_ppl: Optional[float] = None  # of the last validation
    done: bool = False

    @property
    def seconds_per_epoch(self) -> Optional[float]:
        """The mean of the measured epochs, else the estimate from the first logged updates (training only)."""
        if self.epoch_seconds:
            return sum(self.epoch_seconds.values()) / len(self.epoch_seconds)
        if self.first_ups > 0 and self.updates_per_epoch:
            return self.updates_per_epoch / self.first_ups
        return None


def training_progress(run: Run) -> Optional[Progress]:
    """None before the run's training has logged anything."""
    logs = attempt_logs(run.train_log)
    if not logs:
        return None
    progress = Progress()
    for path in logs:
        begun: Dict[int, datetime.datetime] = {}
        with open(path, encoding="utf-8", errors="replace") as f:
            for line in f:
                line = line.rstrip("\n")
                stamp = STAMP.match(line)
                when = datetime.datetime.fromisoformat(stamp[1]) if stamp else None
                if DONE_TRAINING in line:
                    progress.done = True
                elif (match := BEGIN_EPOCH.search(line)) and when:
                    begun[int(match[1])] = when
                elif match := END_EPOCH.search(line):
                    epoch = int(match[1])
                    progress.epochs_done = max(progress.epochs_done, epoch)
                    if when and epoch in begun:
                        progress.epoch_seconds[epoch] = (when - begun[epoch]).total_seconds()
                elif match := VALID_PPL.search(line):
                    progress.valid_ppl = float(match[1])
                elif (match := TRAIN_INNER.search(line)) and not progress.first_updates:
                    progress.first_updates, progress.updates_per_epoch = int(match[2]), int(match[3])
                    progress.first_ups = float(match[4])
    return progress


def epochs_text(n: int) -> str:
    return f"{n} epoch{'s' * (n != 1)}"


def duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


def progress_stage(run: Run, progress: Optional[Progress]) -> Tuple[str, str]:
    """(stage, line): the line is reported again only when the stage changes: the first estimate, epochs 1,
    2, 3, every fifth, the last, the end of the training (some 15 lines for 40 epochs)."""
    if progress is None or (progress.seconds_per_epoch is None and not progress.done):
        return "", ""
    epochs = int(run.env.get("MAX_EPOCH") or 0)
    per_epoch = progress.seconds_per_epoch
    spent = sum(progress.epoch_seconds.values())
    total = f"{epochs} epochs" if epochs else "the run"
    ppl = f", valid ppl {progress.valid_ppl:g}" if progress.valid_ppl is not None else ""
    if progress.done:
        timing = f" in {duration(spent)} ({duration(per_epoch)} per epoch)" if progress.epoch_seconds else ""
        return "done", f"{run.id}: training done, {epochs_text(progress.epochs_done)}{timing}{ppl}"
    assert per_epoch is not None
    if not progress.epoch_seconds:
        line = (f"{run.id}: epoch 1, {progress.first_ups:g} updates/s over its first {progress.first_updates} of "
                f"{progress.updates_per_epoch} updates: about {duration(per_epoch)} per epoch (training only, "
                "validation not counted)")
        return "estimate", line + (f", about {duration(per_epoch * epochs)} for {total}" if epochs else "")
    done = progress.epochs_done
    stage = done if done <= 3 or done >= epochs else max(3, done - done % 5)
    line = f"{run.id}: {done} of {epochs or '?'} epochs in {duration(spent)}, {duration(per_epoch)} per epoch"
    if epochs:
        line += (f" (validation included): about {duration(per_epoch * epochs)} for {total}, "
                 f"{duration(per_epoch * max(0, epochs - done))} left")
    return f"epoch {stage}", line + ppl


def progress_summary(runs: List[Run], progresses: Dict[str, Optional[Progress]]) -> Tuple[str, str]:
    """The runs side by side: the slowest one's time in all (known once every run has an estimate)."""
    known = {r.id: p.seconds_per_epoch for r in runs for p in [progresses.get(r.id)] if p and p.seconds_per_epoch}
    finished = sum(bool(p and p.done) for p in progresses.values())
    stage = f"{len(known)} estimated, {finished} done"
    if len(known) < len(runs):
        return stage, f"{len(known)} of {len(runs)} trainings have a time per epoch so far"
    totals = {r.id: sum(p.epoch_seconds.values()) if p.done else known[r.id] * int(r.env.get("MAX_EPOCH") or 0)
              for r in runs for p in [progresses[r.id]] if p is not None}
    slowest = max(totals, key=totals.get)  # type: ignore[arg-type]
    together = f"all {len(runs)} trainings side by side" if len(runs) > 1 else "the training"
    return stage, (f"{together}: about {duration(totals[slowest])} in all (the slowest, {slowest}); "
                   f"{finished} of {len(runs)} done")


RECORDS_ARCHIVE, LOGS_ARCHIVE = "records.tar.gz", "logs.tar.gz"


def collect(runs: List[Run], dest: Path) -> None:
    """Two archives in ``dest`` (few files, no deep folders: what a GPU machine's $OUT sends back), each
    replaced at once (complete or absent): ``records.tar.gz``, the records of the runs recorded so far, as
    ``<run id>/<file>`` (``tar -xzf records.tar.gz -C examples/evidence/records`` adds them to the records),
    and ``logs.tar.gz``, their trainings' logs so far (every attempt's), evaluations and ``recipe.log``, as
    ``<run id>/<file>``, for a run cut off before its end."""
    dest.mkdir(parents=True, exist_ok=True)
    members: Dict[str, List[Tuple[Path, str]]] = {RECORDS_ARCHIVE: [], LOGS_ARCHIVE: []}
    for run in runs:
        if is_recorded(run):
            members[RECORDS_ARCHIVE] += [(path, f"{run.id}/{path.name}") for path in sorted(record_dir(run).iterdir())
                                         if path.is_file()]
        logs = attempt_logs(run.train_log) + sorted(run.out_dir.glob("logs/eval.*.log")) + [run.out_dir / "recipe.log"]
        members[LOGS_ARCHIVE] += [(path, f"{run.id}/{path.name}") for path in logs if path.is_file()]
    for name, files in members.items():
        temporary = dest / f".{name}.tmp-{os.getpid()}"
        with tarfile.open(temporary, "w:gz") as archive:
            for path, arcname in files:
                archive.add(path, arcname=arcname)
        os.replace(temporary, dest / name)


def print_progress(runs: List[Run], state_path: Optional[Path], dest: Optional[Path]) -> None:
    """Every training's line (with ``state_path``: only the lines whose stage changed since the last call)."""
    trainings = [r for r in runs if r.train_log is not None]
    state: Dict[str, str] = {}
    if state_path is not None and state_path.exists():
        with contextlib.suppress(ValueError):  # empty (new) or cut short: everything is new
            with open(state_path, encoding="utf-8") as f:
                state = json.load(f)
    progresses = {r.id: training_progress(r) for r in trainings}
    reports = {r.id: progress_stage(r, progresses[r.id]) for r in trainings}
    reports[""] = progress_summary(trainings, progresses)
    for key, (stage, line) in reports.items():
        if not line:
            continue
        if state_path is None:
            print(line)
        elif state.get(key) != stage:
            log(line)
            state[key] = stage
    if state_path is not None:
        state_path.write_text(json.dumps(state, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    if dest is not None:
        collect(runs, dest)


# ------------------------------------------------------------------------------------ settings
def with_recorded_systems(settings: Settings) -> Settings:
    """``settings`` with the systems of the records' settings added, per task (in :data:`SYSTEMS` order): a
    runner of a part of the plan (``TASKS=lm LM_SYSTEMS=...``, as run_lstm_authors_budget.sh) adds its
    systems to the settings the results page plans from and removes none."""
    recorded = load_settings(settings).systems
    return dataclasses.replace(settings, systems={
        task: [s for s in systems_of(task) if s in settings.chosen_systems(task) or s in recorded.get(task, [])]
        for task in TASKS})


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("action", choices=["plan", "run", "status", "record", "progress"])
    parser.add_argument("--tasks", help="overrides TASKS, e.g. 'tagging classification'")
    parser.add_argument("--jobs", type=int, help="overrides JOBS: runs at once")
    parser.add_argument("--no-results", action="store_true", help="run: do not regenerate the results page at the end")
    parser.add_argument("--changed", metavar="STATE", type=Path,
                        help="progress: print only what changed since the last call with this state file")
    parser.add_argument("--collect", metavar="DEST", type=Path,
                        help="progress: also write the runs' records and training logs so far to "
                        f"DEST/{RECORDS_ARCHIVE} and DEST/{LOGS_ARCHIVE}")
    return parser


def main(argv: Optional[List[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    env = dict(os.environ)
    if args.tasks:
        env["TASKS"] = args.tasks
    if args.jobs:
        env["JOBS"] = str(args.jobs)
    try:
        settings = Settings.from_env(env)
    except PlanError as error:
        print(f"evidence.py: {error}", file=sys.stderr)
        return 2
    runs = build_plan(settings)
    if args.action == "plan":
        print_plan(settings, runs)
        return 0
    if args.action == "status":
        print_status(settings, runs)
        return 0
    if args.action == "record":
        return record_finished(settings, runs)
    if args.action == "progress":
        print_progress(runs, args.changed, args.collect)
        return 0
    with exclusive(settings.out):
        save_settings(with_recorded_systems(settings))
        runner = Runner(settings, runs)
        runner.sync_with_disk()
        todo = [r for r in runs if runner.status(r) != FINISHED]
        log(f"{len(runs)} runs planned in {settings.out} ({', '.join(settings.tasks)}), {len(runs) - len(todo)} "
            f"finished already; {settings.jobs} at a time")
        status = runner.loop()
    if status < 128 and not args.no_results:
        results = [sys.executable, str(Path(__file__).with_name("results.py")), "--evidence-out", str(settings.out)]
        log("regenerating the results page: " + " ".join(results[1:]))
        subprocess.run(results, cwd=REPO, check=False)
    return status


if __name__ == "__main__":
    sys.exit(main())
