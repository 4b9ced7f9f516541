#!/usr/bin/env python
"""Train-step time, peak memory and beam-search speed of ``transformer_posattn`` against fairseq's
``transformer``.

For every position variant (SPEC.md sections 1-6) the script builds the model in-process with
fairseq's own machinery (``options.get_training_parser`` + ``parse_args_and_arch`` with
``--user-dir fairseq_posattn``, then ``ARCH_MODEL_REGISTRY[arch].build_model``), trains it for a few
steps on synthetic Multi30k-like batches and reports its step time and peak memory, both also as a
ratio to vanilla fairseq ``transformer_iwslt_de_en`` of the same size on the same batches.

Structural variants (Wang et al. 2019, SPEC.md section 6) read ``src_structure`` (depth, tin, tout
per source token, as ``--task translation_structural`` collates it). Every source sentence of m BPE
pieces gets the side data of a forest of real UD English-EWT trees (``--conllu``) of about
m / 1.5 words, the pieces spread over the words as subwords; it is computed once per process with
:func:`~fairseq_posattn.structure.side_data.token_side_data`, outside every timed region (the parse
and the prepare step are not timed here: ``--skip-prepare`` aside, the report adds the prepare
throughput of ``scripts/benchmark_structure.py``).

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
3. Decoding: one process builds vanilla and the ``--decode-variants`` in eval mode and runs fairseq's
   ``SequenceGenerator`` (beam 5 and fairseq-generate's other defaults) round-robin on the same
   source batches of ``--decode-batch-size`` sentences, as ``fairseq-generate`` calls it
   (``net_input`` goes to the encoder, ``src_structure`` included for structural models). The
   models are untrained, so every hypothesis is forced to ``--decode-length`` tokens plus EOS
   (``min_len = max_len_b = --decode-length``, ``max_len_a = 0``): every model runs the same number
   of decoder steps on the same number of hypotheses. Speed ratio: median over the rounds of
   vanilla's time over the model's (above 1 is faster than vanilla).

Usage::

    python scripts/benchmark.py                           # all variants, iwslt sizes, 2+2 layers
    python scripts/benchmark.py --layers 6 --steps 10     # the iwslt preset's 6+6 layers
    python scripts/benchmark.py --variants san-p da rpr --decode-variants --output bench.md
    python scripts/benchmark.py --long                    # also a group at sequence length 512
    python scripts/benchmark.py --variants struct-abs --decode-variants struct-abs struct-rel
"""

import argparse
import bisect
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
EWT_DEV = REPO_ROOT.parent / "shared" / "data" / "ud_english_ewt" / "en_ewt-ud-dev.conllu"
EWT_SAMPLE = REPO_ROOT / "data" / "ud_ewt_sample" / "en_ewt-ud-dev.sample.conllu"
#: BPE pieces per word of the synthetic structural sources (EWT with 2,000 merges: about 1.5)
PIECES_PER_WORD = 1.5
BEAM_SIZE = 5
STRUCTURE_BENCHMARK = REPO_ROOT / "scripts" / "benchmark_structure.py"
#: the prepare throughput that the structural pipeline should reach, sentences/s on one core
PREPARE_TARGET = 20_000
#: the row of ``scripts/benchmark_structure.py`` that the target applies to: what
#: ``posattn-prepare-structure`` runs per sentence
PREPARE_STEP = "align + side data + binarize"

logger = logging.getLogger("benchmark")


@dataclass(frozen=True)
class Variant:
    """One model configuration: a key for ``--variants``, a paper-style label and its flags."""

    name: str
    label: str
    flags: Tuple[str, ...] = ()
    arch: str = POSATTN_ARCH

    @property
    def structural(self) -> bool:
        """True when the model reads the source's structural side data (``src_structure``)."""
        return "--encoder-structural-positions" in self.flags


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
    Variant("struct-abs", "Structural abs (add)", ("--encoder-structural-positions", "absolute")),
    Variant("struct-abs-nonlinear", "Structural abs (nonlinear)",
            ("--encoder-structural-positions", "absolute", "--encoder-structural-fusion", "nonlinear")),
    Variant("struct-rel", "Structural rel (r=16)", ("--encoder-structural-positions", "relative")),
    Variant("struct-both", "Structural abs + rel", ("--encoder-structural-positions", "both")),
)
VARIANTS_BY_NAME: Dict[str, Variant] = {v.name: v for v in POSATTN_VARIANTS}
DEFAULT_DECODE_VARIANTS = ("struct-abs", "struct-rel", "struct-both", "dec-san-p-r", "da")


@dataclass(frozen=True)
class Target:
    """Performance targets of a variant: largest time and memory ratios, smallest speed ratio."""

    time: Optional[float] = None
    memory: Optional[float] = None
    speed: Optional[float] = None


TARGETS: Dict[str, Target] = {
    "struct-abs": Target(time=1.10, memory=1.10, speed=0.90),
    "struct-abs-nonlinear": Target(time=1.10, memory=1.10, speed=0.90),
    "struct-rel": Target(time=1.35, memory=1.25, speed=0.90),
    "struct-both": Target(time=1.35, memory=1.25, speed=0.90),
}


@dataclass(frozen=True)
class BatchShape:
    """Synthetic batches: lengths (EOS included) uniform in [min_len, max_len], as many sentence
    pairs per batch as fit in ``max_tokens`` padded tokens (fairseq's ``--max-tokens`` rule), and
    at most ``max_sentences`` of them when that is positive (``--batch-size``)."""

    min_len: int
    max_len: int
    max_tokens: int
    max_sentences: int = 0

    def describe(self) -> str:
        if self.min_len == self.max_len:
            rows = self.max_tokens // self.max_len
            if self.max_sentences:
                rows = min(rows, self.max_sentences)
            return f"{rows} x {self.max_len} tokens per batch"
        limit = f" and {self.max_sentences} sentences" if self.max_sentences else ""
        return (f"up to {self.max_tokens} padded tokens{limit} per batch, source and target lengths "
                f"uniform in [{self.min_len}, {self.max_len}]")

    def sentences(self, max_sentences: int) -> "BatchShape":
        """The same lengths, at most ``max_sentences`` sentences per batch."""
        return BatchShape(self.min_len, self.max_len, self.max_tokens, max_sentences)


@dataclass(frozen=True)
class WorkerSpec:
    """What one worker subprocess measures (sent as JSON): ``memory`` of ``variants[0]`` alone,
    or the round-robin ``timing`` (train steps) or ``decoding`` (beam search, hypotheses of
    ``decode_length`` tokens) of all ``variants`` (the first one is the reference). ``conllu``:
    the trees of the structural side data."""

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
    conllu: str
    decode_length: int

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
    decoding: Dict[str, List[float]] = field(default_factory=dict)
    decode_sentences: List[int] = field(default_factory=list)
    decode_shapes: List[List[int]] = field(default_factory=list)
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
        while not shape.max_sentences or len(pairs) < shape.max_sentences:
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


def load_trees(path: str) -> List[List[int]]:
    """The CoNLL-U heads of every sentence of ``path``, fewest words first."""
    from fairseq_posattn.structure.conllu_io import read_conllu

    return sorted((sentence.heads for sentence in read_conllu(path)), key=len)


def forest_side_data(tokens: int, trees: Sequence[List[int]], sizes: Sequence[int], rng: Any) -> Any:
    """``(3, tokens)`` side data (depth, tin, tout) of a source of ``tokens - 1`` pieces and EOS.

    The parse is a forest of random ``trees`` (sorted by ``sizes``, their word counts) of about
    ``pieces / PIECES_PER_WORD`` words in all, drawn one by one among those that still fit; every
    word gets one piece and random words one more each (their subwords) until the pieces are used.
    """
    import numpy as np
    from fairseq_posattn.structure.side_data import token_side_data

    pieces = tokens - 1
    room = max(1, round(pieces / PIECES_PER_WORD))
    heads: List[int] = []
    while (fitting := bisect.bisect_right(sizes, room)) > 0:
        tree = trees[int(rng.integers(fitting))]
        heads += [head + len(heads) if head else 0 for head in tree]
        room -= len(tree)
    if not heads:
        raise ValueError(f"no tree of at most {room} words for a source of {pieces} pieces: use a "
                         "--conllu with shorter sentences, or a larger --min-len")
    extra = rng.integers(len(heads), size=pieces - len(heads))
    return token_side_data(heads, np.sort(np.concatenate([np.arange(len(heads)), extra])))


def add_structure(batches: Sequence[Dict[str, Any]], trees: Sequence[List[int]], seed: int) -> None:
    """Put ``src_structure`` ``(batch, 3, src_len)`` into every batch's ``net_input``, collated as
    ``--task translation_structural`` does (left-padded like the source, batch order)."""
    import numpy as np
    import torch
    from fairseq_posattn.data.structural_dataset import collate_structure

    rng = np.random.default_rng(seed)
    sizes = [len(tree) for tree in trees]
    for batch in batches:
        net_input = batch["net_input"]
        sides = [torch.from_numpy(forest_side_data(int(n), trees, sizes, rng)).long()
                 for n in net_input["src_lengths"]]
        net_input["src_structure"] = collate_structure(sides, net_input["src_tokens"], left_pad=True)


def model_input(variant: Variant, net_input: Dict[str, Any]) -> Dict[str, Any]:
    """``net_input`` as ``variant``'s model takes it: ``src_structure`` for structural models only."""
    if variant.structural:
        return net_input
    return {key: value for key, value in net_input.items() if key != "src_structure"}


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
        add_structure(batches, load_trees(spec.conllu), spec.seed)
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

    def synchronize(self) -> None:
        """Wait for the GPU's queued work (nothing to wait for on the CPU)."""
        import torch

        if self.on_cuda:
            torch.cuda.synchronize()

    def build(self, variant: Variant) -> Tuple[Any, Any, argparse.Namespace]:
        """Model, Adam optimizer and parsed args of ``variant``, built as ``fairseq-train`` does."""
        import torch
        from fairseq import options
        from fairseq.models import ARCH_MODEL_REGISTRY

        class Task:
            """What ``build_model`` reads from ``--task translation`` (``translation_structural``
            for structural variants: it provides the parse)."""

            source_dictionary = self.dictionary
            target_dictionary = self.dictionary
            provides_structure = variant.structural

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

    def step(self, variant: Variant, model: Any, optimizer: Any, batch: Dict[str, Any]) -> float:
        """One train step (forward, label-smoothed cross entropy, backward, Adam); its time in ms.

        Gradients are dropped after the update, so that idle models hold weights and Adam state only.
        """
        from fairseq.criterions.label_smoothed_cross_entropy import label_smoothed_nll_loss

        pad = self.dictionary.pad()
        net_input = model_input(variant, batch["net_input"])
        self.synchronize()
        start = time.perf_counter()
        net_output = model(**net_input)
        lprobs = model.get_normalized_probs(net_output, log_probs=True)
        target = batch["target"]
        loss, _ = label_smoothed_nll_loss(lprobs.view(-1, lprobs.size(-1)), target.view(-1),
                                          LABEL_SMOOTHING, ignore_index=pad)
        loss = loss / target.ne(pad).sum()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        self.synchronize()
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
        variant = self.spec.variants[0]
        model, optimizer, args = self.build(variant)
        largest = max(self.batches,
                      key=lambda batch: batch["net_input"]["src_tokens"].numel() + batch["target"].numel())
        for batch in (self.batches[0], largest):
            self.step(variant, model, optimizer, batch)
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
        models = [(variant, *self.build(variant)[:2]) for variant in self.spec.variants]
        step_ms: Dict[str, List[float]] = {variant.name: [] for variant in self.spec.variants}
        for index, batch in enumerate(self.batches):
            shift = index % len(models)
            for variant, model, optimizer in models[shift:] + models[:shift]:
                elapsed_ms = self.step(variant, model, optimizer, batch)
                if index >= self.spec.warmup:
                    step_ms[variant.name].append(elapsed_ms)
        return {"step_ms": step_ms, "digest": self.digest}

    def decode(self, variant: Variant, model: Any, generator: Any, batch: Dict[str, Any]) -> float:
        """Beam search on one batch, as ``fairseq-generate`` runs it; its time in ms."""
        self.synchronize()
        start = time.perf_counter()
        hypotheses = generator.generate([model], {"net_input": model_input(variant, batch["net_input"])})
        self.synchronize()
        elapsed_ms = (time.perf_counter() - start) * 1000
        lengths = {h["tokens"].numel() for beam in hypotheses for h in beam}
        if lengths != {self.spec.decode_length + 1}:
            raise RuntimeError(f"{variant.name}: hypotheses of {sorted(lengths)} tokens, expected "
                               f"{self.spec.decode_length} and EOS")
        return elapsed_ms

    def decoding(self) -> Dict[str, Any]:
        """Beam-search times of every variant in eval mode, round-robin as in :meth:`timing`, with
        every hypothesis forced to ``decode_length`` tokens (``min_len = max_len_b``)."""
        from fairseq.sequence_generator import SequenceGenerator

        length = self.spec.decode_length
        models = []
        for variant in self.spec.variants:
            model = self.build(variant)[0].eval()
            generator = SequenceGenerator([model], self.dictionary, beam_size=BEAM_SIZE,
                                          max_len_a=0, max_len_b=length, min_len=length)
            models.append((variant, model, generator))
        decode_ms: Dict[str, List[float]] = {variant.name: [] for variant in self.spec.variants}
        for index, batch in enumerate(self.batches):
            shift = index % len(models)
            for variant, model, generator in models[shift:] + models[:shift]:
                elapsed_ms = self.decode(variant, model, generator, batch)
                if index >= self.spec.warmup:
                    decode_ms[variant.name].append(elapsed_ms)
        sentences = [len(b["net_input"]["src_tokens"]) for b in self.batches[self.spec.warmup:]]
        return {"decode_ms": decode_ms, "sentences": sentences, "batch_shapes": self.batch_shapes,
                "digest": self.digest}


def worker_main(spec_json: str) -> None:
    spec = WorkerSpec.from_json(spec_json)
    worker = Worker(spec)
    result = {"memory": worker.memory, "timing": worker.timing, "decoding": worker.decoding}[spec.mode]()
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


def measure_prepare(conllu: Path) -> Dict[str, Any]:
    """The structural prepare throughput of ``scripts/benchmark_structure.py`` (one thread, parse
    excluded) on ``conllu``; raise ``RuntimeError`` carrying its stderr if it fails."""
    command = [sys.executable, str(STRUCTURE_BENCHMARK), "--conllu", str(conllu), "--skip-parse", "--json"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    completed = subprocess.run(command, capture_output=True, text=True, cwd=REPO_ROOT, env=env)
    if completed.returncode != 0 or not completed.stdout.strip():
        raise RuntimeError(completed.stderr.strip() or f"exited with status {completed.returncode}")
    return json.loads(completed.stdout.strip().splitlines()[-1])


class Runner:
    """Runs the workers of every group in order and logs progress."""

    def __init__(self, cli: argparse.Namespace, variants: Sequence[Variant],
                 decode_variants: Sequence[Variant], groups: int):
        self.cli = cli
        self.variants = list(variants)
        self.decode_variants = list(decode_variants)
        self.done = 0
        # memory runs (vanilla twice), timing, decoding
        self.total = groups * (len(self.variants) + 3 + bool(self.decode_variants))

    def spec(self, group: Group, mode: str, variants: Sequence[Variant]) -> WorkerSpec:
        cli = self.cli
        decoding = mode == "decoding"
        return WorkerSpec(mode=mode, variants=tuple(variants), size_flags=size_flags(cli),
                          max_positions=group.max_positions,
                          shape=group.shape.sentences(cli.decode_batch_size) if decoding else group.shape,
                          vocab_size=cli.vocab_size, warmup=cli.warmup,
                          steps=cli.decode_rounds if decoding else cli.steps, seed=cli.seed,
                          cpu=cli.cpu, threads=cli.threads, conllu=str(cli.conllu),
                          decode_length=cli.decode_length)

    def run(self, group: Group, mode: str, variants: Sequence[Variant],
            what: str) -> Optional[Dict[str, Any]]:
        self.done += 1
        logger.info("[%d/%d] %s: %s", self.done, self.total, group.title, what)
        try:
            result = measure(self.spec(group, mode, variants))
        except RuntimeError as error:
            logger.error("%s (%s) crashed:\n%s", what, group.title, error)
            group.failures[variants[0].name if mode == "memory" else mode] = str(error).splitlines()[-1]
            return None
        if mode != "decoding":  # the decoding batches are smaller, and seen by one process only
            group.digests.add(result["digest"])
        return result

    def run_group(self, group: Group) -> None:
        """Memory of vanilla, of every variant and of vanilla again; then the timing of all; then
        the decoding speed of vanilla and the decoding variants."""
        for variant in (VANILLA, *self.variants, VANILLA):
            result = self.run(group, "memory", [variant],
                              f"memory of {variant.label} {' '.join(variant.flags)}".rstrip())
            if result is not None:
                group.memory.setdefault(variant.name, []).append(result)
                logger.info("    peak %.0f MB", result["peak_mb"])
        if VANILLA.name in group.memory:
            runnable = [VANILLA, *(v for v in self.variants if v.name in group.memory)]
            result = self.run(group, "timing", runnable, f"timing of {len(runnable)} models, round-robin")
            if result is not None:
                group.timing = result["step_ms"]
        if len(group.digests) > 1:
            raise RuntimeError(f"{group.title}: the workers saw different batches ({sorted(group.digests)})")
        if self.decode_variants:
            decoders = [VANILLA, *self.decode_variants]
            result = self.run(group, "decoding", decoders,
                              f"beam search of {len(decoders)} models, round-robin")
            if result is not None:
                group.decoding = result["decode_ms"]
                group.decode_sentences = result["sentences"]
                group.decode_shapes = result["batch_shapes"]


def flags_cell(variant: Variant) -> str:
    if variant.flags:
        return "`" + " ".join(variant.flags) + "`"
    return f"`--arch {variant.arch}`"


def time_ratio(group: Group, name: str) -> Optional[float]:
    """Median over the rounds of ``name``'s step time over vanilla's; None if either was not timed."""
    if name not in group.timing or VANILLA.name not in group.timing:
        return None
    return statistics.median(t / r for t, r in zip(group.timing[name], group.timing[VANILLA.name]))


def peak_mb(group: Group, name: str) -> Optional[float]:
    """Mean peak memory of ``name``'s memory runs; None if it crashed."""
    if name not in group.memory:
        return None
    return statistics.mean(run["peak_mb"] for run in group.memory[name])


def memory_ratio(group: Group, name: str) -> Optional[float]:
    mb, reference = peak_mb(group, name), peak_mb(group, VANILLA.name)
    return None if mb is None or reference is None else mb / reference


def speed_ratio(group: Group, name: str) -> Optional[float]:
    """Median over the rounds of vanilla's decoding time over ``name``'s (above 1: faster)."""
    if name not in group.decoding or VANILLA.name not in group.decoding:
        return None
    return statistics.median(r / t for t, r in zip(group.decoding[name], group.decoding[VANILLA.name]))


def ratio_cell(ratio: Optional[float]) -> str:
    return "" if ratio is None else f"{ratio:.2f}"


def group_rows(group: Group, variants: Sequence[Variant]) -> Tuple[List[str], str]:
    """The train-step table rows of one group and a line on its baseline's noise."""
    rows = []
    for variant in (VANILLA, *variants):
        mb = peak_mb(group, variant.name)
        if mb is None:
            rows.append(f"| {variant.label} | {flags_cell(variant)} | crashed: "
                        f"{group.failures[variant.name]} | | | |")
            continue
        times = group.timing.get(variant.name)
        ms = f"{statistics.median(times):.0f}" if times else "not timed"
        rows.append(f"| {variant.label} | {flags_cell(variant)} | {ms} | "
                    f"{ratio_cell(time_ratio(group, variant.name))} | {mb:.0f} "
                    f"| {ratio_cell(memory_ratio(group, variant.name))} |")
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


def decode_rows(group: Group, variants: Sequence[Variant]) -> List[str]:
    """The decoding table rows of one group: sentences per second and speed ratio."""
    if not group.decoding:
        return [f"| {VANILLA.label} | {flags_cell(VANILLA)} | crashed: "
                f"{group.failures.get('decoding', '')} | |"]
    sentences = sum(group.decode_sentences)
    rows = []
    for variant in (VANILLA, *variants):
        rate = sentences / (sum(group.decoding[variant.name]) / 1000)
        rows.append(f"| {variant.label} | {flags_cell(variant)} | {rate:.1f} | "
                    f"{ratio_cell(speed_ratio(group, variant.name))} |")
    return rows


def target_lines(groups: Sequence[Group], prepare: Optional[Dict[str, Any]]) -> List[str]:
    """One line per measured (group, variant with a target), and one for the prepare step."""
    checks = (("time ratio", time_ratio, "time", "<="), ("memory ratio", memory_ratio, "memory", "<="),
              ("speed ratio", speed_ratio, "speed", ">="))
    lines = []
    for group in groups:
        for name, target in TARGETS.items():
            results = []
            for label, ratio_of, attribute, sign in checks:
                bound, ratio = getattr(target, attribute), ratio_of(group, name)
                if bound is None or ratio is None:
                    continue
                met = round(ratio, 2) <= bound if sign == "<=" else round(ratio, 2) >= bound
                results.append(f"{label} {ratio:.2f} ({sign} {bound:.2f}: {'met' if met else 'MISSED'})")
            if results:
                lines.append(f"- {VARIANTS_BY_NAME[name].label}, {group.title}: {'; '.join(results)}.")
    if prepare is not None:
        rate = prepare["rates"][PREPARE_STEP]
        met = rate >= PREPARE_TARGET
        lines.append(f"- Structural prepare ({PREPARE_STEP}): {rate:,.0f} sentences/s on one core "
                     f"(>= {PREPARE_TARGET:,}: {'met' if met else 'MISSED'}).")
    return lines


def prepare_lines(prepare: Dict[str, Any]) -> List[str]:
    """The structural prepare section: the source and a table of sentences per second."""
    lines = [
        "", "**Structural prepare** (`scripts/benchmark_structure.py --skip-parse`: one process, "
        f"one thread, the best of {prepare['repeat']} runs, the parse excluded) on "
        f"`{display_path(prepare['conllu'])}`: {prepare['sentences']} sentences, "
        f"{prepare['pieces_per_sentence']:.1f} BPE pieces per sentence ({prepare['bpe_merges']} "
        "merges learned on its words).",
        "", "| step | sentences/s (one core) |", "|---|---:|",
    ]
    lines += [f"| {step} | {rate:,.0f} |" for step, rate in prepare["rates"].items()]
    return lines


def display_path(path: str) -> str:
    """``path`` relative to the repository when it lies inside it (or beside it, in ``../``)."""
    resolved = Path(path).resolve()
    for base, prefix in ((REPO_ROOT, ""), (REPO_ROOT.parent, "../")):
        if resolved.is_relative_to(base):
            return prefix + str(resolved.relative_to(base))
    return str(path)


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


def header_lines(groups: Sequence[Group], cli: argparse.Namespace, load: Tuple[float, float],
                 sample: Dict[str, Any]) -> List[str]:
    """The report's title and its lines on the machine, the models, the method and the batches."""
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
        "# transformer_posattn vs fairseq transformer: train step, peak memory, beam search",
        "",
        f"- Machine: {cpu_name()}, {os.cpu_count()} CPUs, {sample['threads']} torch threads, "
        f"device {sample['device']}; torch {sample['torch']}, fairseq {sample['fairseq']}, "
        f"Python {platform.python_version()}; 1-minute load average {load[0]:.1f} at the start, "
        f"{load[1]:.1f} at the end.",
        f"- Models: `{VANILLA_ARCH}` vs `{POSATTN_ARCH}` (the flags below are on the latter), embed "
        f"{sizes['embed']}, FFN {sizes['ffn']}, {sizes['encoder_layers']}+{sizes['decoder_layers']} "
        f"layers, {sizes['heads']} heads, vocabulary {cli.vocab_size}, dropout 0.1; "
        f"vanilla {vanilla['params'] / 1e6:.1f}M parameters.",
        f"- Structural side data: each source of m BPE pieces gets a forest of real UD EWT trees "
        f"(`{display_path(str(cli.conllu))}`) of about m / {PIECES_PER_WORD} words, the extra pieces "
        "as subwords of random words; depth, tin and tout per token as `--task translation_structural` "
        "collates them, computed once per process outside every timed region.",
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
    if cli.decode_variants:
        lines.append(
            f"- Decoding: fairseq's SequenceGenerator as fairseq-generate builds it (beam {BEAM_SIZE}, "
            "length penalty 1, normalized scores), eval mode, the source's `net_input` to the encoder; "
            f"untrained models, so every hypothesis is forced to {cli.decode_length} tokens + EOS "
            f"(min_len = max_len_b = {cli.decode_length}, max_len_a = 0) and every model decodes the "
            f"same number of steps; one process, round-robin as above, warm-up rounds: {cli.warmup}, "
            f"timed rounds: {cli.decode_rounds}. Sentences/s: the timed rounds' sentences over their "
            "summed time; speed ratio: median over the rounds of vanilla's time over the model's (above "
            "1 is faster).")
    for group in groups:
        shapes = next((runs[0]["batch_shapes"] for runs in group.memory.values()), [])
        seen = sorted({f"{b} x {t}" for b, t in shapes})
        decoded = sorted({f"{b} x {t}" for b, t in group.decode_shapes})
        decoding = f"; decoding: {', '.join(decoded) or 'none'}" if cli.decode_variants else ""
        lines.append(f"- {group.title}: {group.shape.describe()} (source batches of "
                     f"{', '.join(seen) or 'none'} tokens{decoding}), "
                     f"--max-source/target-positions {group.max_positions}.")
    return lines


def render(groups: Sequence[Group], variants: Sequence[Variant], decode_variants: Sequence[Variant],
           prepare: Optional[Dict[str, Any]], cli: argparse.Namespace, load: Tuple[float, float]) -> str:
    """The report: header lines, the train-step table and the decoding table with a row group per
    batch shape, the structural prepare table, the targets and the baselines' noise.

    ``load`` is the 1-minute load average at the start and at the end of the run."""
    sample = next((runs[0] for g in groups for runs in g.memory.values()), None)
    if sample is None:
        return "Every run crashed; see the log above.\n"
    lines = header_lines(groups, cli, load, sample)
    lines += ["", "**Train step**", "",
              "| variant | flags | step time (ms) | time ratio | peak memory (MB) | memory ratio |",
              "|---|---|---:|---:|---:|---:|"]
    notes = []
    for group in groups:
        rows, noise = group_rows(group, variants)
        lines.append(f"| **{group.title}** | | | | | |")
        lines += rows
        notes.append(f"- Baseline, {group.title}: {noise}.")
    if decode_variants:
        lines += ["", f"**Beam search** (beam {BEAM_SIZE}, {cli.decode_length} tokens + EOS per "
                  "hypothesis)", "", "| variant | flags | sentences/s | speed ratio |", "|---|---|---:|---:|"]
        for group in groups:
            lines.append(f"| **{group.title}** | | | |")
            lines += decode_rows(group, decode_variants)
    if prepare is not None:
        lines += prepare_lines(prepare)
    targets = target_lines(groups, prepare)
    if targets:
        lines += ["", "**Targets**", ""] + targets
    return "\n".join(lines + ["", "**Noise**", ""] + notes) + "\n"


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
        help="variants to train, default all (the vanilla baseline always runs): "
        + ", ".join(VARIANTS_BY_NAME))
    add("--decode-variants", nargs="*", choices=list(VARIANTS_BY_NAME), metavar="NAME",
        default=list(DEFAULT_DECODE_VARIANTS),
        help="variants whose beam-search speed is compared with vanilla's; the bare flag with no "
        "names: no decoding (default: %(default)s)")
    add("--steps", type=int, default=5, help="timed steps (rounds) per model (default: %(default)s)")
    add("--warmup", type=int, default=2, help="untimed steps (and decoding rounds) before them "
        "(default: %(default)s)")
    add("--layers", type=int, default=2,
        help="encoder and decoder layers (default: %(default)s, to keep a whole run short; 6 = the "
        "iwslt preset)")
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
    add("--decode-batch-size", type=int, default=16,
        help="source sentences per beam-search batch, at most (default: %(default)s)")
    add("--decode-length", type=int, default=20,
        help="tokens of every hypothesis, EOS excluded (default: %(default)s)")
    add("--decode-rounds", type=int, default=5, help="timed decoding rounds (default: %(default)s)")
    add("--conllu", type=Path, default=EWT_DEV if EWT_DEV.exists() else EWT_SAMPLE,
        help="CoNLL-U trees of the structural side data and of the prepare timing (default: UD EWT "
        "dev from ../shared, else the shipped sample)")
    add("--skip-prepare", action="store_true",
        help="leave out the structural prepare timing (scripts/benchmark_structure.py)")
    add("--seed", type=int, default=1, help="seed of the batches and the weights (default: %(default)s)")
    add("--cpu", action="store_true", help="stay on the CPU even if CUDA is available")
    add("--threads", type=int,
        help="torch intra-op threads of the workers (default: torch's choice); 1 is steadier on a "
        "machine that other jobs share")
    add("--output", type=Path, help="also write the markdown report to this file")
    add("--worker", metavar="SPEC_JSON", help=argparse.SUPPRESS)
    cli = parser.parse_args(argv)
    if min(cli.steps, cli.decode_rounds, cli.decode_batch_size) < 1 or cli.warmup < 0 or (
            cli.threads is not None and cli.threads < 1):
        parser.error("--steps, --decode-rounds, --decode-batch-size and --threads must be >= 1, "
                     "--warmup >= 0")
    if not 2 <= cli.min_len <= cli.max_len <= cli.max_positions:
        parser.error("need 2 <= --min-len <= --max-len <= --max-positions")
    if not 1 <= cli.decode_length < cli.max_positions:
        parser.error("need 1 <= --decode-length < --max-positions (fairseq decodes at most "
                     "--max-target-positions - 1 tokens)")
    return cli


def main(argv: Optional[Sequence[str]] = None) -> int:
    cli = parse_cli(argv)
    if cli.worker is not None:
        worker_main(cli.worker)
        return 0
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    variants = [VARIANTS_BY_NAME[name] for name in dict.fromkeys(cli.variants or VARIANTS_BY_NAME)]
    decode_variants = [VARIANTS_BY_NAME[name] for name in dict.fromkeys(cli.decode_variants)]
    groups = [Group(f"Multi30k-like, lengths {cli.min_len}-{cli.max_len}",
                    BatchShape(cli.min_len, cli.max_len, cli.max_tokens), cli.max_positions)]
    if cli.long:
        groups.append(Group(f"sequence length {LONG_LENGTH}",
                            BatchShape(LONG_LENGTH, LONG_LENGTH, cli.long_batch_size * LONG_LENGTH),
                            LONG_LENGTH))
    load_start = os.getloadavg()[0]
    runner = Runner(cli, variants, decode_variants, len(groups))
    for group in groups:
        runner.run_group(group)
    prepare = None
    if not cli.skip_prepare:
        logger.info("structural prepare throughput (scripts/benchmark_structure.py)")
        try:
            prepare = measure_prepare(cli.conllu)
        except RuntimeError as error:
            logger.error("the structural prepare timing crashed:\n%s", error)

    report = render(groups, variants, decode_variants, prepare, cli, (load_start, os.getloadavg()[0]))
    print(report, end="")
    if cli.output is not None:
        cli.output.parent.mkdir(parents=True, exist_ok=True)
        cli.output.write_text(report)
        logger.info("report written to %s", cli.output)
    crashed = any(group.failures for group in groups) or (prepare is None and not cli.skip_prepare)
    return 1 if crashed else 0


if __name__ == "__main__":
    sys.exit(main())
