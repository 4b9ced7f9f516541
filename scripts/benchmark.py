#!/usr/bin/env python
"""Train-step time and peak memory of ``transformer_posattn`` against fairseq's ``transformer``.

For every position variant (SPEC.md sections 1-5) the script builds the model in-process with
fairseq's own machinery (``options.get_training_parser`` + ``parse_args_and_arch`` with
``--user-dir fairseq_posattn``, then ``ARCH_MODEL_REGISTRY[arch].build_model``), trains it for a few
steps on synthetic Multi30k-like batches and reports its step time and peak memory, both also as a
ratio to vanilla fairseq ``transformer_iwslt_de_en`` of the same size on the same batches.

A train step is: forward, fairseq's label-smoothed cross entropy (epsilon 0.1, mean over target
tokens), backward, ``torch.optim.Adam`` step. Every measurement runs in a fresh subprocess (this
script with ``--worker``); every subprocess builds the same batches from the same seed (checked by
hash). Per row group (batch shape):

1. Memory: each model alone in its own process, vanilla first and last (a check of the method),
   two train steps: the first batch, then the largest one, with the Adam state already in place.
   CPU: growth of the process's peak resident set size (``getrusage(RUSAGE_SELF).ru_maxrss``) from
   just before the model is built (torch, fairseq and the batches already loaded) to the end of the
   second step: weights, gradients, Adam state and activations. glibc is told to map every block of
   64 KiB or more on its own (``MALLOC_MMAP_THRESHOLD_``), so that a freed tensor leaves the RSS at
   once and the peak follows the live tensors, not the allocator's slack (which otherwise adds a few
   hundred MB that vary by +-3% from run to run). CUDA:
   ``torch.cuda.max_memory_allocated`` over the same span, minus what was allocated before.
2. Time: one process builds every model of the group and runs them round-robin, one step of each
   model per batch, the order rotated every round, so that all models see the same machine load
   (a shared machine drifts by tens of percent within minutes). After the warm-up rounds, the step
   time is the median over the timed rounds and the time ratio the median over rounds of the
   model's step time over vanilla's in the same round. ``time.perf_counter``, with
   ``torch.cuda.synchronize`` on a GPU. That process holds every model and its Adam state at once
   (about 0.5 GB per model at the iwslt sizes): use ``--variants`` to measure fewer.

Usage::

    python scripts/benchmark.py                           # all variants, iwslt sizes, 10 steps
    python scripts/benchmark.py --steps 5 --layers 2 --variants san-p da rpr --output bench.md
    python scripts/benchmark.py --long                    # also a group at sequence length 512
"""

import argparse
import hashlib
import json
import logging
import math
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Set, Tuple

REPO_ROOT = Path(__file__).resolve().parent.parent
USER_DIR = REPO_ROOT / "fairseq_posattn"
VANILLA_ARCH = "transformer_iwslt_de_en"
POSATTN_ARCH = "transformer_posattn_iwslt_de_en"
RESULT_MARKER = "BENCHMARK_RESULT "
#: environment of the memory workers: glibc mmaps (and so returns at once) every block >= 64 KiB
MEMORY_WORKER_ENV = {"MALLOC_MMAP_THRESHOLD_": "65536"}
LABEL_SMOOTHING = 0.1
LONG_LENGTH = 512
#: relative spread of vanilla's step times beyond which the report warns that the machine was busy
NOISE_WARNING = 0.10

logger = logging.getLogger("benchmark")


@dataclass(frozen=True)
class Variant:
    """One model configuration: a key for ``--variants``, a paper-style label and its flags."""

    name: str
    label: str
    flags: Tuple[str, ...] = ()
    arch: str = POSATTN_ARCH


VANILLA = Variant("vanilla", "Transformer (fairseq)", arch=VANILLA_ARCH)

POSATTN_VARIANTS: Tuple[Variant, ...] = (
    Variant("defaults", "transformer_posattn, defaults"),
    Variant("san-p", "SAN+P", ("--encoder-direct-position", "absolute")),
    Variant("san-r", "SAN+R", ("--encoder-direct-position", "relative")),
    Variant("san-p-r", "SAN+P+R", ("--encoder-direct-position", "both")),
    Variant("san-p-r-all", "SAN+P+R, all layers",
            ("--encoder-direct-position", "both", "--encoder-direct-position-layers", "all")),
    Variant("temp", "+Temp", ("--encoder-learnable-temperature",)),
    Variant("conv2d", "+Conv2d", ("--encoder-conv-attention", "2d")),
    Variant("conv1d", "+Conv", ("--encoder-conv-attention", "1d")),
    Variant("da", "DA-Transformer", ("--encoder-distance-aware", "--decoder-distance-aware")),
    Variant("rpr", "Transformer-RPR (k=16)",
            ("--encoder-relative-positions", "16", "--decoder-relative-positions", "16")),
    Variant("dec-san-p-r", "SAN+P+R, decoder", ("--decoder-direct-position", "both")),
)
VARIANTS_BY_NAME: Dict[str, Variant] = {v.name: v for v in POSATTN_VARIANTS}


@dataclass(frozen=True)
class BatchShape:
    """Synthetic batches: lengths (EOS included) uniform in [min_len, max_len], as many sentence
    pairs per batch as fit in ``max_tokens`` padded tokens (fairseq's ``--max-tokens`` rule)."""

    min_len: int
    max_len: int
    max_tokens: int

    def describe(self) -> str:
        if self.min_len == self.max_len:
            return f"{self.max_tokens // self.max_len} x {self.max_len} tokens per batch"
        return (f"up to {self.max_tokens} padded tokens per batch, source and target lengths "
                f"uniform in [{self.min_len}, {self.max_len}]")


@dataclass(frozen=True)
class WorkerSpec:
    """What one worker subprocess measures (sent as JSON): ``memory`` of ``variants[0]`` alone,
    or the round-robin ``timing`` of all ``variants`` (the first one is the reference)."""

    mode: str
    variants: Tuple[Variant, ...]
    size_flags: Tuple[str, ...]
    max_positions: int
    shape: BatchShape
    vocab_size: int
    warmup: int
    steps: int
    seed: int
    cpu: bool
    threads: Optional[int]

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> "WorkerSpec":
        raw = json.loads(text)
        raw["variants"] = tuple(
            Variant(v["name"], v["label"], tuple(v["flags"]), v["arch"]) for v in raw["variants"]
        )
        raw["size_flags"] = tuple(raw["size_flags"])
        raw["shape"] = BatchShape(**raw["shape"])
        return cls(**raw)


@dataclass
class Group:
    """A row group: one batch shape and max positions, and what its workers measured."""

    title: str
    shape: BatchShape
    max_positions: int
    memory: Dict[str, List[Dict[str, Any]]] = field(default_factory=dict)
    timing: Dict[str, List[float]] = field(default_factory=dict)
    failures: Dict[str, str] = field(default_factory=dict)
    digests: Set[str] = field(default_factory=set)


# ----------------------------------------------------------------------------------------- worker
# torch and fairseq are imported inside the worker functions only: the parent process stays light.
def make_dictionary(size: int) -> Any:
    """A fairseq ``Dictionary`` of exactly ``size`` symbols (the 4 specials included)."""
    from fairseq.data import Dictionary

    dictionary = Dictionary()
    for index in range(size - len(dictionary)):
        dictionary.add_symbol(f"w{index}")
    return dictionary


def make_batches(dictionary: Any, shape: BatchShape, count: int, seed: int) -> List[Dict[str, Any]]:
    """``count`` batches collated as ``LanguagePairDataset`` does: left-padded source, right-padded
    target, ``prev_output_tokens`` with EOS moved to the front, sorted by source length."""
    import numpy as np
    import torch
    from fairseq.data.data_utils import collate_tokens

    rng = np.random.default_rng(seed)
    pad, eos = dictionary.pad(), dictionary.eos()

    def sentence(length: int) -> torch.Tensor:
        words = rng.integers(dictionary.nspecial, len(dictionary), size=length - 1)
        return torch.tensor(np.append(words, eos), dtype=torch.long)

    batches = []
    for _ in range(count):
        pairs: List[Tuple[torch.Tensor, torch.Tensor]] = []
        width = 0
        while True:
            src_len, tgt_len = (int(n) for n in rng.integers(shape.min_len, shape.max_len + 1, size=2))
            new_width = max(width, src_len, tgt_len)
            if pairs and (len(pairs) + 1) * new_width > shape.max_tokens:
                break
            pairs.append((sentence(src_len), sentence(tgt_len)))
            width = new_width
        pairs.sort(key=lambda pair: -pair[0].numel())
        sources, targets = [p[0] for p in pairs], [p[1] for p in pairs]
        batches.append({
            "net_input": {
                "src_tokens": collate_tokens(sources, pad, eos, left_pad=True),
                "src_lengths": torch.tensor([s.numel() for s in sources]),
                "prev_output_tokens": collate_tokens(targets, pad, eos, left_pad=False,
                                                     move_eos_to_beginning=True),
            },
            "target": collate_tokens(targets, pad, eos, left_pad=False),
        })
    return batches


def batches_digest(batches: Sequence[Dict[str, Any]]) -> str:
    """A hash of the batches, so the parent can check that every worker saw the same data."""
    digest = hashlib.sha1()
    for batch in batches:
        for tensor in (*batch["net_input"].values(), batch["target"]):
            digest.update(tensor.numpy().tobytes())
    return digest.hexdigest()[:12]


def peak_rss_mb() -> float:
    """The process's peak resident set size so far (``ru_maxrss``: KiB on Linux, bytes on macOS)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**20 if sys.platform == "darwin" else peak / 2**10


class Worker:
    """One subprocess's device, dictionary and batches, and the models it builds and trains."""

    def __init__(self, spec: WorkerSpec):
        import torch

        self.spec = spec
        if spec.threads is not None:
            torch.set_num_threads(spec.threads)
        self.device = torch.device("cuda" if torch.cuda.is_available() and not spec.cpu else "cpu")
        self.dictionary = make_dictionary(spec.vocab_size)
        batches = make_batches(self.dictionary, spec.shape, spec.warmup + spec.steps, spec.seed)
        self.digest = batches_digest(batches)
        self.batch_shapes = [list(b["net_input"]["src_tokens"].shape) for b in batches]
        self.batches = [
            {"net_input": {k: v.to(self.device) for k, v in b["net_input"].items()},
             "target": b["target"].to(self.device)}
            for b in batches
        ]

    @property
    def on_cuda(self) -> bool:
        return self.device.type == "cuda"

    def build(self, variant: Variant) -> Tuple[Any, Any, argparse.Namespace]:
        """Model, Adam optimizer and parsed args of ``variant``, built as ``fairseq-train`` does."""
        import torch
        from fairseq import options
        from fairseq.models import ARCH_MODEL_REGISTRY

        class Task:
            source_dictionary = self.dictionary
            target_dictionary = self.dictionary

        argv = [
            "unused-data-dir", "--user-dir", str(USER_DIR), "--task", "translation",
            "--arch", variant.arch, "--max-source-positions", str(self.spec.max_positions),
            "--max-target-positions", str(self.spec.max_positions), "--dropout", "0.1",
            *self.spec.size_flags, *variant.flags,
        ]
        args = options.parse_args_and_arch(options.get_training_parser(), argv)
        torch.manual_seed(self.spec.seed)
        model = ARCH_MODEL_REGISTRY[args.arch].build_model(args, Task()).to(self.device).train()
        optimizer = torch.optim.Adam(model.parameters(), lr=5e-4, betas=(0.9, 0.98))
        return model, optimizer, args

    def step(self, model: Any, optimizer: Any, batch: Dict[str, Any]) -> float:
        """One train step (forward, label-smoothed cross entropy, backward, Adam); its time in ms.

        Gradients are dropped after the update, so that idle models hold weights and Adam state only.
        """
        import torch
        from fairseq.criterions.label_smoothed_cross_entropy import label_smoothed_nll_loss

        pad = self.dictionary.pad()
        if self.on_cuda:
            torch.cuda.synchronize()
        start = time.perf_counter()
        net_output = model(**batch["net_input"])
        lprobs = model.get_normalized_probs(net_output, log_probs=True)
        target = batch["target"]
        loss, _ = label_smoothed_nll_loss(lprobs.view(-1, lprobs.size(-1)), target.view(-1),
                                          LABEL_SMOOTHING, ignore_index=pad)
        loss = loss / target.ne(pad).sum()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if self.on_cuda:
            torch.cuda.synchronize()
        elapsed_ms = (time.perf_counter() - start) * 1000
        if not math.isfinite(loss.item()):
            raise FloatingPointError(f"loss is {loss.item()}")
        return elapsed_ms

    def memory(self) -> Dict[str, Any]:
        """Peak memory (MB above the state before the model is built) of ``variants[0]`` alone, over
        a step on the first batch (which allocates the Adam state) and one on the largest batch."""
        import fairseq
        import torch

        if self.on_cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            before = torch.cuda.memory_allocated() / 2**20
        else:
            before = peak_rss_mb()
        model, optimizer, args = self.build(self.spec.variants[0])
        largest = max(self.batches,
                      key=lambda batch: batch["net_input"]["src_tokens"].numel() + batch["target"].numel())
        for batch in (self.batches[0], largest):
            self.step(model, optimizer, batch)
        peak = torch.cuda.max_memory_allocated() / 2**20 if self.on_cuda else peak_rss_mb()
        return {
            "peak_mb": peak - before,
            "params": sum(p.numel() for p in model.parameters()),
            "digest": self.digest,
            "batch_shapes": self.batch_shapes,
            "device": torch.cuda.get_device_name(self.device) if self.on_cuda else "cpu",
            "threads": torch.get_num_threads(),
            "torch": torch.__version__,
            "fairseq": fairseq.__version__,
            "sizes": {
                "embed": args.encoder_embed_dim, "ffn": args.encoder_ffn_embed_dim,
                "encoder_layers": args.encoder_layers, "decoder_layers": args.decoder_layers,
                "heads": args.encoder_attention_heads,
            },
        }

    def timing(self) -> Dict[str, Any]:
        """Step times of every variant, run round-robin: one step each per batch, order rotated."""
        models = [(variant.name, *self.build(variant)[:2]) for variant in self.spec.variants]
        step_ms: Dict[str, List[float]] = {name: [] for name, _, _ in models}
        for index, batch in enumerate(self.batches):
            shift = index % len(models)
            for name, model, optimizer in models[shift:] + models[:shift]:
                elapsed_ms = self.step(model, optimizer, batch)
                if index >= self.spec.warmup:
                    step_ms[name].append(elapsed_ms)
        return {"step_ms": step_ms, "digest": self.digest}


def worker_main(spec_json: str) -> None:
    spec = WorkerSpec.from_json(spec_json)
    worker = Worker(spec)
    result = worker.memory() if spec.mode == "memory" else worker.timing()
    print(RESULT_MARKER + json.dumps(result), flush=True)


# ----------------------------------------------------------------------------------------- parent
def measure(spec: WorkerSpec) -> Dict[str, Any]:
    """Run one worker subprocess; raise ``RuntimeError`` carrying its stderr if it fails."""
    command = [sys.executable, str(Path(__file__).resolve()), "--worker", spec.to_json()]
    env = {**os.environ, **MEMORY_WORKER_ENV} if spec.mode == "memory" else None
    completed = subprocess.run(command, capture_output=True, text=True, cwd=REPO_ROOT, env=env)
    for line in reversed(completed.stdout.splitlines()):
        if completed.returncode == 0 and line.startswith(RESULT_MARKER):
            return json.loads(line[len(RESULT_MARKER):])
    raise RuntimeError(completed.stderr.strip() or f"worker exited with status {completed.returncode}")


class Runner:
    """Runs the workers of every group in order and logs progress."""

    def __init__(self, cli: argparse.Namespace, variants: Sequence[Variant], groups: int):
        self.cli = cli
        self.variants = list(variants)
        self.done = 0
        self.total = groups * (len(self.variants) + 3)  # memory runs (vanilla twice) + timing

    def spec(self, group: Group, mode: str, variants: Sequence[Variant]) -> WorkerSpec:
        cli = self.cli
        return WorkerSpec(mode=mode, variants=tuple(variants), size_flags=size_flags(cli),
                          max_positions=group.max_positions, shape=group.shape,
                          vocab_size=cli.vocab_size, warmup=cli.warmup, steps=cli.steps,
                          seed=cli.seed, cpu=cli.cpu, threads=cli.threads)

    def run(self, group: Group, mode: str, variants: Sequence[Variant],
            what: str) -> Optional[Dict[str, Any]]:
        self.done += 1
        logger.info("[%d/%d] %s: %s", self.done, self.total, group.title, what)
        try:
            result = measure(self.spec(group, mode, variants))
        except RuntimeError as error:
            logger.error("%s (%s) crashed:\n%s", what, group.title, error)
            group.failures[variants[0].name if mode == "memory" else "timing"] = str(error).splitlines()[-1]
            return None
        group.digests.add(result["digest"])
        return result

    def run_group(self, group: Group) -> None:
        """Memory of vanilla, of every variant and of vanilla again; then the timing of all."""
        for variant in (VANILLA, *self.variants, VANILLA):
            result = self.run(group, "memory", [variant],
                              f"memory of {variant.label} {' '.join(variant.flags)}".rstrip())
            if result is not None:
                group.memory.setdefault(variant.name, []).append(result)
                logger.info("    peak %.0f MB", result["peak_mb"])
        if VANILLA.name not in group.memory:
            return
        runnable = [VANILLA, *(v for v in self.variants if v.name in group.memory)]
        result = self.run(group, "timing", runnable, f"timing of {len(runnable)} models, round-robin")
        if result is not None:
            group.timing = result["step_ms"]
        if len(group.digests) > 1:
            raise RuntimeError(f"{group.title}: the workers saw different batches ({sorted(group.digests)})")


def flags_cell(variant: Variant) -> str:
    if variant.flags:
        return "`" + " ".join(variant.flags) + "`"
    return f"`--arch {variant.arch}`"


def time_cells(group: Group, name: str) -> Tuple[str, str]:
    """Median step time and median per-round ratio to vanilla of ``name``, as table cells."""
    if name not in group.timing or VANILLA.name not in group.timing:
        return "not timed", ""
    times, reference = group.timing[name], group.timing[VANILLA.name]
    ratio = statistics.median(t / r for t, r in zip(times, reference))
    return f"{statistics.median(times):.0f}", f"{ratio:.2f}"


def group_rows(group: Group, variants: Sequence[Variant]) -> Tuple[List[str], str]:
    """The table rows of one group and a line on its baseline's noise."""
    rows = []
    for variant in (VANILLA, *variants):
        if variant.name not in group.memory:
            rows.append(f"| {variant.label} | {flags_cell(variant)} | crashed: "
                        f"{group.failures[variant.name]} | | | |")
            continue
        mb = statistics.mean(r["peak_mb"] for r in group.memory[variant.name])
        ms, time_ratio = time_cells(group, variant.name)
        memory_ratio = ""
        if VANILLA.name in group.memory:
            memory_ratio = f"{mb / statistics.mean(r['peak_mb'] for r in group.memory[VANILLA.name]):.2f}"
        rows.append(f"| {variant.label} | {flags_cell(variant)} | {ms} | {time_ratio} | {mb:.0f} "
                    f"| {memory_ratio} |")
    if VANILLA.name not in group.memory:
        return rows, "crashed, so nothing was timed"

    noise = "peak memory of the first / last run " + " / ".join(
        f"{r['peak_mb']:.0f} MB" for r in group.memory[VANILLA.name])
    if VANILLA.name in group.timing:
        times = group.timing[VANILLA.name]
        median = statistics.median(times)
        noise += f"; step time {min(times):.0f}-{max(times):.0f} ms over the {len(times)} rounds"
        if (max(times) - min(times)) / median > NOISE_WARNING:
            noise += (" (the machine's load varied: trust the ratios, medians of paired steps, "
                      "over the times)")
    else:
        noise += f"; timing crashed: {group.failures.get('timing', '')}"
    return rows, noise


def cpu_name() -> str:
    """``platform.processor()``, or the model name of ``/proc/cpuinfo`` where that is empty."""
    name = platform.processor()
    cpuinfo = Path("/proc/cpuinfo")
    if not name and cpuinfo.exists():
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                name = line.split(":", 1)[1].strip()
                break
    return f"{name or 'unknown CPU'} ({platform.machine()})"


def render(groups: Sequence[Group], variants: Sequence[Variant], cli: argparse.Namespace,
           load: Tuple[float, float]) -> str:
    """The report: header lines and one markdown table with a row group per batch shape.

    ``load`` is the 1-minute load average at the start and at the end of the run."""
    sample = next((runs[0] for g in groups for runs in g.memory.values()), None)
    if sample is None:
        return "Every run crashed; see the log above.\n"
    sizes = sample["sizes"]
    vanilla = next((g.memory[VANILLA.name][0] for g in groups if VANILLA.name in g.memory), sample)
    memory_method = (
        "torch.cuda.max_memory_allocated() minus the memory allocated before the model is built"
        if sample["device"] != "cpu" else
        "growth of the peak RSS (getrusage ru_maxrss) from just before the model is built to the end "
        "of the second step (weights, gradients, Adam state, activations), with "
        "MALLOC_MMAP_THRESHOLD_=65536 so that glibc returns freed tensors at once"
    )
    lines = [
        "# transformer_posattn vs fairseq transformer: train-step time and peak memory",
        "",
        f"- Machine: {cpu_name()}, {os.cpu_count()} CPUs, {sample['threads']} torch threads, "
        f"device {sample['device']}; torch {sample['torch']}, fairseq {sample['fairseq']}, "
        f"Python {platform.python_version()}; 1-minute load average {load[0]:.1f} at the start, "
        f"{load[1]:.1f} at the end.",
        f"- Models: `{VANILLA_ARCH}` vs `{POSATTN_ARCH}` (the flags below are on the latter), embed "
        f"{sizes['embed']}, FFN {sizes['ffn']}, {sizes['encoder_layers']}+{sizes['decoder_layers']} "
        f"layers, {sizes['heads']} heads, vocabulary {cli.vocab_size}, dropout 0.1; "
        f"vanilla {vanilla['params'] / 1e6:.1f}M parameters.",
        f"- Step: forward + label-smoothed cross entropy (eps {LABEL_SMOOTHING}) + backward + Adam, "
        "on the same batches for every model (checked by hash).",
        f"- Time: one process runs every model of a group round-robin, one step each per batch, order "
        f"rotated per round; warm-up rounds: {cli.warmup}, then timed rounds: {cli.steps} "
        "(time.perf_counter). Step time: median over the rounds; time ratio: median over the rounds "
        "of the step time over vanilla's in the same round.",
        f"- Peak memory: each model alone in a fresh process, two steps (the first batch, then the "
        f"largest, with the Adam state in place), {memory_method}; vanilla runs first and last, its "
        "row is their mean.",
    ]
    for group in groups:
        shapes = next((runs[0]["batch_shapes"] for runs in group.memory.values()), [])
        seen = sorted({f"{b} x {t}" for b, t in shapes})
        lines.append(f"- {group.title}: {group.shape.describe()} (source batches of "
                     f"{', '.join(seen) or 'none'} tokens), "
                     f"--max-source/target-positions {group.max_positions}.")
    lines += ["", "| variant | flags | step time (ms) | time ratio | peak memory (MB) | memory ratio |",
              "|---|---|---:|---:|---:|---:|"]
    notes = []
    for group in groups:
        rows, noise = group_rows(group, variants)
        lines.append(f"| **{group.title}** | | | | | |")
        lines += rows
        notes.append(f"- Baseline, {group.title}: {noise}.")
    return "\n".join(lines + [""] + notes) + "\n"


def size_flags(cli: argparse.Namespace) -> Tuple[str, ...]:
    """fairseq flags overriding the iwslt preset's sizes, for the options the user gave."""
    overrides = {
        ("--encoder-layers", "--decoder-layers"): cli.layers,
        ("--encoder-embed-dim", "--decoder-embed-dim"): cli.embed_dim,
        ("--encoder-ffn-embed-dim", "--decoder-ffn-embed-dim"): cli.ffn_dim,
        ("--encoder-attention-heads", "--decoder-attention-heads"): cli.heads,
    }
    flags: List[str] = []
    for names, value in overrides.items():
        if value is not None:
            for name in names:
                flags += [name, str(value)]
    return tuple(flags)


def parse_cli(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add = parser.add_argument
    add("--variants", nargs="+", choices=list(VARIANTS_BY_NAME), metavar="NAME",
        help="variants to measure, default all (the vanilla baseline always runs): "
        + ", ".join(VARIANTS_BY_NAME))
    add("--steps", type=int, default=10, help="timed steps (rounds) per model (default: %(default)s)")
    add("--warmup", type=int, default=2, help="untimed steps before them (default: %(default)s)")
    add("--layers", type=int, help="encoder and decoder layers (preset: 6)")
    add("--embed-dim", type=int, help="encoder and decoder embedding size (preset: 512)")
    add("--ffn-dim", type=int, help="encoder and decoder FFN size (preset: 1024)")
    add("--heads", type=int, help="encoder and decoder attention heads (preset: 4)")
    add("--vocab-size", type=int, default=8000, help="joined dictionary size (default: %(default)s)")
    add("--max-tokens", type=int, default=4096, help="padded tokens per batch (default: %(default)s)")
    add("--min-len", type=int, default=20, help="shortest sentence, EOS included (default: %(default)s)")
    add("--max-len", type=int, default=60, help="longest sentence, EOS included (default: %(default)s)")
    add("--max-positions", type=int, default=128,
        help="--max-source-positions and --max-target-positions (default: %(default)s)")
    add("--long", action="store_true",
        help=f"add a row group at sequence length {LONG_LENGTH} (max positions {LONG_LENGTH})")
    add("--long-batch-size", type=int, default=4,
        help=f"sentence pairs of {LONG_LENGTH} tokens per batch in the --long group (default: %(default)s)")
    add("--seed", type=int, default=1, help="seed of the batches and the weights (default: %(default)s)")
    add("--cpu", action="store_true", help="stay on the CPU even if CUDA is available")
    add("--threads", type=int,
        help="torch intra-op threads of the workers (default: torch's choice); 1 is steadier on a "
        "machine that other jobs share")
    add("--output", type=Path, help="also write the markdown report to this file")
    add("--worker", metavar="SPEC_JSON", help=argparse.SUPPRESS)
    cli = parser.parse_args(argv)
    if cli.steps < 1 or cli.warmup < 0 or (cli.threads is not None and cli.threads < 1):
        parser.error("--steps and --threads must be >= 1, --warmup >= 0")
    if not 2 <= cli.min_len <= cli.max_len <= cli.max_positions:
        parser.error("need 2 <= --min-len <= --max-len <= --max-positions")
    return cli


def main(argv: Optional[Sequence[str]] = None) -> int:
    cli = parse_cli(argv)
    if cli.worker is not None:
        worker_main(cli.worker)
        return 0
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    variants = [VARIANTS_BY_NAME[name] for name in dict.fromkeys(cli.variants or VARIANTS_BY_NAME)]
    groups = [Group(f"Multi30k-like, lengths {cli.min_len}-{cli.max_len}",
                    BatchShape(cli.min_len, cli.max_len, cli.max_tokens), cli.max_positions)]
    if cli.long:
        groups.append(Group(f"sequence length {LONG_LENGTH}",
                            BatchShape(LONG_LENGTH, LONG_LENGTH, cli.long_batch_size * LONG_LENGTH),
                            LONG_LENGTH))
    load_start = os.getloadavg()[0]
    runner = Runner(cli, variants, len(groups))
    for group in groups:
        runner.run_group(group)

    report = render(groups, variants, cli, (load_start, os.getloadavg()[0]))
    print(report, end="")
    if cli.output is not None:
        cli.output.parent.mkdir(parents=True, exist_ok=True)
        cli.output.write_text(report)
        logger.info("report written to %s", cli.output)
    return 1 if any(group.failures for group in groups) else 0


if __name__ == "__main__":
    sys.exit(main())
