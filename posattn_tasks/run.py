"""Running the grid: every (task, method, seed) of a tier not yet recorded, one run per worker process (each with
its own threads), a record written as each finishes."""

import concurrent.futures
import dataclasses
import datetime
import multiprocessing
import platform
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

import torch
from torch import nn

import posattn
from posattn_tasks import methods as suite_methods
from posattn_tasks.model import TaskDecoder
from posattn_tasks.progress import Progress
from posattn_tasks.records import RunKey, finished, write_record
from posattn_tasks.tasks import build_task
from posattn_tasks.tasks.base import Sizes, Task
from posattn_tasks.tiers import TIERS
from posattn_tasks.training import train

#: the suite's version of what a run computes: a change of the task generators, the model or the loop that
#: changes numbers changes it, so that older records are refused rather than mixed in
SUITE_VERSION = 1
MODELS = ("posattn", "llama")


@dataclass(frozen=True)
class Grid:
    """What a command runs: every task x method x seed of a tier, with one model."""

    tier: str
    tasks: Sequence[str]
    methods: Sequence[str]
    seeds: Sequence[int]
    model: str = "posattn"
    device: str = "cpu"
    threads: int = 1
    corpus: Optional[Path] = None

    def keys(self) -> List[RunKey]:
        return [RunKey(self.tier, self.model, task, method, seed)
                for task in self.tasks for method in self.methods for seed in self.seeds]


def longest_tokens(task: Task, size: int) -> int:
    return max(task.tokens_at(size * split.multiple) for split in task.splits())


def run_settings(task: Task, tier: str, model: str) -> Dict[str, Any]:
    """What a record must agree on: the suite's version, the task's sizes at the tier, the model, the test."""
    return {"suite_version": SUITE_VERSION, "sizes": dataclasses.asdict(task.tiers[tier]), "model": model,
            "model_size": dataclasses.asdict(TIERS[tier].model), "test_examples": TIERS[tier].test_examples,
            "task": task.settings()}


def build_model(model: str, task: Task, sizes: Sizes, tier: str, method: str) -> nn.Module:
    """The tier's model for ``method``, sized for the task's training and longest test lengths."""
    options = suite_methods.side_options(method, task.tokens_at(sizes.size), longest_tokens(task, sizes.size))
    if model == "llama":
        from posattn_tasks.model_huggingface import build_llama

        return build_llama(task.vocabulary_size(), TIERS[tier].model, method, options)
    return TaskDecoder(task.vocabulary_size(), TIERS[tier].model, options,
                       sinusoidal=method == suite_methods.ABSOLUTE)


def execute(key: RunKey, root: Path, device: str, threads: int, corpus: Optional[Path]) -> Dict[str, Any]:
    """Train and test one run, write its record; returns it."""
    torch.set_num_threads(threads)
    task = build_task(key.task, corpus, key.tier)
    sizes, start, start_cpu = task.tiers[key.tier], time.perf_counter(), time.process_time()
    torch.manual_seed(key.seed)
    model = build_model(key.model, task, sizes, key.tier, key.method).to(device)
    log = train(model, task, sizes, key.seed, torch.device(device))
    scores = task.evaluate(model, sizes.size, key.seed, TIERS[key.tier].test_examples, torch.device(device))
    record = {**dataclasses.asdict(key), "settings": run_settings(task, key.tier, key.model),
              "label": suite_methods.method_label(key.method),
              "parameters": sum(p.numel() for p in model.parameters()),
              "training": dataclasses.asdict(log),
              "scores": scores,
              "wall_seconds": round(time.perf_counter() - start, 2),
              "cpu_seconds": round(time.process_time() - start_cpu, 2),
              "machine": {"device": device, "threads": threads, "torch": torch.__version__,
                          "posattn": posattn.__version__, "processor": platform.processor() or platform.machine()},
              "recorded": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")}
    write_record(key, root, record)
    return record


def pending(grid: Grid, root: Path) -> List[RunKey]:
    """The grid's runs without a record; refuses (one line) records made with other settings."""
    tasks = {name: build_task(name, grid.corpus, grid.tier) for name in grid.tasks}
    for method in grid.methods:
        suite_methods.method_options(method)
    return [key for key in grid.keys()
            if not finished(key, root, run_settings(tasks[key.task], grid.tier, grid.model))]


def run_grid(grid: Grid, root: Path, jobs: int = 1) -> List[str]:
    """Run every pending run of ``grid``, ``jobs`` at a time; returns the one-line failures (a run that raised:
    no record written, the others go on). Interrupted (Ctrl-C, SIGTERM), it starts no further run, lets the
    running ones finish and write their records, and raises :class:`KeyboardInterrupt`."""
    todo = pending(grid, root)
    progress, failures = Progress(len(todo)), []
    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(max_workers=jobs, mp_context=context) as pool:
        futures = {pool.submit(execute, key, root, grid.device, grid.threads, grid.corpus): key for key in todo}
        try:
            for future in concurrent.futures.as_completed(futures):
                key = futures[future]
                what = f"{key.task} {key.method} seed {key.seed}"
                try:
                    record = future.result()
                    progress.advance(f"{what}: {record['wall_seconds']:.0f} s")
                except Exception as error:  # a failed run is named and skipped; its record is not written
                    failures.append(f"{what}: {type(error).__name__}: {error}")
                    progress.advance(f"{what}: FAILED")
        except KeyboardInterrupt:
            pool.shutdown(wait=True, cancel_futures=True)
            raise
        finally:
            progress.close()
    return failures
