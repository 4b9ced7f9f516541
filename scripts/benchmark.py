#!/usr/bin/env python
"""Train-step time, peak memory and beam-search speed of ``transformer_posattn`` against fairseq's
``transformer`` (and of ``transformer_lm_posattn`` against ``transformer_lm``).

For every position variant (docs/methods.md) the script builds the model in-process with
fairseq's own machinery (``options.get_training_parser`` + ``parse_args_and_arch`` with
``--user-dir fairseq_posattn``, then ``models.build_model`` on its hydra config, as fairseq-train
does), trains it for a few steps on synthetic Multi30k-like batches and reports its step time and
peak memory, both also as a ratio to vanilla fairseq ``transformer_iwslt_de_en`` of the same size on
the same batches. With ``--lm``, the ``lm-*`` variants (the causal terms alone) are
``transformer_lm_posattn`` models of the same sizes compared with fairseq's ``transformer_lm``, on
sentences of Multi30k-like lengths and on blocks of 512 tokens. Each ratio is checked against the
performance issue's bound for its kind of term (``TARGETS``).

Structural variants (Wang et al. 2019; docs/methods.md) read ``src_structure`` (depth, tin, tout
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
    python scripts/benchmark.py --long --lm --readme README.md   # what `make benchmark` runs
    python scripts/benchmark.py --long --profile conv2d rpr      # torch.profiler tables instead
    python scripts/benchmark.py --device cuda --variants san-p-r da   # on the GPU (default: cuda if present)
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
from typing import Any, Callable, Dict, List, Optional, Sequence, Set, Tuple

REPO_ROOT = Path(__file__).resolve().parent.parent
USER_DIR = REPO_ROOT / "fairseq_posattn"
VANILLA_ARCH = "transformer_iwslt_de_en"
POSATTN_ARCH = "transformer_posattn_iwslt_de_en"
VANILLA_LM_ARCH = "transformer_lm"
POSATTN_LM_ARCH = "transformer_lm_posattn"
TRANSLATION = "translation"
LANGUAGE_MODELING = "language_modeling"
RESULT_MARKER = "BENCHMARK_RESULT "
#: environment of the memory workers: glibc mmaps (and so returns at once) every block >= 64 KiB
MEMORY_WORKER_ENV = {"MALLOC_MMAP_THRESHOLD_": "65536"}
#: environment of the timing workers with ``--malloc reuse``: glibc keeps the memory a tensor frees
#: for the next one instead of unmapping it and page-faulting it in again at the next allocation
#: (about 3 us per 4 KiB page on the development machine, 25 ms per 33 MB attention matrix), as a
#: caching allocator (jemalloc, tcmalloc; PyTorch's CPU performance guide) or CUDA's does
REUSE_MALLOC_ENV = {
    "GLIBC_TUNABLES": "glibc.malloc.mmap_threshold=4294967296:glibc.malloc.trim_threshold=17179869184",
}
MALLOC_ENVS = {"reuse": REUSE_MALLOC_ENV, "default": {}}
DEVICES = ("cpu", "cuda")
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
#: the lines around the benchmark section that ``--readme`` replaces
README_START = "<!-- benchmark: generated by `make benchmark`, do not edit by hand -->"
README_END = "<!-- end of benchmark -->"
#: operators per table of ``--profile``
PROFILE_ROWS = 15

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

    @property
    def task(self) -> str:
        """The fairseq task the model is built for: a language model or a translation model."""
        return LANGUAGE_MODELING if self.arch.startswith("transformer_lm") else TRANSLATION


VANILLA = Variant("vanilla", "Transformer (fairseq)", arch=VANILLA_ARCH)
VANILLA_LM = Variant("vanilla-lm", "Transformer LM (fairseq)", arch=VANILLA_LM_ARCH)
#: the baseline that every model of a task is compared with
REFERENCES: Dict[str, Variant] = {TRANSLATION: VANILLA, LANGUAGE_MODELING: VANILLA_LM}

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

def lm_variant(name: str, label: str, *flags: str) -> Variant:
    return Variant(name, label, flags, POSATTN_LM_ARCH)


#: the causal side alone: ``transformer_lm_posattn`` with the ``--decoder-*`` terms
LM_VARIANTS: Tuple[Variant, ...] = (
    lm_variant("lm-defaults", "transformer_lm_posattn, defaults"),
    lm_variant("lm-san-p-r", "SAN+P+R", "--decoder-direct-position", "both"),
    lm_variant("lm-temp", "+Temp", "--decoder-learnable-temperature"),
    lm_variant("lm-conv2d", "+Conv2d", "--decoder-conv-attention", "2d"),
    lm_variant("lm-conv1d", "+Conv", "--decoder-conv-attention", "1d"),
    lm_variant("lm-da", "DA-Transformer", "--decoder-distance-aware"),
    lm_variant("lm-rpr", "Transformer-RPR (k=16)", "--decoder-relative-positions", "16"),
)
VARIANTS_BY_NAME: Dict[str, Variant] = {v.name: v for v in (*POSATTN_VARIANTS, *LM_VARIANTS)}
DEFAULT_DECODE_VARIANTS = ("struct-abs", "struct-rel", "struct-both", "dec-san-p-r", "da")


@dataclass(frozen=True)
class Target:
    """Performance targets of a variant: largest time and memory ratios, smallest speed ratio."""

    time: Optional[float] = None
    memory: Optional[float] = None
    speed: Optional[float] = None


#: the performance issue's targets, by kind of term (time, memory; beam-search speed of the structural
#: variants): additive biases and structural absolute, temperature, the relative / scaling / 2d terms,
#: and the 1d convolution's t x t channels
ADDITIVE = Target(time=1.10, memory=1.10)
TEMPERATURE = Target(time=1.05, memory=1.05)
RELATIVE = Target(time=1.35, memory=1.25)
CONV_1D = Target(time=1.60, memory=1.50)
STRUCTURAL_ABSOLUTE = Target(time=1.10, memory=1.10, speed=0.90)
STRUCTURAL_RELATIVE = Target(time=1.35, memory=1.25, speed=0.90)
TARGETS: Dict[str, Target] = {
    **dict.fromkeys(("san-p", "san-r", "san-p-r", "san-p-r-all", "dec-san-p-r", "lm-san-p-r"), ADDITIVE),
    **dict.fromkeys(("temp", "lm-temp"), TEMPERATURE),
    **dict.fromkeys(("conv2d", "da", "rpr", "lm-conv2d", "lm-da", "lm-rpr"), RELATIVE),
    **dict.fromkeys(("conv1d", "lm-conv1d"), CONV_1D),
    **dict.fromkeys(("struct-abs", "struct-abs-nonlinear"), STRUCTURAL_ABSOLUTE),
    **dict.fromkeys(("struct-rel", "struct-both"), STRUCTURAL_RELATIVE),
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
    the round-robin ``timing`` (train steps) or ``decoding`` (beam search, hypotheses of
    ``decode_length`` tokens) of all ``variants`` (the first one is the reference), or a
    torch.profiler ``profile`` of each variant's train steps. ``task``: ``translation`` (source,
    target and structural side data) or ``language_modeling`` (blocks of ``shape.max_len`` tokens).
    ``conllu``: the trees of the structural side data."""

    mode: str
    task: str
    variants: Tuple[Variant, ...]
    size_flags: Tuple[str, ...]
    max_positions: int
    shape: BatchShape
    vocab_size: int
    warmup: int
    steps: int
    seed: int
    device: Optional[str]
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
    task: str = TRANSLATION
    memory: Dict[str, List[Dict[str, Any]]] = field(default_factory=dict)
    #: step times of the primary malloc setting, and with glibc's default malloc (``--malloc both``)
    timing: Dict[str, List[float]] = field(default_factory=dict)
    timing_default_malloc: Dict[str, List[float]] = field(default_factory=dict)
    decoding: Dict[str, List[float]] = field(default_factory=dict)
    decode_sentences: List[int] = field(default_factory=list)
    decode_shapes: List[List[int]] = field(default_factory=list)
    failures: Dict[str, str] = field(default_factory=dict)
    digests: Set[str] = field(default_factory=set)

    @property
    def reference(self) -> Variant:
        """The vanilla fairseq model the group's variants are compared with."""
        return REFERENCES[self.task]

    def applicable(self, variants: Sequence[Variant]) -> List[Variant]:
        """The ``variants`` built for this group's task."""
        return [variant for variant in variants if variant.task == self.task]


# ----------------------------------------------------------------------------------------- worker
# torch and fairseq are imported inside the worker functions only: the parent process stays light.
def make_dictionary(size: int) -> Any:
    """A fairseq ``Dictionary`` of exactly ``size`` symbols (the 4 specials included)."""
    from fairseq.data import Dictionary

    dictionary = Dictionary()
    for index in range(size - len(dictionary)):
        dictionary.add_symbol(f"w{index}")
    return dictionary


def fill_batch(shape: BatchShape, draw: Callable[[], Tuple[Any, ...]]) -> List[Tuple[Any, ...]]:
    """Examples (tuples of token tensors) from ``draw`` while one more fits in ``shape.max_tokens``
    padded tokens (fairseq's ``--max-tokens`` rule) and ``shape.max_sentences`` (when positive)."""
    examples: List[Tuple[Any, ...]] = []
    width = 0
    while not shape.max_sentences or len(examples) < shape.max_sentences:
        example = draw()
        new_width = max(width, *(tokens.numel() for tokens in example))
        if examples and (len(examples) + 1) * new_width > shape.max_tokens:
            break
        examples.append(example)
        width = new_width
    return examples


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

    def pair() -> Tuple[torch.Tensor, torch.Tensor]:
        src_len, tgt_len = (int(n) for n in rng.integers(shape.min_len, shape.max_len + 1, size=2))
        return sentence(src_len), sentence(tgt_len)

    batches = []
    for _ in range(count):
        pairs = sorted(fill_batch(shape, pair), key=lambda pair: -pair[0].numel())
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


def make_lm_batches(dictionary: Any, shape: BatchShape, count: int, seed: int) -> List[Dict[str, Any]]:
    """``count`` language-model batches as fairseq's ``--task language_modeling`` collates them:
    samples of lengths uniform in ``[min_len, max_len]`` (``--sample-break-mode eos``; blocks of
    ``--sample-break-mode none`` when the two are equal), right-padded, the target being the
    sample shifted by one token."""
    import numpy as np
    import torch
    from fairseq.data.data_utils import collate_tokens

    rng = np.random.default_rng(seed)
    pad = dictionary.pad()

    def sample() -> Tuple[torch.Tensor, torch.Tensor]:
        length = int(rng.integers(shape.min_len, shape.max_len + 1))
        stream = torch.from_numpy(rng.integers(dictionary.nspecial, len(dictionary), size=length + 1))
        return stream[:-1], stream[1:]

    batches = []
    for _ in range(count):
        samples = fill_batch(shape, sample)
        batches.append({
            "net_input": {"src_tokens": collate_tokens([s for s, _ in samples], pad, left_pad=False),
                          "src_lengths": torch.tensor([s.numel() for s, _ in samples])},
            "target": collate_tokens([t for _, t in samples], pad, left_pad=False),
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


def model_sizes(model: Any) -> Dict[str, int]:
    """Embedding and FFN size, layers per side and heads of a built fairseq transformer (or LM)."""
    decoder = model.decoder
    encoder = getattr(model, "encoder", None)
    return {
        "embed": decoder.embed_tokens.embedding_dim, "ffn": decoder.layers[0].fc1.out_features,
        "encoder_layers": len(encoder.layers) if encoder is not None else 0,
        "decoder_layers": len(decoder.layers), "heads": decoder.layers[0].self_attn.num_heads,
    }


class Worker:
    """One subprocess's device, dictionary and batches, and the models it builds and trains."""

    def __init__(self, spec: WorkerSpec):
        import torch

        self.spec = spec
        if spec.threads is not None:
            torch.set_num_threads(spec.threads)
        self.device = torch.device(spec.device or ("cuda" if torch.cuda.is_available() else "cpu"))
        self.dictionary = make_dictionary(spec.vocab_size)
        count = spec.warmup + spec.steps
        if spec.task == LANGUAGE_MODELING:
            batches = make_lm_batches(self.dictionary, spec.shape, count, spec.seed)
        else:
            batches = make_batches(self.dictionary, spec.shape, count, spec.seed)
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
        from fairseq import models, options
        from fairseq.dataclass.utils import convert_namespace_to_omegaconf

        positions = str(self.spec.max_positions)
        if variant.task == LANGUAGE_MODELING:
            task_flags = ["--task", LANGUAGE_MODELING, "--tokens-per-sample", positions]
        else:
            task_flags = ["--task", TRANSLATION, "--max-source-positions", positions]
        argv = [
            "unused-data-dir", "--user-dir", str(USER_DIR), *task_flags, "--arch", variant.arch,
            "--max-target-positions", positions, "--dropout", "0.1", *self.spec.size_flags,
            *variant.flags,
        ]
        args = options.parse_args_and_arch(options.get_training_parser(), argv)

        class Task:
            """What ``build_model`` reads from the task: the dictionaries (``--task
            translation_structural`` provides the parse for structural variants) and the
            language model's ``--tokens-per-sample``."""

            source_dictionary = self.dictionary
            target_dictionary = self.dictionary
            provides_structure = variant.structural

        torch.manual_seed(self.spec.seed)
        model = models.build_model(convert_namespace_to_omegaconf(args).model, Task())
        model = model.to(self.device).train()
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
        epsilon = LABEL_SMOOTHING if variant.task == TRANSLATION else 0.0  # LM: cross entropy
        loss, _ = label_smoothed_nll_loss(lprobs.view(-1, lprobs.size(-1)), target.view(-1),
                                          epsilon, ignore_index=pad)
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
        model, optimizer, _ = self.build(variant)
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
            "sizes": model_sizes(model),
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

    def profile(self) -> Dict[str, Any]:
        """Each variant in turn: warm-up steps, then the timed steps under torch.profiler; the
        operators with the most self time (CPU, or CUDA on a GPU) and the mean step time."""
        from torch.profiler import ProfilerActivity, profile

        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self.on_cuda else [])
        sort_by = "self_cuda_time_total" if self.on_cuda else "self_cpu_time_total"
        tables, step_ms = {}, {}
        for variant in self.spec.variants:
            model, optimizer, _ = self.build(variant)
            for batch in self.batches[: self.spec.warmup]:
                self.step(variant, model, optimizer, batch)
            with profile(activities=activities) as profiler:
                times = [self.step(variant, model, optimizer, batch)
                         for batch in self.batches[self.spec.warmup:]]
            tables[variant.name] = profiler.key_averages().table(sort_by=sort_by, row_limit=PROFILE_ROWS)
            step_ms[variant.name] = statistics.mean(times)
            del model, optimizer
        return {"tables": tables, "step_ms": step_ms, "digest": self.digest}


def worker_main(spec_json: str) -> None:
    spec = WorkerSpec.from_json(spec_json)
    worker = Worker(spec)
    modes = {"memory": worker.memory, "timing": worker.timing, "decoding": worker.decoding,
             "profile": worker.profile}
    result = modes[spec.mode]()
    print(RESULT_MARKER + json.dumps(result), flush=True)


# ----------------------------------------------------------------------------------------- parent
def measure(spec: WorkerSpec, env: Dict[str, str]) -> Dict[str, Any]:
    """Run one worker subprocess with ``env`` added to the environment; raise ``RuntimeError``
    carrying its stderr if it fails."""
    command = [sys.executable, str(Path(__file__).resolve()), "--worker", spec.to_json()]
    completed = subprocess.run(command, capture_output=True, text=True, cwd=REPO_ROOT,
                               env={**os.environ, **env})
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
                 decode_variants: Sequence[Variant], groups: Sequence[Group]):
        self.cli = cli
        self.variants = list(variants)
        self.decode_variants = list(decode_variants)
        self.done = 0
        #: the malloc setting of the timing and decoding workers, and whether to time glibc's too
        self.malloc = "reuse" if cli.malloc == "both" else cli.malloc
        self.also_default_malloc = cli.malloc == "both"
        # memory runs (vanilla twice), timing (once or twice), decoding
        self.total = sum(len(group.applicable(self.variants)) + 3 + self.also_default_malloc
                         + bool(group.applicable(self.decode_variants)) for group in groups)

    def spec(self, group: Group, mode: str, variants: Sequence[Variant]) -> WorkerSpec:
        cli = self.cli
        decoding = mode == "decoding"
        return WorkerSpec(mode=mode, task=group.task, variants=tuple(variants),
                          size_flags=size_flags(cli, group.task),
                          max_positions=group.max_positions,
                          shape=group.shape.sentences(cli.decode_batch_size) if decoding else group.shape,
                          vocab_size=cli.vocab_size, warmup=cli.warmup,
                          steps=cli.decode_rounds if decoding else cli.steps, seed=cli.seed,
                          device=cli.device, threads=cli.threads, conllu=str(cli.conllu),
                          decode_length=cli.decode_length)

    def run(self, group: Group, mode: str, variants: Sequence[Variant], what: str,
            malloc: Optional[str] = None) -> Optional[Dict[str, Any]]:
        """One worker: memory with MEMORY_WORKER_ENV, the others with ``malloc`` (default: the
        primary setting)."""
        self.done += 1
        logger.info("[%d/%d] %s: %s", self.done, self.total, group.title, what)
        env = MEMORY_WORKER_ENV if mode == "memory" else MALLOC_ENVS[malloc or self.malloc]
        try:
            result = measure(self.spec(group, mode, variants), env)
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
        reference, variants = group.reference, group.applicable(self.variants)
        for variant in (reference, *variants, reference):
            result = self.run(group, "memory", [variant],
                              f"memory of {variant.label} {' '.join(variant.flags)}".rstrip())
            if result is not None:
                group.memory.setdefault(variant.name, []).append(result)
                logger.info("    peak %.0f MB", result["peak_mb"])
        if reference.name in group.memory:
            runnable = [reference, *(v for v in variants if v.name in group.memory)]
            what = f"timing of {len(runnable)} models, round-robin"
            result = self.run(group, "timing", runnable, f"{what} ({self.malloc} malloc)")
            if result is not None:
                group.timing = result["step_ms"]
            if self.also_default_malloc:
                result = self.run(group, "timing", runnable, f"{what} (default malloc)", "default")
                if result is not None:
                    group.timing_default_malloc = result["step_ms"]
        if len(group.digests) > 1:
            raise RuntimeError(f"{group.title}: the workers saw different batches ({sorted(group.digests)})")
        decode_variants = group.applicable(self.decode_variants)
        if decode_variants:
            decoders = [reference, *decode_variants]
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


def time_ratio(group: Group, name: str, default_malloc: bool = False) -> Optional[float]:
    """Median over the rounds of ``name``'s step time over vanilla's (with glibc's default malloc:
    ``default_malloc``); None if either was not timed."""
    reference = group.reference.name
    timing = group.timing_default_malloc if default_malloc else group.timing
    if name not in timing or reference not in timing:
        return None
    return statistics.median(t / r for t, r in zip(timing[name], timing[reference]))


def peak_mb(group: Group, name: str) -> Optional[float]:
    """Mean peak memory of ``name``'s memory runs; None if it crashed."""
    if name not in group.memory:
        return None
    return statistics.mean(run["peak_mb"] for run in group.memory[name])


def memory_ratio(group: Group, name: str) -> Optional[float]:
    mb, reference = peak_mb(group, name), peak_mb(group, group.reference.name)
    return None if mb is None or reference is None else mb / reference


def speed_ratio(group: Group, name: str) -> Optional[float]:
    """Median over the rounds of vanilla's decoding time over ``name``'s (above 1: faster)."""
    reference = group.reference.name
    if name not in group.decoding or reference not in group.decoding:
        return None
    return statistics.median(r / t for t, r in zip(group.decoding[name], group.decoding[reference]))


def ratio_cell(ratio: Optional[float]) -> str:
    return "" if ratio is None else f"{ratio:.2f}"


#: what each kind of target bounds: the ratio's name and the comparison
CHECKS: Dict[str, Tuple[str, str]] = {"time": ("time ratio", "<="), "memory": ("memory ratio", "<="),
                                      "speed": ("speed ratio", ">=")}


def ratio_of(group: Group, name: str, kind: str) -> Optional[float]:
    return {"time": time_ratio, "memory": memory_ratio, "speed": speed_ratio}[kind](group, name)


def target_checks(group: Group, name: str, kinds: Sequence[str]) -> List[Tuple[str, float, float, bool]]:
    """``(kind, ratio, bound, met)`` for each of ``kinds`` that ``name`` has a target for and was
    measured; ratios are compared as printed (two decimals)."""
    target = TARGETS.get(name, Target())
    checks = []
    for kind, (_, sign) in CHECKS.items():
        bound, ratio = getattr(target, kind), ratio_of(group, name, kind)
        if kind in kinds and bound is not None and ratio is not None:
            met = round(ratio, 2) <= bound if sign == "<=" else round(ratio, 2) >= bound
            checks.append((kind, ratio, bound, met))
    return checks


def target_cell(group: Group, name: str, kinds: Sequence[str]) -> str:
    """``<= 1.10 / <= 1.10: met`` (or which one was MISSED); empty without a target."""
    checks = target_checks(group, name, kinds)
    if not checks:
        return ""
    bounds = " / ".join(f"{CHECKS[kind][1]} {bound:.2f}" for kind, _, bound, _ in checks)
    missed = [kind for kind, _, _, met in checks if not met]
    return f"{bounds}: " + (f"MISSED ({', '.join(missed)})" if missed else "met")


def group_rows(group: Group, variants: Sequence[Variant], default_malloc: bool) -> Tuple[List[str], str]:
    """The train-step table rows of one group (with a column of time ratios under glibc's default
    malloc if ``default_malloc``) and a line on its baseline's noise."""
    rows = []
    reference = group.reference
    for variant in (reference, *group.applicable(variants)):
        mb = peak_mb(group, variant.name)
        if mb is None:
            rows.append(f"| {variant.label} | {flags_cell(variant)} | crashed: "
                        f"{group.failures[variant.name]} |" + " |" * (4 + default_malloc))
            continue
        times = group.timing.get(variant.name)
        ms = f"{statistics.median(times):.0f}" if times else "not timed"
        default_cell = f" {ratio_cell(time_ratio(group, variant.name, True))} |" if default_malloc else ""
        rows.append(f"| {variant.label} | {flags_cell(variant)} | {ms} | "
                    f"{ratio_cell(time_ratio(group, variant.name))} |{default_cell} {mb:.0f} "
                    f"| {ratio_cell(memory_ratio(group, variant.name))} "
                    f"| {target_cell(group, variant.name, ('time', 'memory'))} |")
    if reference.name not in group.memory:
        return rows, "crashed, so nothing was timed"

    noise = "peak memory of the first / last run " + " / ".join(
        f"{r['peak_mb']:.0f} MB" for r in group.memory[reference.name])
    if reference.name in group.timing:
        noise += "; step time " + spread(group.timing[reference.name])
        if reference.name in group.timing_default_malloc:
            noise += "; with glibc's default malloc " + spread(group.timing_default_malloc[reference.name])
    else:
        noise += f"; timing crashed: {group.failures.get('timing', '')}"
    return rows, noise


def spread(times: Sequence[float]) -> str:
    """The range of a baseline's step times, with a warning where it is wide."""
    text = f"{min(times):.0f}-{max(times):.0f} ms over the {len(times)} rounds"
    if (max(times) - min(times)) / statistics.median(times) > NOISE_WARNING:
        text += " (the machine's load varied: trust the ratios, medians of paired steps, over the times)"
    return text


def decode_rows(group: Group, variants: Sequence[Variant]) -> List[str]:
    """The decoding table rows of one group: sentences per second, speed ratio and target."""
    reference = group.reference
    if not group.decoding:
        return [f"| {reference.label} | {flags_cell(reference)} | crashed: "
                f"{group.failures.get('decoding', '')} | | |"]
    sentences = sum(group.decode_sentences)
    rows = []
    for variant in (reference, *group.applicable(variants)):
        rate = sentences / (sum(group.decoding[variant.name]) / 1000)
        rows.append(f"| {variant.label} | {flags_cell(variant)} | {rate:.1f} | "
                    f"{ratio_cell(speed_ratio(group, variant.name))} "
                    f"| {target_cell(group, variant.name, ('speed',))} |")
    return rows


def target_lines(groups: Sequence[Group], prepare: Optional[Dict[str, Any]]) -> List[str]:
    """How many of the measured targets were met, each missed one, and the prepare step's."""
    checked, missed = 0, []
    for group in groups:
        for name in TARGETS:
            for kind, ratio, bound, met in target_checks(group, name, list(CHECKS)):
                checked += 1
                if not met:
                    missed.append(f"- MISSED: {VARIANTS_BY_NAME[name].label}, {group.title}: "
                                  f"{CHECKS[kind][0]} {ratio:.2f} (target {CHECKS[kind][1]} {bound:.2f}).")
    lines = [f"- Ratios: {checked - len(missed)} of {checked} targets met (the target columns above)."]
    lines += missed
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


def model_line(groups: Sequence[Group], task: str, cli: argparse.Namespace) -> Optional[str]:
    """The report's line on the sizes of ``task``'s models, from its baseline's memory run."""
    reference = REFERENCES[task]
    run = next((g.memory[reference.name][0] for g in groups
                if g.task == task and reference.name in g.memory), None)
    if run is None:
        return None
    sizes = run["sizes"]
    if task == LANGUAGE_MODELING:
        count = sizes["decoder_layers"]
        models, layers = f"`{VANILLA_LM_ARCH}` vs `{POSATTN_LM_ARCH}`", f"{count} layer{'s' * (count != 1)}"
    else:
        models = f"`{VANILLA_ARCH}` vs `{POSATTN_ARCH}`"
        layers = f"{sizes['encoder_layers']}+{sizes['decoder_layers']} layers"
    return (f"- Models: {models} (the flags below are on the latter), embed {sizes['embed']}, FFN "
            f"{sizes['ffn']}, {layers}, {sizes['heads']} heads, vocabulary {cli.vocab_size}, dropout "
            f"0.1; vanilla {run['params'] / 1e6:.1f}M parameters.")


MALLOC_NOTES = {
    "reuse": "glibc's malloc keeps freed memory for the next allocation (`GLIBC_TUNABLES` raises its "
             "mmap and trim thresholds), as a caching allocator does.",
    "default": "glibc's malloc with its defaults: every tensor above 32 MB is mapped at allocation and "
               "unmapped when freed, so each allocation page-faults its memory in again.",
    "both": "Time ratio: glibc's malloc keeps freed memory for the next allocation (`GLIBC_TUNABLES` "
            "raises its mmap and trim thresholds), as a caching allocator (jemalloc, tcmalloc: PyTorch's "
            "CPU performance guide; CUDA's) does; the targets are checked on it. Default malloc: the "
            "same steps with glibc's defaults, under which every tensor above 32 MB is mapped at "
            "allocation and unmapped when freed, so each of the explicit attention path's (length x "
            "length) matrices page-faults its memory in again (beam search runs with the first setting).",
}


def header_lines(groups: Sequence[Group], cli: argparse.Namespace, load: Tuple[float, float],
                 sample: Dict[str, Any]) -> List[str]:
    """The report's title and its lines on the machine, the models, the method and the batches."""
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
    ]
    lines += [line for task in (TRANSLATION, LANGUAGE_MODELING)
              if (line := model_line(groups, task, cli)) is not None]
    lines += [
        f"- Structural side data: each source of m BPE pieces gets a forest of real UD EWT trees "
        f"(`{display_path(str(cli.conllu))}`) of about m / {PIECES_PER_WORD} words, the extra pieces "
        "as subwords of random words; depth, tin and tout per token as `--task translation_structural` "
        "collates them, computed once per process outside every timed region.",
        f"- Step: forward + label-smoothed cross entropy (eps {LABEL_SMOOTHING}; language models: "
        "plain cross entropy) + backward + Adam, on the same batches for every model (checked by hash).",
        f"- Time: one process runs every model of a group round-robin, one step each per batch, order "
        f"rotated per round; warm-up rounds: {cli.warmup}, then timed rounds: {cli.steps} "
        "(time.perf_counter). Step time: median over the rounds; time ratio: median over the rounds "
        f"of the step time over vanilla's in the same round. {MALLOC_NOTES[cli.malloc]}",
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
    lines.append("- Targets: the performance issue's ratio bounds for each kind of term (time / memory; "
                 "speed for beam search), checked on the ratios as printed.")
    for group in groups:
        shapes = next((runs[0]["batch_shapes"] for runs in group.memory.values()), [])
        seen = ", ".join(sorted({f"{b} x {t}" for b, t in shapes})) or "none"
        if group.task == LANGUAGE_MODELING:
            lines.append(f"- {group.title}: {group.shape.describe()} (batches of {seen} tokens), "
                         f"--tokens-per-sample and --max-target-positions {group.max_positions}.")
            continue
        decoded = sorted({f"{b} x {t}" for b, t in group.decode_shapes})
        decoding = f"; decoding: {', '.join(decoded) or 'none'}" if group.decode_shapes else ""
        lines.append(f"- {group.title}: {group.shape.describe()} (source batches of "
                     f"{seen} tokens{decoding}), --max-source/target-positions {group.max_positions}.")
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
    default_malloc = any(group.timing_default_malloc for group in groups)
    default_header, default_rule = (" time ratio, default malloc |", "---:|") if default_malloc else ("", "")
    lines += ["", "**Train step**", "",
              f"| variant | flags | step time (ms) | time ratio |{default_header} peak memory (MB) "
              "| memory ratio | target |",
              f"|---|---|---:|---:|{default_rule}---:|---:|---|"]
    notes = []
    for group in groups:
        rows, noise = group_rows(group, variants, default_malloc)
        lines.append(f"| **{group.title}** |" + " |" * (6 + default_malloc))
        lines += rows
        notes.append(f"- Baseline, {group.title}: {noise}.")
    decoding_groups = [group for group in groups if group.applicable(decode_variants)]
    if decoding_groups:
        lines += ["", f"**Beam search** (beam {BEAM_SIZE}, {cli.decode_length} tokens + EOS per "
                  "hypothesis)", "", "| variant | flags | sentences/s | speed ratio | target |",
                  "|---|---|---:|---:|---|"]
        for group in decoding_groups:
            lines.append(f"| **{group.title}** | | | | |")
            lines += decode_rows(group, decode_variants)
    if prepare is not None:
        lines += prepare_lines(prepare)
    lines += ["", "**Targets**", ""] + target_lines(groups, prepare)
    return "\n".join(lines + ["", "**Noise**", ""] + notes) + "\n"


#: ``transformer_iwslt_de_en``'s sizes, which the language models take too ("of the same size")
IWSLT_SIZES = {"embed-dim": 512, "ffn-embed-dim": 1024, "attention-heads": 4}


def size_flags(cli: argparse.Namespace, task: str) -> Tuple[str, ...]:
    """fairseq flags for the sizes: the iwslt preset's, overridden by the options the user gave, on
    both sides of a translation model (only the overrides: the preset is its architecture) and on
    the decoder of a language model (with its input and output dims equal to the embedding)."""
    overrides = {"layers": cli.layers, "embed-dim": cli.embed_dim, "ffn-embed-dim": cli.ffn_dim,
                 "attention-heads": cli.heads}
    sides: Tuple[str, ...] = ("encoder", "decoder")
    if task == LANGUAGE_MODELING:
        sides = ("decoder",)
        overrides = {name: IWSLT_SIZES[name] if value is None and name in IWSLT_SIZES else value
                     for name, value in overrides.items()}
        overrides.update({"input-dim": overrides["embed-dim"], "output-dim": overrides["embed-dim"]})
    flags: List[str] = []
    for option, value in overrides.items():
        if value is not None:
            for side in sides:
                flags += [f"--{side}-{option}", str(value)]
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
    add("--lm", action="store_true",
        help=f"add two language-model groups, `{VANILLA_LM_ARCH}` vs `{POSATTN_LM_ARCH}` (the lm-* "
        f"variants) of the translation models' decoder sizes: sentences of --min-len to --max-len "
        f"tokens and blocks of {LONG_LENGTH}")
    add("--skip-short", action="store_true",
        help="leave out the Multi30k-like translation group (to measure only --long or --lm)")
    add("--lm-batch-size", type=int, default=8,
        help=f"blocks of {LONG_LENGTH} tokens per batch in the --lm blocks group (default: %(default)s)")
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
    add("--device", choices=DEVICES,
        help="where the models train and decode: cpu, or cuda (models and batches on the current "
        "GPU, torch.cuda.synchronize around every timed region, peak memory from "
        "torch.cuda.max_memory_allocated; default: cuda if torch sees a GPU, else cpu)")
    add("--cpu", action="store_true", help="the same as --device cpu")
    add("--threads", type=int,
        help="torch intra-op threads of the workers (default: torch's choice); 1 is steadier on a "
        "machine that other jobs share")
    add("--malloc", choices=list(MALLOC_NOTES), default="both",
        help="glibc malloc of the timing workers: `reuse` keeps freed memory for the next allocation "
        "(as jemalloc, tcmalloc or CUDA's allocator), `default` maps and unmaps every large tensor "
        "(page faults at each allocation), `both` times both (the targets are checked on `reuse`; "
        "default: %(default)s)")
    add("--output", type=Path, help="also write the markdown report to this file")
    add("--readme", type=Path,
        help=f"also put the report into this markdown file, between the lines {README_START!r} and "
        f"{README_END!r} (the README's benchmark section: `make benchmark`)")
    add("--profile", nargs="+", choices=list(VARIANTS_BY_NAME), metavar="NAME",
        help="instead of the measurements, profile the train steps of these variants and of vanilla "
        "with torch.profiler in every group, and print each one's most expensive operators")
    add("--worker", metavar="SPEC_JSON", help=argparse.SUPPRESS)
    cli = parser.parse_args(argv)
    if (error := resolve_device(cli)) is not None:
        parser.error(error)
    if min(cli.steps, cli.decode_rounds, cli.decode_batch_size) < 1 or cli.warmup < 0 or (
            cli.threads is not None and cli.threads < 1):
        parser.error("--steps, --decode-rounds, --decode-batch-size and --threads must be >= 1, "
                     "--warmup >= 0")
    if not 2 <= cli.min_len <= cli.max_len <= cli.max_positions:
        parser.error("need 2 <= --min-len <= --max-len <= --max-positions")
    if cli.skip_short and not (cli.long or cli.lm):
        parser.error("--skip-short leaves nothing to measure without --long or --lm")
    if cli.readme is not None and cli.profile:
        parser.error("--readme takes the benchmark's report, not a --profile")
    if cli.readme is not None and (error := section_error(cli.readme)) is not None:
        parser.error(error)
    if not 1 <= cli.decode_length < cli.max_positions:
        parser.error("need 1 <= --decode-length < --max-positions (fairseq decodes at most "
                     "--max-target-positions - 1 tokens)")
    return cli


def resolve_device(cli: argparse.Namespace) -> Optional[str]:
    """Fold ``--cpu`` into ``cli.device`` (None: the workers take CUDA where torch sees a GPU);
    return why the choice cannot run, or None. torch is imported here for ``--device cuda`` only."""
    if cli.cpu:
        if cli.device == "cuda":
            return "--cpu and --device cuda contradict each other: give one of them"
        cli.device = "cpu"
    if cli.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            return ("--device cuda: torch sees no CUDA device (torch.cuda.is_available() is False; "
                    f"torch {torch.__version__}, built for CUDA {torch.version.cuda}): run on a GPU "
                    "machine with a CUDA build of torch, or use --device cpu")
    return None


def build_groups(cli: argparse.Namespace) -> List[Group]:
    """The Multi30k-like group (unless ``--skip-short``), and the ``--long`` and ``--lm`` groups
    when asked for."""
    groups = []
    if not cli.skip_short:
        groups.append(Group(f"Multi30k-like, lengths {cli.min_len}-{cli.max_len}",
                            BatchShape(cli.min_len, cli.max_len, cli.max_tokens), cli.max_positions))
    if cli.long:
        groups.append(Group(f"sequence length {LONG_LENGTH}",
                            BatchShape(LONG_LENGTH, LONG_LENGTH, cli.long_batch_size * LONG_LENGTH),
                            LONG_LENGTH))
    if cli.lm:
        groups.append(Group(f"language model, sentences of {cli.min_len}-{cli.max_len}",
                            BatchShape(cli.min_len, cli.max_len, cli.max_tokens), cli.max_positions,
                            task=LANGUAGE_MODELING))
        groups.append(Group(f"language model, blocks of {LONG_LENGTH}",
                            BatchShape(LONG_LENGTH, LONG_LENGTH, cli.lm_batch_size * LONG_LENGTH),
                            LONG_LENGTH, task=LANGUAGE_MODELING))
    return groups


def profile_report(cli: argparse.Namespace, groups: Sequence[Group], names: Sequence[str]) -> str:
    """torch.profiler tables of vanilla and ``names`` in every group where they apply."""
    runner = Runner(cli, [], [], groups)
    variants = [VARIANTS_BY_NAME[name] for name in dict.fromkeys(names)]
    sections = []
    for group in groups:
        chosen = group.applicable(variants)
        if not chosen:
            continue
        models = [group.reference, *chosen]
        result = runner.run(group, "profile", models, f"profile of {len(models)} models")
        if result is None:
            sections.append(f"## {group.title}\n\ncrashed: {group.failures['profile']}\n")
            continue
        for variant in (group.reference, *chosen):
            sections.append(f"## {group.title}: {variant.label} {' '.join(variant.flags)}\n\n"
                            f"{cli.steps} train steps, {result['step_ms'][variant.name]:.0f} ms per step "
                            f"under the profiler\n\n```\n{result['tables'][variant.name]}\n```\n")
    return "\n".join(sections)


def section_error(path: Path) -> Optional[str]:
    """Why the benchmark section of ``path`` cannot be replaced, or None."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as error:
        return f"{path}: {error.strerror}"
    if text.count(README_START) != 1 or text.count(README_END) != 1 or \
            text.index(README_START) > text.index(README_END):
        return (f"{path}: needs exactly one line {README_START!r} and one line {README_END!r} after it, "
                "around the benchmark section")
    return None


def replace_section(path: Path, report: str) -> None:
    """Put ``report`` (without its title) between the README_START and README_END lines of ``path``
    (checked by :func:`section_error`), through a temporary file and a rename."""
    text = path.read_text(encoding="utf-8")
    head, rest = text.split(README_START)
    _, tail = rest.split(README_END)
    body = report.split("\n", 2)[2] if report.startswith("# ") else report
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_text(f"{head}{README_START}\n{body}{README_END}{tail}", encoding="utf-8")
    temporary.replace(path)


def main(argv: Optional[Sequence[str]] = None) -> int:
    cli = parse_cli(argv)
    if cli.worker is not None:
        worker_main(cli.worker)
        return 0
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    groups = build_groups(cli)
    if cli.profile:
        report, complete = profile_report(cli, groups, cli.profile), True
    else:
        report, complete = benchmark_report(cli, groups)
    print(report, end="")
    if cli.output is not None:
        cli.output.parent.mkdir(parents=True, exist_ok=True)
        cli.output.write_text(report)
        logger.info("report written to %s", cli.output)
    if cli.readme is not None:
        replace_section(cli.readme, report)
        logger.info("benchmark section of %s replaced", cli.readme)
    return 0 if complete and not any(group.failures for group in groups) else 1


def benchmark_report(cli: argparse.Namespace, groups: Sequence[Group]) -> Tuple[str, bool]:
    """Run every group's measurements and the structural prepare timing; return the markdown report
    and whether the prepare timing (unless skipped) ran."""
    variants = [VARIANTS_BY_NAME[name] for name in dict.fromkeys(cli.variants or VARIANTS_BY_NAME)]
    decode_variants = [VARIANTS_BY_NAME[name] for name in dict.fromkeys(cli.decode_variants)]
    load_start = os.getloadavg()[0]
    runner = Runner(cli, variants, decode_variants, groups)
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
    return report, prepare is not None or cli.skip_prepare


if __name__ == "__main__":
    sys.exit(main())
