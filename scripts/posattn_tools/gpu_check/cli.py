"""``scripts/gpu_check.py``'s options and ``main``: every step not skipped, in order, then the report."""

import argparse
import logging
import sys
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Callable, List, Optional, Sequence, Tuple

import posattn_tools.gpu_check
from posattn_tools.gpu_check.benchmark import benchmark_step, long_lm_step
from posattn_tools.gpu_check.context import Context, Row
from posattn_tools.gpu_check.corpora import failed_preparation
from posattn_tools.gpu_check.device_tests import pytest_step
from posattn_tools.gpu_check.machine import Machine, NoDevice, cpu_supports_bf16, detect_machine
from posattn_tools.gpu_check.report import reset_output, write_outputs
from posattn_tools.gpu_check.settings import (CUDA_ONLY_PRECISIONS, DDP_BACKENDS, FAMILIES_BY_NAME, PRECISION_FLAGS,
                                              SCALES, STEPS)
from posattn_tools.gpu_check.training import TrainResult, one_device_note, training_step
from posattn_tools.runs import REPO_ROOT, CommandError


def check(ctx: Context, log: Callable[[str], None]) -> Tuple[List[Row], List[TrainResult]]:
    """Every step not skipped: pytest alongside the trainings, then the benchmark alone (its timings
    need an idle device)."""
    rows: List[Row] = []
    results: List[TrainResult] = []
    with ThreadPoolExecutor(max_workers=ctx.jobs + 1) as pool:
        tests: Optional[Future] = None
        if "pytest" not in ctx.cli.skip:
            log("pytest on the device, in the background")
            tests = pool.submit(pytest_step, ctx)
        if "train" not in ctx.cli.skip:
            try:
                results = training_step(ctx, pool, log)
            except (CommandError, FileNotFoundError, ValueError) as error:
                rows += failed_preparation(ctx, error)
        if tests is not None:
            rows = tests.result() + rows
    rows += [result.row for result in results] + one_device_note(ctx)
    if "benchmark" not in ctx.cli.skip:
        log("benchmark")
        rows += benchmark_step(ctx)
    if "long" not in ctx.cli.skip:
        log("long language-model blocks")
        rows += long_lm_step(ctx)
    return rows, results


def parse_cli(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=posattn_tools.gpu_check.__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog="Steps: " + ", ".join(STEPS) + ". Families: " + ", ".join(FAMILIES_BY_NAME))
    add = parser.add_argument
    add("--device", choices=("cuda", "cpu"), default="cuda",
        help="cuda (default; stops with a clear message where there is none) or cpu, which needs --tiny")
    add("--tiny", action="store_true", help="every step at the smallest sizes: the smoke run (minutes on a CPU)")
    add("--quick", action="store_true",
        help="less on the GPU: --fp16 only, no slow tests, fewer benchmark variants, shorter trainings")
    add("--output", type=Path, default=REPO_ROOT / "gpu-check-output",
        help="folder of the report, the pictures and the logs (default: gpu-check-output/)")
    add("--skip", nargs="+", choices=STEPS, default=[], metavar="STEP",
        help="leave out steps: " + ", ".join(STEPS) + " (multi: the all-devices trainings)")
    add("--families", nargs="+", choices=list(FAMILIES_BY_NAME), default=list(FAMILIES_BY_NAME), metavar="NAME",
        help="model families to train (default: all): " + ", ".join(FAMILIES_BY_NAME))
    add("--precisions", nargs="+", choices=list(PRECISION_FLAGS), metavar="NAME",
        help="precisions of the one-device trainings (default: fp16 bf16 amp on a GPU, fp16 with --quick; "
        "on a CPU bf16 where it can, else fp32)")
    add("--ddp-backend", choices=DDP_BACKENDS, default=DDP_BACKENDS[0],
        help="fairseq's --ddp-backend of the all-devices trainings (default: %(default)s, fairseq's own)")
    add("--jobs", type=int, help="trainings at once (default: 6 on a GPU, 2 on a CPU)")
    add("--timeout", type=float, default=600, help="seconds any one command may run (default: %(default)s)")
    cli = parser.parse_args(argv)
    cli.argv = list(argv if argv is not None else sys.argv[1:])
    if cli.tiny and cli.quick:
        parser.error("--tiny and --quick: give one of them")
    if cli.device == "cpu" and not cli.tiny:
        parser.error("--device cpu runs only with --tiny (the smoke run at the smallest sizes); the full "
                     "check needs a GPU")
    if cli.device == "cpu" and cli.precisions and set(cli.precisions) & set(CUDA_ONLY_PRECISIONS):
        parser.error(f"--precisions {' '.join(CUDA_ONLY_PRECISIONS)} need CUDA (fairseq's loss scaler); on a "
                     "CPU use fp32 or bf16")
    if cli.jobs is not None and cli.jobs < 1:
        parser.error("--jobs must be >= 1")
    return cli


def make_context(cli: argparse.Namespace, machine: Machine) -> Context:
    scale = SCALES["tiny" if cli.tiny else "quick" if cli.quick else "full"]
    if cli.precisions:
        precisions = tuple(cli.precisions)
    elif machine.kind == "cuda":
        precisions = scale.cuda_precisions
    else:
        precisions = ("bf16",) if cpu_supports_bf16() else ("fp32",)
    jobs = cli.jobs or (6 if machine.kind == "cuda" else 2)
    return Context(cli, machine, scale, precisions, cli.output.resolve(), jobs)


def quiet_libraries() -> None:
    """Warnings and errors only from the libraries this process uses (the commands keep their own
    logs): importing fairseq sets the root logger to DEBUG, which makes matplotlib log every font."""
    import fairseq_posattn  # noqa: F401  (imports fairseq)

    logging.getLogger().setLevel(logging.WARNING)


def main(argv: Optional[Sequence[str]] = None) -> int:
    cli = parse_cli(argv)
    try:
        machine = detect_machine(cli.device)
    except NoDevice as error:
        print(error, file=sys.stderr)
        return 2
    quiet_libraries()
    ctx = make_context(cli, machine)
    reset_output(ctx.output)
    started = time.monotonic()

    def log(message: str) -> None:
        print(f"[gpu-check {time.monotonic() - started:5.0f} s] {message}", flush=True)

    log(f"{ctx.scale.name} check on {machine.describe()}; precisions {', '.join(ctx.precisions)}; "
        f"output {ctx.output}")
    rows, results = check(ctx, log)
    report = write_outputs(ctx, rows, results, time.monotonic() - started)
    print(report.read_text(encoding="utf-8"), end="")
    log(f"report: {report}")
    return 1 if any(row.result == "FAILED" for row in rows) else 0
