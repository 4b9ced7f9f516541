#!/usr/bin/env python
"""The GPU check (``make gpu-check``): the project's training-at-scale paths on a CUDA machine, in one
report.

Steps, each a row group of the report's table (check, device, setting, result, numbers):

1. **pytest on the GPU**: the precision, activation-checkpointing, compile, LSTM-precision, mixed-
   precision CLI and distributed test files (``PYTEST_FILES``; a file missing from the checkout is
   reported as skipped) with ``pytest --device cuda``, one row per file.
2. **Short trainings**: ``fairseq-train`` of each model family (``FAMILIES``: fairseq's
   ``transformer``, direct positions + temperature + RPR, structural positions, DA-Transformer, the
   attention convolutions, the positional attentive LSTM LM) on the shipped samples
   (``data/multi30k_sample``, ``data/ptb_sample``) with ``--fp16``, ``--bf16`` and ``--amp`` on one
   GPU; then every family on all visible GPUs (NCCL, ``--ddp-backend pytorch_ddp``) when there is
   more than one. Each run is checked (the command succeeds, every validation loss is finite, the
   last one is below the first) and scored from its checkpoint in a fresh process: sacreBLEU with its
   signature (``fairseq-generate`` + ``posattn-score``'s scorer) or test perplexity
   (``fairseq-eval-lm``). The validation-loss curves (read by ``fairseq_posattn.inspect.
   learning_curves``) become one PNG per family.
3. **Benchmark**: ``scripts/posattn_benchmark --device cuda`` (train-step time and peak-memory ratios to
   vanilla fairseq, beam-search speed), one row per variant with its target.
4. **Long language-model blocks** (``long``): the same benchmark for ``transformer_lm_posattn`` against
   fairseq's ``transformer_lm`` at d = 512, 8 heads, 6 layers, blocks of 512 to 4,096 tokens (16,384
   tokens per batch), in bf16: where the kernel's paths (SDPA, flex_attention, explicit) matter most.

Everything goes to ``--output`` (default ``gpu-check-output/``): ``report.md``, ``loss-*.png``,
``results.json``, the benchmark's own report and every command's log under ``logs/``. The exit
status is 0 when no check FAILED (a benchmark ratio that misses its target is reported, not
failed), 1 otherwise, 2 when the device asked for is not there.

Without CUDA the check stops at once and says so. ``--device cpu --tiny`` runs every step at the
smallest sizes on the CPU (bf16 where the CPU can, else fp32; the all-devices step as two gloo
processes) so that the script itself is tested where no GPU is. ``--quick`` does less on the GPU:
``--fp16`` only, no slow tests, fewer benchmark variants.

Usage::

    python scripts/gpu_check.py                      # the full check, about 6-8 minutes on one H100
    python scripts/gpu_check.py --quick              # fp16 only, fewer tests and variants
    python scripts/gpu_check.py --device cpu --tiny  # the smoke run on a CPU (a few minutes)
    python scripts/gpu_check.py --families vanilla da --precisions bf16 --skip pytest benchmark
"""

import argparse
import contextlib
import json
import logging
import math
import os
import platform
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import xml.etree.ElementTree as ElementTree
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple

REPO_ROOT = Path(__file__).resolve().parent.parent
USER_DIR = REPO_ROOT / "fairseq_posattn"
MULTI30K = REPO_ROOT / "data" / "multi30k_sample"
PTB = REPO_ROOT / "data" / "ptb_sample"
BENCHMARK = REPO_ROOT / "scripts" / "posattn_benchmark"
#: the console tools of this interpreter's environment (the virtualenv's bin)
BIN = Path(sys.executable).parent
SRC, TGT = "en", "de"

#: the test files run on the device (relative to the repository); a missing one is reported as skipped
PYTEST_FILES = (
    "tests/test_training_at_scale.py",
    "tests/test_compile.py",
    "tests/test_lstm_lm_precision.py",
    "tests/test_mixed_precision_cli.py",
    "tests/test_distributed.py",
    "tests/test_attention_terms.py",
)
#: fairseq-train's flags for each precision; fp16 and amp need CUDA (fairseq's loss scaler)
PRECISION_FLAGS: Dict[str, Tuple[str, ...]] = {
    "fp32": (), "fp16": ("--fp16",), "bf16": ("--bf16",), "amp": ("--amp",),
}
CUDA_ONLY_PRECISIONS = ("fp16", "amp")
TRANSLATION, STRUCTURAL, LANGUAGE_MODELING = "translation", "translation_structural", "language_modeling"
#: the first and the last validation losses of a run must differ by at least this to count as falling
LOSS_TOLERANCE = 1e-3


@dataclass(frozen=True)
class Family:
    """A model family trained by the check: its fairseq task, architecture and position flags."""

    name: str
    label: str
    task: str
    arch: str
    flags: Tuple[str, ...] = ()

    @property
    def is_lm(self) -> bool:
        return self.task == LANGUAGE_MODELING


FAMILIES: Tuple[Family, ...] = (
    Family("vanilla", "Transformer (fairseq's own)", TRANSLATION, "transformer"),
    Family("positions", "SAN+P+R +Temp, RPR (Dufter et al.; Shaw et al.)", TRANSLATION, "transformer_posattn",
           ("--encoder-direct-position", "both", "--encoder-learnable-temperature",
            "--decoder-direct-position", "both", "--encoder-relative-positions", "16",
            "--decoder-relative-positions", "16")),
    Family("structural", "Structural PE (Wang et al.)", STRUCTURAL, "transformer_posattn",
           ("--encoder-structural-positions", "both", "--encoder-structural-fusion", "nonlinear")),
    Family("da", "DA-Transformer (Wu et al.)", TRANSLATION, "transformer_posattn",
           ("--encoder-distance-aware", "--decoder-distance-aware")),
    Family("conv", "+Conv / +Conv2d (Dufter et al.)", TRANSLATION, "transformer_posattn",
           ("--encoder-conv-attention", "1d", "--decoder-conv-attention", "2d")),
    Family("poslstm", "Positional attentive LSTM LM (Dagan)", LANGUAGE_MODELING, "positional_attentive_lstm_lm"),
)
FAMILIES_BY_NAME = {family.name: family for family in FAMILIES}


@dataclass(frozen=True)
class Scale:
    """Sizes and budgets of one mode (full, quick, tiny)."""

    name: str
    #: first lines of every Multi30k and PTB split; None: all (3,000 / 300 / 300 pairs, 2,000 / 200 / 200 lines)
    lines: Optional[int]
    bpe_merges: int
    layers: int
    embed_dim: int
    ffn_dim: int
    heads: int
    lstm_dim: int
    max_tokens: int
    lm_batch_size: int
    max_update: int
    validate_every: int
    lr: float
    warmup: int
    #: the GPU's precisions (the CPU's: bf16 where it can, else fp32)
    cuda_precisions: Tuple[str, ...]
    pytest_args: Tuple[str, ...]
    benchmark_args: Tuple[str, ...]
    long_lm_args: Tuple[str, ...]


#: the first variant of every registered method (the benchmark derives the set), SAN+P+R, the 1d
#: convolution and the structural models; beam search of the structural and DA models
FULL_BENCHMARK = ("--variants", "san-p-r", "each-method", "conv-1d", "struct-abs", "struct-both",
                  "--decode-variants", "struct-both", "distance-aware", "--steps", "10", "--warmup", "3")
QUICK_BENCHMARK = ("--variants", "san-p-r", "distance-aware", "struct-both", "--decode-variants", "struct-both",
                   "--steps", "5", "--warmup", "2")
TINY_BENCHMARK = ("--variants", "struct-rel", "--decode-variants", "struct-rel", "--steps", "1", "--warmup", "0",
                  "--decode-rounds", "1", "--embed-dim", "16", "--ffn-dim", "32", "--heads", "2", "--layers", "1",
                  "--vocab-size", "64", "--max-tokens", "256", "--max-len", "24", "--max-positions", "32",
                  "--decode-length", "4", "--threads", "1")
#: the long-block step: per method, one language model per set of CUDA kernel paths its variants take
#: (the benchmark derives the set from the registry: flex for P / R, T5, DA, keys-only RPR; SDPA for
#: ALiBi, RoPE, the temperature; explicit for RPR with values, +Conv2d), and SAN+P+R
LONG_LM_SIZES = ("--layers", "6", "--embed-dim", "512", "--ffn-dim", "2048", "--heads", "8", "--precision", "bf16",
                 "--lm-block-tokens", "16384", "--decode-variants", "--vocab-size", "8000")
FULL_LONG_LM = (*LONG_LM_SIZES, "--lm-block-lengths", "512", "1024", "2048", "4096", "--steps", "5", "--warmup", "3",
                "--variants", "lm-san-p-r", "lm-each-kernel-path")
QUICK_LONG_LM = (*LONG_LM_SIZES, "--lm-block-lengths", "1024", "4096", "--steps", "3", "--warmup", "2",
                 "--variants", "lm-t5-bias", "lm-distance-aware", "lm-shaw-keys-only")
TINY_LONG_LM = ("--lm-block-lengths", "16", "32", "--lm-block-tokens", "64", "--decode-variants", "--steps", "1",
                "--warmup", "0", "--embed-dim", "16", "--ffn-dim", "32", "--heads", "2", "--layers", "1",
                "--vocab-size", "64", "--threads", "1", "--variants", "lm-distance-aware")
SCALES: Dict[str, Scale] = {
    "full": Scale(name="full", lines=None, bpe_merges=2000, layers=3, embed_dim=256, ffn_dim=1024, heads=4,
                  lstm_dim=256, max_tokens=4096, lm_batch_size=32, max_update=600, validate_every=100, lr=1e-3,
                  warmup=200, cuda_precisions=("fp16", "bf16", "amp"), pytest_args=(),
                  benchmark_args=FULL_BENCHMARK, long_lm_args=FULL_LONG_LM),
    "quick": Scale(name="quick", lines=None, bpe_merges=2000, layers=2, embed_dim=256, ffn_dim=1024, heads=4,
                   lstm_dim=256, max_tokens=4096, lm_batch_size=32, max_update=300, validate_every=50, lr=1e-3,
                   warmup=100, cuda_precisions=("fp16",), pytest_args=("-m", "not slow"),
                   benchmark_args=QUICK_BENCHMARK, long_lm_args=QUICK_LONG_LM),
    "tiny": Scale(name="tiny", lines=40, bpe_merges=200, layers=1, embed_dim=16, ffn_dim=32, heads=2, lstm_dim=16,
                  max_tokens=400, lm_batch_size=8, max_update=4, validate_every=2, lr=5e-3, warmup=0,
                  cuda_precisions=("fp16", "bf16", "amp"), pytest_args=("-m", "not slow"),
                  benchmark_args=TINY_BENCHMARK, long_lm_args=TINY_LONG_LM),
}
STEPS = ("pytest", "train", "multi", "benchmark", "long")
#: fairseq's data-parallel wrappers that the all-devices step can use; the first is fairseq's default
DDP_BACKENDS = ("pytorch_ddp", "no_c10d", "legacy_ddp")


# ------------------------------------------------------------------------------------ machine
@dataclass(frozen=True)
class Machine:
    """The device the check runs on: ``cuda`` with its GPUs, or ``cpu``."""

    kind: str
    gpus: Tuple[str, ...]
    torch: str
    cuda: Optional[str]

    @property
    def count(self) -> int:
        """Devices for the all-devices step: the GPUs, or two gloo processes on a CPU."""
        return len(self.gpus) if self.kind == "cuda" else 2

    def describe(self) -> str:
        if self.kind == "cpu":
            return f"CPU ({cpu_name()}, {os.cpu_count()} cores)"
        names = sorted(set(self.gpus))
        return f"{len(self.gpus)} x {', '.join(names)} (CUDA {self.cuda})"


def cpu_name() -> str:
    """The CPU's model name (``/proc/cpuinfo``), else ``platform.processor()``."""
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


class NoDevice(RuntimeError):
    """The device asked for is not there; the message says what to do."""


def detect_machine(kind: str) -> Machine:
    """The machine for ``--device kind``; raises :class:`NoDevice` where CUDA is asked for and torch
    sees none."""
    import torch

    if kind == "cpu":
        return Machine("cpu", (), torch.__version__, None)
    if not torch.cuda.is_available():
        raise NoDevice(
            f"gpu_check: no CUDA device: torch {torch.__version__} (built for CUDA {torch.version.cuda}) "
            "sees no GPU (torch.cuda.is_available() is False). Run `make gpu-check` on a machine with an "
            "NVIDIA GPU and a CUDA build of torch; on a CPU, `python scripts/gpu_check.py --device cpu "
            "--tiny` runs the smoke version of every step.")
    gpus = tuple(torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count()))
    return Machine("cuda", gpus, torch.__version__, torch.version.cuda)


def cpu_supports_bf16() -> bool:
    """Whether torch runs a bfloat16 linear layer forward and backward on this CPU."""
    import torch

    try:
        layer = torch.nn.Linear(8, 8).to(torch.bfloat16)
        layer(torch.ones(2, 8, dtype=torch.bfloat16)).sum().backward()
    except RuntimeError:
        return False
    return True


# ------------------------------------------------------------------------------------ report rows
@dataclass
class Row:
    """One line of the report's table. ``result``: passed, FAILED, skipped, met, MISSED, measured."""

    check: str
    device: str
    setting: str
    result: str
    numbers: str = ""

    def markdown(self) -> str:
        cells = (self.check, self.device, self.setting, self.result, self.numbers)
        return "| " + " | ".join(cell.replace("|", "\\|").replace("\n", " ") for cell in cells) + " |"


@dataclass
class Context:
    """What every step reads: the options, the machine, the scale and the output folders."""

    cli: argparse.Namespace
    machine: Machine
    scale: Scale
    precisions: Tuple[str, ...]
    output: Path
    jobs: int

    @property
    def logs(self) -> Path:
        return self.output / "logs"

    @property
    def data(self) -> Path:
        return self.output / "data"

    def device_flags(self) -> Tuple[str, ...]:
        return ("--cpu",) if self.machine.kind == "cpu" else ()

    def single_device(self) -> str:
        return "cpu" if self.machine.kind == "cpu" else f"cuda ({self.machine.gpus[0]})"

    def env(self, slot: Optional[int] = None) -> Dict[str, str]:
        """The environment of a command: the virtualenv's bin first on PATH, its share of the CPU
        threads and, given a ``slot``, one GPU (round-robin over the visible ones); without a slot
        every visible GPU."""
        env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
               "OMP_NUM_THREADS": str(max(1, (os.cpu_count() or 1) // self.jobs))}
        if self.machine.kind == "cuda" and slot is not None:
            visible = os.environ.get("CUDA_VISIBLE_DEVICES")
            ids = visible.split(",") if visible else [str(i) for i in range(len(self.machine.gpus))]
            env["CUDA_VISIBLE_DEVICES"] = ids[slot % len(ids)]
        return env


def tool(name: str) -> str:
    """The path of a console tool: the virtualenv's, else the one on PATH."""
    path = BIN / name
    if path.exists():
        return str(path)
    found = shutil.which(name)
    if found is None:
        raise FileNotFoundError(f"'{name}' is neither in {BIN} nor on PATH: run `make install` first")
    return found


class CommandError(RuntimeError):
    """A command that failed; the message is the last lines of its log."""


def run(command: Sequence[str], log: Path, env: Dict[str, str], timeout: float) -> str:
    """Run ``command`` with stdout and stderr in ``log``; return the log's text, or raise
    :class:`CommandError` with its last lines if the command fails or runs past ``timeout`` s."""
    return run_together([command], [log], env, timeout)[0]


def run_together(commands: Sequence[Sequence[str]], logs: Sequence[Path], env: Dict[str, str],
                 timeout: float) -> List[str]:
    """Run ``commands`` at once (e.g. the ranks of one distributed training), each with stdout and
    stderr in its log; return the logs' texts. As soon as one fails, or at ``timeout`` s, every one
    is killed with the processes it started (fairseq's one process per GPU) and
    :class:`CommandError` is raised with the first failure's last lines."""
    processes = []
    for command, log in zip(commands, logs):
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "w", encoding="utf-8") as handle:
            handle.write("$ " + " ".join(command) + "\n")
            handle.flush()
            processes.append(subprocess.Popen(command, stdout=handle, stderr=subprocess.STDOUT, env=env,
                                              cwd=REPO_ROOT, start_new_session=True))
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        states = [process.poll() for process in processes]
        if None not in states or any(state not in (None, 0) for state in states):
            break
        time.sleep(0.2)
    for process in processes:
        if process.poll() is None:
            with contextlib.suppress(ProcessLookupError):  # it may end between the poll and the kill
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    texts = [log.read_text(encoding="utf-8", errors="replace") for log in logs]
    failed = [index for index, process in enumerate(processes) if process.returncode != 0]
    if failed:
        first = min(failed, key=lambda index: (processes[index].returncode < 0, index))  # killed ones last
        status = processes[first].returncode
        why = f"timed out after {timeout:.0f} s" if status < 0 and time.monotonic() >= deadline else \
            f"exit status {status}"
        output = texts[first].split("\n", 1)[-1]  # without the command line written first
        raise CommandError(f"{command_name(commands[first])} {why} (log: {logs[first]}): {last_error(output)}")
    return texts


def command_name(command: Sequence[str]) -> str:
    """``fairseq-train``, ``pytest`` (for ``python -m pytest``), ``posattn_benchmark`` (for ``python
    scripts/posattn_benchmark``), ``X.py`` (for ``python X.py``)."""
    if len(command) > 2 and command[1] == "-m":
        return command[2]
    if len(command) > 1 and (command[1].endswith(".py") or Path(command[1]).is_dir()):
        return Path(command[1]).name
    return Path(command[0]).name


def last_error(text: str) -> str:
    """The most telling line of a failed command's output: its last error line, else its last line."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    errors = [line for line in lines if re.search(r"(Error|Exception|error:|FAILED)", line)]
    return (errors or lines or ["no output"])[-1][-300:]


# ------------------------------------------------------------------------------------ data
@dataclass(frozen=True)
class Corpora:
    """The binarized samples: translation (with structural side data) and language modelling."""

    translation: Path
    reference: Path
    lm: Path


def copy_head(source: Path, target: Path, lines: Optional[int]) -> None:
    """The first ``lines`` lines of ``source`` (all if None) into ``target``."""
    with open(source, encoding="utf-8") as handle:
        kept = [line for index, line in enumerate(handle) if lines is None or index < lines]
    target.write_text("".join(kept), encoding="utf-8")


def prepare_translation(ctx: Context) -> Tuple[Path, Path]:
    """Multi30k sample -> Moses + joint BPE -> fairseq-preprocess -> spaCy parse -> structural side
    data, as examples/quickstart does. Returns the data-bin and the raw test reference."""
    from fairseq_posattn.data.text_pipeline import prepare_translation_corpus

    prepared, data_bin = ctx.data / "multi30k" / "prepared", ctx.data / "multi30k" / "data-bin"
    prepare_translation_corpus(str(MULTI30K), str(prepared), SRC, TGT, bpe_merges=ctx.scale.bpe_merges,
                               max_lines=ctx.scale.lines)
    reference = ctx.data / "multi30k" / f"test.{TGT}"
    copy_head(MULTI30K / f"test.{TGT}", reference, ctx.scale.lines)
    timeout, env = ctx.cli.timeout, ctx.env()
    workers = str(max(1, min(4, (os.cpu_count() or 1) // 3)))  # per split: the three run side by side
    run([tool("fairseq-preprocess"), "--source-lang", SRC, "--target-lang", TGT, "--joined-dictionary",
         "--workers", workers, "--trainpref", f"{prepared}/train.bpe",
         "--validpref", f"{prepared}/valid.bpe", "--testpref", f"{prepared}/test.bpe", "--destdir", str(data_bin)],
        ctx.logs / "prepare" / "preprocess-multi30k.log", env, timeout)

    def structure(split: str) -> None:
        run([tool("posattn-parse"), "--backend", "spacy", "--input", f"{prepared}/{split}.tok.{SRC}",
             "--output", f"{prepared}/{split}.conllu", "--workers", workers],
            ctx.logs / "prepare" / f"parse-{split}.log", env, timeout)
        run([tool("posattn-prepare-structure"), "--conllu", f"{prepared}/{split}.conllu", "--bpe",
             f"{prepared}/{split}.bpe.{SRC}", "--destdir", str(data_bin), "--split", split,
             "--source-lang", SRC, "--target-lang", TGT],
            ctx.logs / "prepare" / f"structure-{split}.log", env, timeout)

    with ThreadPoolExecutor(max_workers=3) as pool:  # the splits side by side: mostly start-up time
        list(pool.map(structure, ("train", "valid", "test")))
    return data_bin, reference


def prepare_lm(ctx: Context) -> Path:
    """The PTB sample (its first ``lines`` lines per split) binarized for ``--task language_modeling``."""
    raw, data_bin = ctx.data / "ptb" / "raw", ctx.data / "ptb" / "data-bin"
    raw.mkdir(parents=True, exist_ok=True)
    for split in ("train", "valid", "test"):
        copy_head(PTB / f"{split}.txt", raw / f"{split}.txt", ctx.scale.lines)
    run([tool("fairseq-preprocess"), "--only-source", "--task", LANGUAGE_MODELING, "--workers", "1",
         "--trainpref", f"{raw}/train.txt", "--validpref", f"{raw}/valid.txt", "--testpref", f"{raw}/test.txt",
         "--destdir", str(data_bin)], ctx.logs / "prepare" / "preprocess-ptb.log", ctx.env(), ctx.cli.timeout)
    return data_bin


# ------------------------------------------------------------------------------------ training
@dataclass(frozen=True)
class TrainRun:
    """One short training: a family in one precision on one device or on ``devices`` of them."""

    family: Family
    precision: str
    devices: int = 1

    @property
    def name(self) -> str:
        return f"{self.family.name}-{self.precision}" + (f"-x{self.devices}" if self.devices > 1 else "")

    @property
    def label(self) -> str:
        return self.precision + (f", {self.devices} devices" if self.devices > 1 else "")


@dataclass
class TrainResult:
    """What a training and its evaluation gave: the report row and the validation-loss points."""

    run: TrainRun
    row: Row
    log: Optional[Path] = None
    points: List[Tuple[float, float]] = field(default_factory=list)
    #: sacreBLEU's signature of a translation run's BLEU
    signature: str = ""


def model_flags(ctx: Context, family: Family) -> List[str]:
    """Architecture, sizes and position flags of ``family`` at the check's scale."""
    s = ctx.scale
    if family.is_lm:
        return ["--arch", family.arch, "--decoder-embed-dim", str(s.lstm_dim), "--decoder-hidden-size",
                str(s.lstm_dim), "--decoder-out-embed-dim", str(s.lstm_dim), "--decoder-layers", "2",
                "--share-decoder-input-output-embed", *family.flags]
    sizes = []
    for side in ("encoder", "decoder"):
        sizes += [f"--{side}-layers", str(s.layers), f"--{side}-embed-dim", str(s.embed_dim),
                  f"--{side}-ffn-embed-dim", str(s.ffn_dim), f"--{side}-attention-heads", str(s.heads)]
    return ["--arch", family.arch, *sizes, "--share-all-embeddings", "--max-source-positions", "128",
            "--max-target-positions", "128", *family.flags]


#: the LM's data flags, for training and for fairseq-eval-lm: blocks of 35 tokens (Dagan's normalizer N)
LM_DATA_FLAGS = ("--tokens-per-sample", "35", "--max-target-positions", "35")


def train_command(ctx: Context, run_: TrainRun, corpora: Corpora, save_dir: Path) -> List[str]:
    """The ``fairseq-train`` command of ``run_`` (validating every ``validate_every`` updates and at
    the end only; the last checkpoint is the one scored). The batch of one update is the same on any
    number of devices: each takes its share."""
    s, family = ctx.scale, run_.family
    if family.is_lm:
        data = [str(corpora.lm), "--task", LANGUAGE_MODELING, *LM_DATA_FLAGS,
                "--batch-size", str(max(1, s.lm_batch_size // run_.devices)), "--clip-norm", "0.25"]
    else:
        data = [str(corpora.translation), "--task", family.task, "--source-lang", SRC, "--target-lang", TGT,
                "--criterion", "label_smoothed_cross_entropy", "--label-smoothing", "0.1",
                "--max-tokens", str(s.max_tokens // run_.devices)]
    schedule = (["--lr-scheduler", "inverse_sqrt", "--warmup-updates", str(s.warmup), "--warmup-init-lr", "1e-07"]
                if s.warmup else [])
    return [
        tool("fairseq-train"), *data, "--user-dir", str(USER_DIR), *model_flags(ctx, family), "--dropout", "0.1",
        "--optimizer", "adam", "--adam-betas", "(0.9, 0.98)", "--lr", str(s.lr), *schedule,
        "--max-update", str(s.max_update), "--validate-interval-updates", str(s.validate_every),
        "--validate-interval", "1000000", "--save-interval", "1000000", "--no-epoch-checkpoints",
        "--save-dir", str(save_dir), "--seed", "1", "--num-workers", "0", "--required-batch-size-multiple", "1",
        "--log-format", "simple", "--log-interval", str(max(1, s.validate_every // 2)),
        *PRECISION_FLAGS[run_.precision], *ctx.device_flags(),
    ]


def free_port() -> int:
    """A TCP port that nothing listens on now (for the gloo processes' rendezvous)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def train(ctx: Context, run_: TrainRun, corpora: Corpora, slot: int) -> Path:
    """Run the training; returns its log (rank 0's for several devices). Several GPUs: fairseq's own
    spawn with NCCL and ``--ddp-backend pytorch_ddp``; several CPU processes: launched here, gloo."""
    save_dir = ctx.output / "checkpoints" / run_.name
    shutil.rmtree(save_dir, ignore_errors=True)
    command = train_command(ctx, run_, corpora, save_dir)
    log = ctx.logs / "train" / f"{run_.name}.log"
    timeout = ctx.cli.timeout
    if run_.devices == 1:
        run(command, log, ctx.env(slot), timeout)
        return log
    distributed = ["--distributed-world-size", str(run_.devices), "--ddp-backend", ctx.cli.ddp_backend]
    if ctx.machine.kind == "cuda":
        run([*command, *distributed, "--distributed-backend", "nccl"], log, ctx.env(), timeout)
        return log
    port = free_port()
    ranks = [[*command, *distributed, "--distributed-backend", "gloo", "--distributed-no-spawn",
              "--distributed-init-method", f"tcp://127.0.0.1:{port}", "--distributed-rank", str(rank)]
             for rank in range(run_.devices)]
    logs = [log] + [log.with_name(f"{run_.name}.rank{rank}.log") for rank in range(1, run_.devices)]
    run_together(ranks, logs, ctx.env(), timeout)
    return log


def validation_losses(log: Path) -> List[Tuple[float, float]]:
    """``(num_updates, valid loss)`` of every validation in a fairseq-train log."""
    from fairseq_posattn.inspect.learning_curves import read_curve

    return read_curve(str(log), metric="loss", x="num_updates").points


def overflow_count(log: Path) -> int:
    """How many updates fairseq's loss scaler (``--fp16``, ``--amp``) skipped for overflowing
    gradients: the trainer logs "NOTE: gradient overflow detected, ignoring gradient, ..." for each."""
    text = log.read_text(encoding="utf-8", errors="replace")
    return sum("overflow detected" in line for line in text.splitlines())


def evaluate(ctx: Context, run_: TrainRun, corpora: Corpora, slot: int) -> Tuple[str, str]:
    """BLEU and its sacreBLEU signature, or test perplexity (and no signature), of the run's last
    checkpoint, in a fresh process."""
    checkpoint = ctx.output / "checkpoints" / run_.name / "checkpoint_last.pt"
    log = ctx.logs / "evaluate" / f"{run_.name}.log"
    if run_.family.is_lm:
        text = run([tool("fairseq-eval-lm"), str(corpora.lm), "--user-dir", str(USER_DIR), "--path", str(checkpoint),
                    "--gen-subset", "test", *LM_DATA_FLAGS, "--max-tokens", "4096", "--num-workers", "0",
                    *ctx.device_flags()], log, ctx.env(slot), ctx.cli.timeout)
        found = re.findall(r"Perplexity: ([0-9.]+|inf|nan)", text)
        if not found:
            raise CommandError(f"fairseq-eval-lm printed no perplexity (log: {log})")
        return f"test ppl {float(found[-1]):.1f}", ""
    from fairseq_posattn.data.generate_output import score_generate_output

    hypotheses = ctx.output / "generate" / f"{run_.name}.txt"
    hypotheses.parent.mkdir(parents=True, exist_ok=True)
    text = run([tool("fairseq-generate"), str(corpora.translation), "--user-dir", str(USER_DIR),
                "--task", run_.family.task, "--source-lang", SRC, "--target-lang", TGT, "--path", str(checkpoint),
                "--gen-subset", "test", "--beam", "5", "--max-len-a", "1.2", "--max-len-b", "10", "--remove-bpe",
                "--batch-size", "128", "--required-batch-size-multiple", "1", *ctx.device_flags()],
               log, ctx.env(slot), ctx.cli.timeout)
    hypotheses.write_text(text, encoding="utf-8")
    bleu = score_generate_output(str(hypotheses), str(corpora.reference), TGT)
    return f"BLEU {bleu.score:.2f}", bleu.signature


def train_and_evaluate(ctx: Context, run_: TrainRun, corpora: Corpora, slot: int) -> TrainResult:
    """Train, check the validation losses, evaluate; every failure becomes a FAILED row."""
    if run_.devices == 1:
        device = ctx.single_device()
    elif ctx.machine.kind == "cuda":
        device = f"{run_.devices} x cuda (NCCL)"
    else:
        device = f"cpu, {run_.devices} processes (gloo)"
    setting = " ".join(PRECISION_FLAGS[run_.precision]) or "fp32"
    if run_.devices > 1:
        setting += f", {run_.devices} devices, --ddp-backend {ctx.cli.ddp_backend}"
    row = Row(f"train {run_.family.label}", device, setting, "FAILED")
    result = TrainResult(run_, row)
    started = time.monotonic()
    try:
        result.log = train(ctx, run_, corpora, slot)
        result.points = validation_losses(result.log)
        seconds = time.monotonic() - started
        losses = [loss for _, loss in result.points]
        trend = f"valid loss {losses[0]:.2f} -> {losses[-1]:.2f} ({int(result.points[-1][0])} updates)"
        overflows = overflow_count(result.log)
        skipped = f", {overflows} overflow skip{'s' * (overflows != 1)}" if run_.precision in ("fp16", "amp") else ""
        if not all(math.isfinite(loss) for loss in losses):
            row.numbers = f"{trend}: not finite{skipped}"
            return result
        if losses[-1] > losses[0] - LOSS_TOLERANCE:
            row.numbers = f"{trend}: did not fall{skipped}"
            return result
        score, result.signature = evaluate(ctx, run_, corpora, slot)
        row.result = "passed"
        row.numbers = f"{trend}; {score}; train {seconds:.0f} s{skipped}"
    except (CommandError, FileNotFoundError, ValueError) as error:
        row.numbers = str(error)
    return result


def draw_curves(ctx: Context, results: Sequence[TrainResult]) -> List[Path]:
    """One PNG per family: the validation loss of each of its runs against updates."""
    from fairseq_posattn.inspect.learning_curves import Curve, CurveGroup, draw

    pictures = []
    for family in dict.fromkeys(result.run.family for result in results):
        groups = [CurveGroup(result.run.label, [Curve(str(result.log), result.points)])
                  for result in results if result.run.family == family and result.points]
        if not groups:
            continue
        picture = ctx.output / f"loss-{family.name}.png"
        draw(groups, "loss", "num_updates", "valid", str(picture),
             title=f"{family.label}: validation loss ({ctx.machine.kind})")
        pictures.append(picture)
    return pictures


# ------------------------------------------------------------------------------------ pytest
def junit_counts(path: Path) -> Dict[str, Dict[str, int]]:
    """Per test module (``test_compile``...): how many tests passed, failed, errored, were skipped."""
    counts: Dict[str, Dict[str, int]] = {}
    for case in ElementTree.parse(path).getroot().iter("testcase"):
        # a test's module is in its classname; a collection error's, in its name
        parts = case.get("classname", "").split(".") + case.get("name", "").split(".")
        module = next((part for part in parts if part.startswith("test_")), "")
        outcome = "passed"
        for child, name in (("failure", "failed"), ("error", "errors"), ("skipped", "skipped")):
            if case.find(child) is not None:
                outcome = name
                break
        counts.setdefault(module, dict.fromkeys(("passed", "failed", "errors", "skipped"), 0))[outcome] += 1
    return counts


def pytest_step(ctx: Context) -> List[Row]:
    """The device-aware test files with ``pytest --device <device>``, one row per file."""
    device = ctx.machine.kind
    setting = " ".join(("--device", device, *ctx.scale.pytest_args))
    present = [name for name in PYTEST_FILES if (REPO_ROOT / name).exists()]
    rows = [Row(f"pytest {name}", device, setting, "skipped", "not in this checkout")
            for name in PYTEST_FILES if name not in present]
    if not present:
        return rows
    junit = ctx.output / "pytest.xml"
    junit.unlink(missing_ok=True)
    command = [sys.executable, "-m", "pytest", "-q", "-rfE", "-p", "no:cacheprovider",
               "--continue-on-collection-errors", "--device", device, f"--junitxml={junit}",
               *ctx.scale.pytest_args, *present]
    started = time.monotonic()
    try:
        run(command, ctx.logs / "pytest.log", ctx.env(), ctx.cli.timeout)
        failure = ""
    except CommandError as error:
        failure = str(error)
    seconds = time.monotonic() - started
    try:
        counts = junit_counts(junit) if junit.exists() else {}
    except ElementTree.ParseError:  # pytest killed while writing it
        counts = {}
    for name in present:
        numbers = counts.get(Path(name).stem)
        if numbers is None:
            rows.append(Row(f"pytest {name}", device, setting, "FAILED" if failure else "skipped",
                            failure or "no test selected"))
            continue
        bad = numbers["failed"] + numbers["errors"]
        text = ", ".join(f"{value} {key}" for key, value in numbers.items() if value)
        rows.append(Row(f"pytest {name}", device, setting, "FAILED" if bad else "passed",
                        f"{text} ({seconds:.0f} s for all files)"))
    return rows


# ------------------------------------------------------------------------------------ benchmark
def markdown_tables(text: str) -> List[List[Dict[str, str]]]:
    """Every table of a markdown text as rows of ``{header: cell}``; a bold first cell (a row group's
    title) is put into the following rows as ``group``."""
    tables: List[List[Dict[str, str]]] = []
    header: Optional[List[str]] = None
    group = ""
    for line in text.splitlines() + [""]:
        if not line.startswith("|"):
            header = None
            continue
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if header is None:
            header, group = cells, ""
            tables.append([])
        elif set(line) <= set("|-: "):
            continue
        elif cells[0].startswith("**"):
            group = cells[0].strip("*")
        else:
            tables[-1].append({"group": group, **dict(zip(header, cells))})
    return tables


def benchmark_rows(report: str, device: str) -> List[Row]:
    """The benchmark report's train-step and beam-search rows as check rows."""
    rows = []
    for table in markdown_tables(report):
        for cells in table:
            if "time ratio" in cells:
                check = f"benchmark train step: {cells['variant']}"
                numbers = (f"time ratio {cells['time ratio'] or '-'}, memory ratio {cells['memory ratio'] or '-'}; "
                           f"{cells['step time (ms)']} ms, {cells['peak memory (MB)']} MB")
            elif "speed ratio" in cells:
                check = f"benchmark beam search: {cells['variant']}"
                numbers = f"speed ratio {cells['speed ratio'] or '-'}; {cells['sentences/s']} sentences/s"
            else:
                continue
            target = cells.get("target", "")
            crashed = any("crashed" in value for value in cells.values())
            result = ("FAILED" if crashed else "MISSED" if "MISSED" in target else "met" if "met" in target
                      else "measured")
            if target:
                numbers += f"; target {target.split(':')[0]}"
            rows.append(Row(check, device, cells["group"], result, numbers))
    return rows


def benchmark_step(ctx: Context) -> List[Row]:
    """``scripts/posattn_benchmark --device <device>`` at the scale's sizes; its report is kept beside ours."""
    device = ctx.machine.kind
    output = ctx.output / "benchmark.md"
    command = [sys.executable, str(BENCHMARK), "--device", device, "--skip-prepare", "--malloc", "reuse",
               *ctx.scale.benchmark_args, "--output", str(output)]
    try:
        run(command, ctx.logs / "benchmark.log", ctx.env(), ctx.cli.timeout)
    except CommandError as error:
        if not output.exists():
            return [Row("benchmark", device, " ".join(ctx.scale.benchmark_args), "FAILED", str(error))]
    rows = benchmark_rows(output.read_text(encoding="utf-8"), device)
    return rows or [Row("benchmark", device, "", "FAILED", f"no table in {output}")]


def long_lm_step(ctx: Context) -> List[Row]:
    """The benchmark's language-model blocks groups at the scale's lengths (bf16 on CUDA); its report is
    kept beside ours as ``long-lm.md``."""
    device = ctx.machine.kind
    output = ctx.output / "long-lm.md"
    args = [arg for arg in ctx.scale.long_lm_args if not (device == "cpu" and arg in ("--precision", "bf16"))]
    command = [sys.executable, str(BENCHMARK), "--device", device, "--skip-prepare", "--malloc", "reuse",
               "--skip-short", "--lm", "--lm-blocks-only", *args, "--output", str(output)]
    try:
        run(command, ctx.logs / "long-lm.log", ctx.env(), ctx.cli.timeout)
    except CommandError as error:
        if not output.exists():
            return [Row("long LM blocks", device, " ".join(args), "FAILED", str(error))]
    rows = [Row(f"long LM blocks, {row.check}", row.device, row.setting, row.result, row.numbers)
            for row in benchmark_rows(output.read_text(encoding="utf-8"), device)]
    return rows or [Row("long LM blocks", device, "", "FAILED", f"no table in {output}")]


# ------------------------------------------------------------------------------------ orchestration
def training_runs(ctx: Context) -> Tuple[List[TrainRun], List[TrainRun]]:
    """The one-device runs (every family in every precision) and the all-devices runs (every family
    in the first precision) when the step is on and there is more than one device."""
    families = [FAMILIES_BY_NAME[name] for name in ctx.cli.families]
    single = [TrainRun(family, precision) for family in families for precision in ctx.precisions]
    multi = []
    if "multi" not in ctx.cli.skip and ctx.machine.count > 1:
        multi = [TrainRun(family, ctx.precisions[0], ctx.machine.count) for family in families]
    return single, multi


def one_device_note(ctx: Context) -> List[Row]:
    """A skipped row for the all-devices step where only one GPU is visible."""
    if "multi" in ctx.cli.skip or "train" in ctx.cli.skip or ctx.machine.count > 1:
        return []
    return [Row("train on all devices", ctx.single_device(), f"--ddp-backend {ctx.cli.ddp_backend}", "skipped",
                "one GPU visible: nothing to distribute")]


def training_step(ctx: Context, pool: ThreadPoolExecutor, log: Callable[[str], None]) -> List[TrainResult]:
    """Prepare the samples, train and evaluate every one-device run (``jobs`` at a time), then the
    all-devices runs one after the other (each takes every device)."""
    single, multi = training_runs(ctx)
    if not single and not multi:
        return []
    log("preparing the Multi30k and PTB samples")
    corpora = prepare_corpora(ctx, pool)
    log(f"training {len(single)} one-device runs, {ctx.jobs} at a time")
    futures = [pool.submit(train_and_evaluate, ctx, run_, corpora, slot) for slot, run_ in enumerate(single)]
    results = [future.result() for future in futures]
    for run_ in multi:
        log(f"training {run_.name} on {run_.devices} devices")
        results.append(train_and_evaluate(ctx, run_, corpora, 0))
    return results


def prepare_corpora(ctx: Context, pool: ThreadPoolExecutor) -> Corpora:
    translation = pool.submit(prepare_translation, ctx)
    lm = pool.submit(prepare_lm, ctx)
    return Corpora(*translation.result(), lm.result())


def failed_preparation(ctx: Context, error: Exception) -> List[Row]:
    return [Row("prepare the samples", ctx.machine.kind, "Multi30k + PTB samples", "FAILED", str(error))]


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


def training_lines(ctx: Context, results: Sequence[TrainResult]) -> List[str]:
    """The report's line on the trainings: data, sizes, budget, what passing means, the BLEU signature."""
    s = ctx.scale
    signatures = sorted({result.signature for result in results if result.signature})
    bleu = f"sacreBLEU `{signatures[0]}`" if len(signatures) == 1 else "sacreBLEU"
    return [
        f"- Trainings: the first {s.lines or 'all'} lines of every split of data/multi30k_sample (joint BPE, "
        f"{s.bpe_merges} merges; structural side data from spaCy's parse) and of data/ptb_sample; translation "
        f"models {s.layers}+{s.layers} layers, {s.embed_dim} dim, FFN {s.ffn_dim}, {s.heads} heads, "
        f"{s.max_tokens} tokens per update; the LSTM LM {s.lstm_dim} dim, 2 layers, {s.lm_batch_size} blocks "
        f"of 35 tokens per update (an all-devices run splits the batch over its devices); Adam lr {s.lr}, "
        f"{s.max_update} updates, validation every {s.validate_every}. A run passes when it finishes, every "
        "validation loss is finite and the last is below the first. From the last checkpoint, in a fresh "
        f"process: BLEU (beam 5, detokenized, {bleu}) or test perplexity (fairseq-eval-lm).",
    ]


def render(ctx: Context, rows: Sequence[Row], results: Sequence[TrainResult], pictures: Sequence[Path],
           seconds: float) -> str:
    """The report: what ran where, the table, the loss-curve pictures and where the logs are."""
    import fairseq

    counts: Dict[str, int] = {}
    for row in rows:
        counts[row.result] = counts.get(row.result, 0) + 1
    lines = [
        "# GPU check", "",
        f"- Device: {ctx.machine.describe()}; torch {ctx.machine.torch}, fairseq {fairseq.__version__}, "
        f"Python {platform.python_version()}.",
        f"- Mode: {ctx.scale.name} (`{' '.join(ctx.cli.argv) or 'no options'}`); {seconds / 60:.1f} minutes in "
        f"all, {ctx.jobs} runs at a time; {time.strftime('%Y-%m-%d %H:%M')}.",
        *(training_lines(ctx, results) if results else []),
        "- Results: " + ", ".join(f"{count} {result}" for result, count in sorted(counts.items())) + ".",
        "", "| check | device | setting | result | numbers |", "|---|---|---|---|---|",
        *(row.markdown() for row in rows),
    ]
    if pictures:
        lines += ["", "## Validation loss", ""]
        lines += [f"![{picture.stem}]({picture.name})" for picture in pictures]
    lines += ["", "Logs: `logs/` (one per command); the benchmark's own report: `benchmark.md`; every row as "
              "JSON: `results.json`."]
    return "\n".join(lines) + "\n"


def parse_cli(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
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


def write_outputs(ctx: Context, rows: Sequence[Row], results: Sequence[TrainResult], seconds: float) -> Path:
    pictures = draw_curves(ctx, results)
    report = ctx.output / "report.md"
    report.write_text(render(ctx, rows, results, pictures, seconds), encoding="utf-8")
    curves = {result.run.name: result.points for result in results}
    (ctx.output / "results.json").write_text(json.dumps(
        {"device": asdict(ctx.machine), "mode": ctx.scale.name, "seconds": round(seconds, 1),
         "rows": [asdict(row) for row in rows], "valid_loss": curves}, indent=1), encoding="utf-8")
    return report


#: what a run writes into its output folder, removed before the next run (fairseq-preprocess refuses
#: an existing dictionary; an old checkpoint or log would be read as this run's)
OUTPUTS = ("data", "checkpoints", "generate", "logs", "report.md", "results.json", "benchmark.md", "pytest.xml")


def reset_output(output: Path) -> None:
    """Create ``output``, or empty it of an earlier run's files (and nothing else)."""
    output.mkdir(parents=True, exist_ok=True)
    for name in OUTPUTS:
        path = output / name
        if path.is_dir():
            shutil.rmtree(path)
        else:
            path.unlink(missing_ok=True)
    for picture in output.glob("loss-*.png"):
        picture.unlink()


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


if __name__ == "__main__":
    sys.exit(main())
