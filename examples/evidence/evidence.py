#!/usr/bin/env python
"""Plan, run and resume the evidence runs; keep their status in a JSON manifest.

    python examples/evidence/evidence.py plan      # every run, its status and exact command
    python examples/evidence/evidence.py run       # run what is not finished, JOBS at a time
    python examples/evidence/evidence.py status    # counts and wall time per task
    python examples/evidence/evidence.py record    # record the finished runs (done by ``run`` too)

Settings come from the environment (``evidence_plan.Settings.from_env``: TASKS, SEEDS, budgets, JOBS,
data folders). ``run`` records every finished run in ``examples/evidence/records/`` (:mod:`records`:
the small files the results page reads, committed with the code), skips every recorded run, resumes
the others (each recipe resumes its fairseq-train from checkpoint_last.pt and skips its finished
steps), writes ``EVIDENCE_OUT/manifest.json`` atomically after every change, and on SIGTERM or Ctrl-C
stops its recipes (SIGTERM to each one's process group), marks them interrupted and exits with status
143 (130). Running the same command again carries on, on this machine or, from the records, on another
one. When every run has been tried it regenerates docs/results.md (``--no-results`` to skip).
"""

import argparse
import contextlib
import datetime
import fcntl
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import IO, Dict, Iterator, List, Optional

from evidence_plan import REPO, PlanError, Run, Settings, build_plan
from records import is_recorded, next_attempt_log, read_record, save_settings, write_record

MANIFEST = "manifest.json"
POLL_SECONDS = 1.0
GRACE_SECONDS = 60.0  # after SIGTERM, how long a recipe may take to stop before SIGKILL
FINISHED, FAILED, INTERRUPTED, RUNNING, PENDING = "finished", "failed", "interrupted", "running", "pending"


def now() -> str:
    return datetime.datetime.now().isoformat(timespec="seconds")


def log(message: str) -> None:
    print(f"[{now()}] {message}", flush=True)


class Manifest:
    """``EVIDENCE_OUT/manifest.json``: the settings and, per run id, its status and attempts."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.data: Dict[str, object] = {"runs": {}}
        if path.exists():
            with open(path, encoding="utf-8") as f:
                self.data = json.load(f)

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
    with open(log_path, encoding="utf-8", errors="replace") as f:
        text = f.read()
    if "done training" in text and all(value in text for value in budget):
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
        env = {**os.environ, **run.env}
        env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
        process = subprocess.Popen(run.command(), cwd=REPO, env=env, stdout=output, stderr=subprocess.STDOUT,
                                   stdin=subprocess.DEVNULL, start_new_session=True)
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
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)
        deadline = time.time() + GRACE_SECONDS
        for run_id, process in list(self.running.items()):
            try:
                process.wait(max(0.1, deadline - time.time()))
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("action", choices=["plan", "run", "status", "record"])
    parser.add_argument("--tasks", help="overrides TASKS, e.g. 'tagging classification'")
    parser.add_argument("--jobs", type=int, help="overrides JOBS: runs at once")
    parser.add_argument("--no-results", action="store_true", help="run: do not regenerate the results page at the end")
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
    with exclusive(settings.out):
        save_settings(settings)
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
