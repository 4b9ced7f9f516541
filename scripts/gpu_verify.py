"""``make gpu-verify``: the fused attention paths proven and timed on a GPU, in one short run.

Three parts, in this order, each table written to ``report.md`` and ``results.json`` as soon as it is
done, so that a run cut off by its time limit still returns the most important part:

a. **correctness**: every kernel path each registered method's layers can take on the device (the
   path ``auto`` takes in training and in scoring, and flex_attention wherever the terms allow it),
   against the explicit path (``kernel_self_check.compare_paths``): forward and every gradient, bf16 and
   fp32, left and right padding, causal and not. Two sweeps: first every configuration, the paths that do
   not compile at lengths that cover the kernels' known failure modes (not a multiple of 128, length % 128
   == 64, up to 1,000 / 667) and flex_attention, which compiles per padded length, at the self-check's
   batch only (200 / 137); then, while the budget lasts, flex_attention again at 1,000 / 667. A flex path
   is compared twice on the same batch: the first call's time less the second's is its compilation, the
   second's time its check. ``--jobs`` processes (on CUDA half the cores, 4 to 8) check configurations side
   by side, in order (in each sweep every variant's bf16 training on its first side first, then fp32,
   then its other sides), until ``--correctness-budget`` seconds are spent; the notes give the
   compilation and check time and name every configuration not reached.
b. **long blocks**: ``transformer_lm_posattn`` against fairseq's ``transformer_lm`` (d 512, 8 heads, 6
   layers, bf16, 16,384 tokens per batch), 4,096 tokens first, then 1,024, 2,048, 512: train-step time and
   peak-memory ratios per method and kernel path, each model alone in this process (the benchmark's
   batches and models), until ``--long-budget`` seconds are spent.
c. **translation lengths**: ``torch._dynamo``'s compilations over 200 batches of Multi30k-like lengths
   (10-120 tokens) for each method that takes flex_attention, then the benchmark's translation group
   at those lengths.

``--device cpu --tiny`` is the smoke form (the test suite runs it): the same code at toy sizes.
"""

import argparse
import json
import logging
import multiprocessing
import os
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor, TimeoutError, as_completed
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

from posattn_tools.gpu_check.benchmark import benchmark_rows, run_benchmark
from posattn_tools.gpu_check.context import Row
from posattn_tools.gpu_check.machine import NoDevice, detect_machine
from posattn_tools.runs import side_flags

#: (longest, shortest) sentence of each correctness batch of the paths that do not compile; the self-check's
#: batch among them
GPU_LENGTHS = ((17, 11), (127, 84), (192, 128), (200, 137), (513, 342), (1000, 667))
#: flex_attention's in the second sweep (the first takes the self-check's batch only): each padded length
#: compiles anew, about 10 s on an H200
GPU_FLEX_LENGTHS = ((1000, 667),)
TINY_LENGTHS = ((17, 11), (40, 26))
TINY_FLEX_LENGTHS = ((17, 11),)
#: where a side's layers run: (causal, right-padded), language models first
SIDES = (("decoder", True, True), ("encoder", False, False), ("encoder", False, True))
#: the methods whose benchmark variants take flex_attention on CUDA, and those that missed on an H100
TRANSLATION_VARIANTS = ("san-p-r", "t5-bias", "conv-1d", "rotary", "direct-absolute", "direct-relative",
                        "distance-aware", "shaw-keys-only")
TINY_TRANSLATION_VARIANTS = ("t5-bias",)
#: the structural method's keys-only form (its variants need parses, so the registry lists none)
STRUCTURAL_KEYS_ONLY = {"structural_positions": "relative", "structural_keys_only": True}


@dataclass(frozen=True)
class LongBlocks:
    """Part b's language models and batches."""

    lengths: Tuple[int, ...]
    tokens: int
    layers: int
    embed_dim: int
    heads: int
    vocab_size: int
    warmup: int
    steps: int
    precision: str
    threads: Optional[int] = None

    def size_flags(self) -> Tuple[str, ...]:
        return tuple(side_flags(("decoder",), {
            "layers": self.layers, "embed-dim": self.embed_dim, "ffn-embed-dim": 4 * self.embed_dim,
            "attention-heads": self.heads, "input-dim": self.embed_dim, "output-dim": self.embed_dim}))


@dataclass(frozen=True)
class Sizes:
    heads: int
    head_dim: int
    lengths: Tuple[Tuple[int, int], ...]
    flex_lengths: Tuple[Tuple[int, int], ...]
    dtypes: Tuple[str, ...]
    long_blocks: LongBlocks
    translation: Tuple[str, ...]
    batches: int
    max_tokens: int
    sides: Tuple[Tuple[str, bool, bool], ...] = SIDES


GPU = Sizes(8, 64, GPU_LENGTHS, GPU_FLEX_LENGTHS, ("bfloat16", "float32"),
            LongBlocks((4096, 1024, 2048, 512), 16384, 6, 512, 8, 8000, 2, 3, "bf16"),
            TRANSLATION_VARIANTS, 200, 4096)
TINY = Sizes(2, 8, TINY_LENGTHS, TINY_FLEX_LENGTHS, ("float32",), LongBlocks((16,), 64, 1, 16, 2, 64, 1, 1, "fp32", 1),
             TINY_TRANSLATION_VARIANTS, 6, 256, SIDES[:2])
#: one layer configuration of part a: (variant, side, option values, causal, right-padded, dtype)
Configuration = Tuple[str, str, Dict[str, Any], bool, bool, str]
#: part a's sweeps: every fused path (flex_attention at the self-check's batch only), then flex_attention at
#: :attr:`Sizes.flex_lengths`
FIRST_SWEEP, FLEX_SWEEP = 1, 2


@dataclass
class Report:
    """What the run found so far; written out after every configuration."""

    output: Path
    device: str
    header: List[str]
    correctness: List[Dict[str, Any]] = field(default_factory=list)
    long_blocks: List[Row] = field(default_factory=list)
    compilations: List[Dict[str, Any]] = field(default_factory=list)
    translation: List[Row] = field(default_factory=list)
    notes: List[str] = field(default_factory=list)

    def write(self) -> None:
        self.output.mkdir(parents=True, exist_ok=True)
        (self.output / "report.md").write_text(self.markdown(), encoding="utf-8")
        results = {"device": self.device, "header": self.header, "correctness": self.correctness,
                   "long_blocks": [asdict(row) for row in self.long_blocks], "compilations": self.compilations,
                   "translation": [asdict(row) for row in self.translation], "notes": self.notes}
        (self.output / "results.json").write_text(json.dumps(results, indent=1), encoding="utf-8")

    def markdown(self) -> str:
        lines = ["# GPU verification", "", *self.header, ""]
        lines += ["## a. Correctness: every fused path against the explicit path", "",
                  "| variant | side | mode | dtype | path | lengths | verdict | largest error (tensor, lengths) | "
                  "compilation | check |", "|---|---|---|---|---|---|---|---|---|---|"]
        lines += [f"| {r['variant']} | {r['side']} | {r['mode']} | {r['dtype']} | {r['path']} | {r['lengths']} | "
                  f"{r['verdict']} | {r['largest']:.1e} ({r['tensor']}, {r['at']}) | {r['compile_seconds']:.1f} s | "
                  f"{r['check_seconds']:.3f} s |" for r in self.correctness]
        for title, rows in (("b. Long blocks: language models, train step", self.long_blocks),
                            ("c. Translation lengths (10-120 tokens), train step", self.translation)):
            lines += ["", f"## {title}", "", "| check | setting | result | numbers |", "|---|---|---|---|"]
            lines += [f"| {row.check} | {row.setting} | {row.result} | {row.numbers} |" for row in rows]
        lines += ["", "## c. Compilations over Multi30k-like batches", "",
                  "| variant | batches | graphs compiled | seconds |", "|---|---|---|---|"]
        lines += [f"| {r['variant']} | {r['batches']} | {r['graphs']} | {r['seconds']:.1f} |"
                  for r in self.compilations]
        return "\n".join([*lines, "", *self.notes, ""])


# ------------------------------------------------------------------------------------ a. correctness
def layer_variants() -> Iterator[Tuple[str, str, Dict[str, Any]]]:
    """(name, side, option values) of every registered method's variants on each side it takes."""
    from posattn.position_terms.registry import methods_of

    for side in ("decoder", "encoder"):
        for method in methods_of(side):
            for name, values in method.variants.items():
                yield name, side, dict(values)
    yield "structural-keys-only", "encoder", STRUCTURAL_KEYS_ONLY


def build_layer(side: str, causal: bool, values: Dict[str, Any], sizes: Sizes, max_positions: int, dtype: Any,
                device: Any) -> Any:
    """One attention layer of ``values`` with random parameters (most start at zero), on ``device``."""
    import torch

    from posattn.position_options import SidePositionOptions
    from fairseq_posattn.modules.attention import PositionAwareMultiheadAttention

    options = SidePositionOptions(side, causal, max_positions, "--max-positions", **values)
    options.validate()
    attn = PositionAwareMultiheadAttention(sizes.heads * sizes.head_dim, sizes.heads,
                                           options.build_terms(0, sizes.heads, sizes.head_dim))
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for module in (attn, *options.shared.values()):
            module.to(device=device, dtype=dtype)
            for parameter in module.parameters():
                parameter.copy_(0.5 * torch.randn(parameter.shape, generator=generator).to(parameter))
    return attn


def fused_paths(attn: Any, device: Any) -> List[Tuple[str, str]]:
    """(mode, path) of every fused path the layer takes: ``auto``'s in training and in scoring (flex
    needs CUDA for its backward), and flex_attention where the terms allow it."""
    import torch

    from posattn.attention import EXPLICIT, FLEX

    paths = []
    for mode in ("training", "scoring"):
        attn.train(mode == "training")
        with torch.set_grad_enabled(mode == "training"):  # scoring runs without gradients
            attn.kernel = "auto"
            auto = attn.path(False, device, decoding=False)[0]
            attn.kernel = "flex"
            flex = attn.fusable() and attn.path(False, device, decoding=False)[0] == FLEX
        paths += [(mode, path) for path in dict.fromkeys([auto, FLEX if flex else EXPLICIT]) if path != EXPLICIT]
    return paths


def ordered_configurations(sizes: Sizes) -> List[Configuration]:
    """Every layer configuration, in the order a cut-off run should have checked them: each variant's
    first dtype (bf16 on a GPU) on the first side it takes (the language model's for decoder methods),
    then its other dtypes there, then its other sides."""
    everything = [(name, side, values, causal, right, dtype_name)
                  for side_name, causal, right in sizes.sides for name, side, values in layer_variants()
                  if side == side_name for dtype_name in sizes.dtypes]
    first_side: Dict[str, Tuple[bool, bool]] = {}
    for name, _, _, causal, right, _ in everything:
        first_side.setdefault(name, (causal, right))

    def priority(item: Tuple[int, Configuration]) -> Tuple[int, int, int]:
        index, (name, _, _, causal, right, dtype_name) = item
        return (first_side[name] != (causal, right), sizes.dtypes.index(dtype_name), index)
    return [configuration for _, configuration in sorted(enumerate(everything), key=priority)]


def prepare_process() -> None:
    """A correctness process: one compilation per configuration kept, quiet logging."""
    import torch

    import fairseq_posattn  # noqa: F401  (imports fairseq, which sets the root logger to DEBUG)
    logging.getLogger().setLevel(logging.WARNING)
    torch._dynamo.config.cache_size_limit = 256


def side_label(causal: bool, right: bool) -> str:
    return f"{'causal' if causal else 'bidirectional'}, {'right' if right else 'left'}-padded"


def configuration_name(configuration: Configuration) -> str:
    """How the report names a configuration: ``variant (side, dtype)``."""
    name, _, _, causal, right, dtype_name = configuration
    return f"{name} ({side_label(causal, right)}, {dtype_name})"


def lengths_label(lengths: Sequence[Tuple[int, int]]) -> str:
    return " ".join("/".join(map(str, pair)) for pair in lengths)


def takes_flex(configuration: Configuration, device: Any) -> bool:
    """Whether the layer of ``configuration`` takes flex_attention on ``device`` (in training or scoring):
    decided on a small layer on the CPU, since the path depends on the terms and the device's type only."""
    import torch

    from posattn.attention import FLEX
    from posattn.position_options import PositionOptionError

    name, side, values, causal, right, _ = configuration
    try:
        attn = build_layer(side, causal, values, TINY, 64, torch.float32, torch.device("cpu"))
    except PositionOptionError:
        return False
    return any(path == FLEX for _, path in fused_paths(attn, device))


def correctness_tasks(sizes: Sizes, device: Any) -> List[Tuple[int, int]]:
    """(sweep, index into :func:`ordered_configurations`) in the order part a checks them: every
    configuration, then every one that takes flex_attention again at the flex lengths."""
    configurations = ordered_configurations(sizes)
    return [(FIRST_SWEEP, index) for index in range(len(configurations))] + [
        (FLEX_SWEEP, index) for index, configuration in enumerate(configurations) if takes_flex(configuration, device)]


def compared(attn: Any, path: str, lengths: Tuple[int, int], right: bool, causal: bool, device: Any, dtype: Any,
             gradients: bool) -> Tuple[List[Any], float]:
    """``path`` against the explicit path on a batch of ``lengths``: the comparisons, and the seconds
    compilation took. A flex_attention path is compared twice on the same batch: its compilation is the first
    call's time less the second's (the whole first call where it failed to run; then it is not called again).
    On the CPU, where flex_attention runs eagerly, that difference is its first call's own cost."""
    from posattn.attention import FLEX
    from posattn.kernel_self_check import compare_paths
    from posattn.position_context import PositionContext

    ctx = PositionContext.example(lengths, right, causal, device, attn.all_terms())
    first = compare_paths(attn, path, ctx, dtype, gradients=gradients)
    if path != FLEX:
        return [first], 0.0
    if first.failure:
        return [first], first.seconds
    second = compare_paths(attn, path, ctx, dtype, gradients=gradients)
    return [first, second], max(0.0, first.seconds - second.seconds)


def check_configuration(configuration: Configuration, sizes: Sizes, device_name: str,
                        sweep: int = FIRST_SWEEP) -> Tuple[List[Dict], List[str]]:
    """Part a's rows of one layer configuration in one sweep (one per fused path it takes there), and its log
    lines. The first sweep checks every fused path, flex_attention at the self-check's batch only (it
    compiles per padded length) and the others at every length of ``sizes``; the second flex_attention at
    ``sizes.flex_lengths``."""
    import torch

    from posattn.attention import FLEX
    from posattn.kernel_self_check import check_lengths
    from posattn.position_options import PositionOptionError

    name, side, values, causal, right, dtype_name = configuration
    dtype, device = getattr(torch, dtype_name), torch.device(device_name)
    longest = max(length for length, _ in (*sizes.lengths, *sizes.flex_lengths))
    try:
        attn = build_layer(side, causal, values, sizes, longest, dtype, device)
    except PositionOptionError as error:  # e.g. the 1d convolution's t limit
        return [], [f"{name}: {error}"] if sweep == FIRST_SWEEP else []
    rows, lines = [], []
    for mode, path in fused_paths(attn, device):
        self_check = check_lengths(attn)
        if sweep == FIRST_SWEEP:
            all_lengths = [self_check] if path == FLEX else list(sizes.lengths)
        else:
            all_lengths = [lengths for lengths in sizes.flex_lengths if lengths != self_check] if path == FLEX else []
        if not all_lengths:
            continue
        attn.train(mode == "training")
        attn.kernel = "flex" if path == FLEX else "auto"
        found, compile_seconds = [], 0.0
        for lengths in all_lengths:
            comparisons, compilation = compared(attn, path, lengths, right, causal, device, dtype,
                                                gradients=mode == "training")
            found += [(comparison, lengths) for comparison in comparisons]
            compile_seconds += compilation
        worst, at = max(found, key=lambda item: item[0].largest[1])
        # the compiled comparison at the self-check's batch, else at the last lengths
        check = [c.seconds for c, lengths in found if lengths == self_check] or [found[-1][0].seconds]
        failures = [c.failure for c, _ in found if c.failure]
        verdict = "agrees" if all(c.agrees for c, _ in found) else f"FAILED TO RUN ({failures[0]})" if failures \
            else "DISAGREES"
        rows.append(dict(
            variant=name, side=side_label(causal, right), mode=mode, dtype=dtype_name, path=path, sweep=sweep,
            lengths=lengths_label(all_lengths), verdict=verdict, largest=worst.largest[1], tensor=worst.largest[0],
            at="/".join(map(str, at)), compile_seconds=compile_seconds, check_seconds=check[-1],
            seconds=sum(c.seconds for c, _ in found),
            errors={"/".join(map(str, lengths)): c.errors for c, lengths in found}))
        lines.append(f"{name} {side} {mode} {dtype_name} {path} at {rows[-1]['lengths']}: {verdict} "
                     f"(largest {worst.largest[1]:.1e} in {worst.largest[0]}; compilation {compile_seconds:.1f} s)")
    return rows, lines


def correctness(report: Report, sizes: Sizes, device: Any, budget: float, jobs: int, log: Any) -> None:
    """Part a: :func:`correctness_tasks` in order, ``jobs`` processes side by side, until ``budget`` seconds are
    spent (module docstring); the rows in :func:`ordered_configurations`' order, each configuration's second
    sweep after its first; notes: the compilation and check time, and every configuration not reached."""
    configurations = ordered_configurations(sizes)
    tasks = correctness_tasks(sizes, device)
    results: Dict[Tuple[int, int], List[Dict]] = {}

    def record(task: Tuple[int, int], outcome: Any) -> None:
        """``outcome``: a finished future, or a function that returns what :func:`check_configuration` does."""
        try:
            rows, lines = outcome.result() if hasattr(outcome, "result") else outcome()
        except Exception as error:  # noqa: BLE001 (the explicit path or the layer failed: a row says so)
            name, side, _, causal, right, dtype_name = configurations[task[1]]
            rows = [dict(variant=name, side=side_label(causal, right), mode="-", dtype=dtype_name, path="-",
                         sweep=task[0], lengths="-",
                         verdict=f"ERROR ({type(error).__name__}: {next(iter(str(error).splitlines()), '')})",
                         largest=float("inf"), tensor="-", at="-", compile_seconds=0.0, check_seconds=0.0,
                         seconds=0.0, errors={})]
            lines = [f"{name} {side} {dtype_name} (sweep {task[0]}): {rows[0]['verdict']}"]
        results[task] = rows
        report.correctness = [row for done in sorted(results, key=lambda t: (t[1], t[0])) for row in results[done]]
        for line in lines:
            log(line)
        report.write()

    started = time.monotonic()
    if jobs <= 1:
        prepare_process()
        for sweep, index in tasks:
            if time.monotonic() - started >= budget:
                break
            record((sweep, index), lambda: check_configuration(configurations[index], sizes, str(device), sweep))
    else:
        pool = ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn"), initializer=prepare_process)
        futures = {pool.submit(check_configuration, configurations[index], sizes, str(device), sweep): (sweep, index)
                   for sweep, index in tasks}  # started in this order: the first sweep before the second
        try:
            for future in as_completed(futures, timeout=max(0.0, budget - (time.monotonic() - started))):
                record(futures[future], future)
        except TimeoutError:
            pass
        still_running = list((pool._processes or {}).values())  # those compiling when the budget ran out
        pool.shutdown(wait=False, cancel_futures=True)
        for process in still_running:
            process.terminate()
            process.join()
    rows = report.correctness
    compiling = sum(row["compile_seconds"] for row in rows)
    checking = sum(row["seconds"] for row in rows) - compiling
    first = sum(1 for sweep, _ in results if sweep == FIRST_SWEEP)
    flex = [index for sweep, index in tasks if sweep == FLEX_SWEEP]
    missing_flex = [configuration_name(configurations[index]) for index in flex if (FLEX_SWEEP, index) not in results]
    report.notes.append(
        f"Correctness: {first} of {len(configurations)} layer configurations checked, and "
        f"{len(flex) - len(missing_flex)} of the {len(flex)} that take "
        f"flex_attention at {lengths_label(sizes.flex_lengths)}, in {time.monotonic() - started:.0f} s with {jobs} "
        f"process{'es' if jobs > 1 else ''}: compilation {compiling:.1f} s, checks {checking:.1f} s (summed over "
        "the processes).")
    missing = [configuration_name(configuration) for index, configuration in enumerate(configurations)
               if (FIRST_SWEEP, index) not in results]
    if missing:
        report.notes.append(f"Correctness: {len(missing)} of {len(configurations)} layer configurations not reached "
                            f"within the {budget:.0f} s budget (no path checked): {'; '.join(missing)}.")
    if missing_flex:
        report.notes.append(f"Correctness: flex_attention at {lengths_label(sizes.flex_lengths)} not reached for "
                            f"{len(missing_flex)} of the {len(flex)} configurations that take it: "
                            f"{'; '.join(missing_flex)}.")
    report.write()


# ------------------------------------------------------------------------------------ b. long blocks
def long_blocks(report: Report, sizes: Sizes, device: Any, budget: float, log: Any) -> None:
    """Part b: at each block length, fairseq's language model and then each method's, each alone in this
    process (built, ``warmup`` steps, ``steps`` timed; peak memory above the state before it was built),
    until ``budget`` seconds are spent; ratios against fairseq's and the benchmark's targets."""
    from posattn_benchmark.batches import BatchShape
    from posattn_benchmark.variants import LANGUAGE_MODELING, TARGETS, VANILLA_LM, VARIANTS_BY_NAME, \
        lm_each_kernel_path
    from posattn_benchmark.worker import Worker, WorkerSpec

    blocks = sizes.long_blocks
    variants = [VARIANTS_BY_NAME[name] for name in dict.fromkeys(["lm-san-p-r", *lm_each_kernel_path()])]
    started = time.monotonic()
    for length in blocks.lengths:
        spec = WorkerSpec(mode="timing", task=LANGUAGE_MODELING, variants=(VANILLA_LM,),
                          size_flags=blocks.size_flags(), max_positions=length,
                          shape=BatchShape(length, length, blocks.tokens), vocab_size=blocks.vocab_size,
                          warmup=blocks.warmup, steps=blocks.steps, seed=1, device=str(device),
                          threads=blocks.threads, conllu="", decode_length=0, precision=blocks.precision)
        worker = Worker(spec)
        reference: Optional[Tuple[float, Optional[float]]] = None
        for variant in [VANILLA_LM, *variants]:
            if time.monotonic() - started > budget:
                report.notes.append(f"Long blocks: stopped before {variant.name} at {length} tokens after the "
                                    f"{budget:.0f} s budget.")
                report.write()
                return
            setting = f"{length} tokens, {blocks.tokens} per batch, {blocks.precision}"
            try:
                milliseconds, megabytes = measure_alone(worker, variant)
            except Exception as error:  # noqa: BLE001 (a row says what failed; the others still run)
                first_line = next(iter(str(error).splitlines()), "")
                report.long_blocks.append(Row(f"train step: {variant.label}", str(device), setting, "FAILED",
                                              f"{type(error).__name__}: {first_line}"))
                continue
            if reference is None:
                reference = (milliseconds, megabytes)
            row = long_block_row(variant, setting, str(device), (milliseconds, megabytes), reference,
                                 TARGETS.get(variant.name))
            report.long_blocks.append(row)
            log(f"long blocks {length}: {variant.name} {row.result} ({row.numbers})")
            report.write()


def measure_alone(worker: Any, variant: Any) -> Tuple[float, Optional[float]]:
    """The median timed step (ms) and peak memory (MB, CUDA only) of ``variant``, built afresh."""
    import torch

    on_cuda = worker.on_cuda
    if on_cuda:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
    model, optimizer = worker.build(variant)
    try:
        times = [worker.step(variant, model, optimizer, batch) for batch in worker.batches]
    finally:
        del model, optimizer
    peak = (torch.cuda.max_memory_allocated() - before) / 2**20 if on_cuda else None
    return statistics.median(times[worker.spec.warmup:]), peak


def long_block_row(variant: Any, setting: str, device: str, measured: Tuple[float, Optional[float]],
                   reference: Tuple[float, Optional[float]], target: Any) -> Row:
    """A train-step row: the ratios to fairseq's model and, where the variant has one, its target."""
    time_ratio = measured[0] / reference[0]
    memory_ratio = measured[1] / reference[1] if measured[1] is not None and reference[1] else None
    numbers = f"time ratio {time_ratio:.2f}, memory ratio " + (f"{memory_ratio:.2f}" if memory_ratio else "-")
    numbers += f"; {measured[0]:.0f} ms" + (f", {measured[1]:,.0f} MB" if measured[1] is not None else "")
    if target is None or variant.name == "vanilla-lm" or target.time is None:
        return Row(f"train step: {variant.label}", device, setting, "measured", numbers)
    met = time_ratio <= target.time and (memory_ratio is None or target.memory is None or memory_ratio <= target.memory)
    numbers += f"; target time {target.time:.2f}, memory {target.memory:.2f}"
    return Row(f"train step: {variant.label}", device, setting, "met" if met else "MISSED", numbers)


# ------------------------------------------------------------------------------------ c. translation
def benchmark_part(report_rows: List[Row], args: Sequence[str], device: str, name: str, output: Path,
                   timeout: float) -> None:
    """Run the benchmark with ``args``; its train-step rows go into ``report_rows``."""
    markdown = output / f"{name}.md"
    failure = run_benchmark(device, args, markdown, output / "logs" / f"{name}.log", dict(os.environ), timeout)
    if failure is not None:
        report_rows.append(Row(name, device, " ".join(args), "FAILED", failure))
        return
    report_rows.extend(row for row in benchmark_rows(markdown.read_text(encoding="utf-8"), device)
                       if "beam" not in row.check)


def translation_batches(count: int, max_tokens: int, seed: int = 1) -> Iterator[Tuple[int, int]]:
    """(sentences, length) of ``count`` batches of Multi30k-like lengths, 10-120 tokens, as many sentences
    as ``max_tokens`` padded tokens hold."""
    import random

    draw = random.Random(seed)
    for _ in range(count):
        length = draw.randint(10, 120)
        yield max(1, max_tokens // length), length


def compilations(report: Report, sizes: Sizes, device: Any, budget: float, log: Any) -> None:
    """Part c's count: each layer that takes flex_attention (bf16 training on CUDA; the CPU's no-grad
    flex, which is not compiled, in the smoke form) on batches of changing lengths; the graphs
    ``torch._dynamo`` compiled for it."""
    import torch
    from torch._dynamo.utils import counters

    from posattn.attention import FLEX
    from posattn.position_context import PositionContext

    dtype, mode = (torch.bfloat16, "training") if device.type == "cuda" else (torch.float32, "scoring")
    part_started = time.monotonic()
    for name, side, values in layer_variants():
        if time.monotonic() - part_started > budget:
            report.notes.append(f"Compilations: stopped at {name} ({side}) after the {budget:.0f} s budget.")
            return
        causal = side == "decoder"
        attn = build_layer(side, causal, values, sizes, 128, dtype, device)
        if (mode, FLEX) not in fused_paths(attn, device):
            continue
        attn.train(mode == "training")
        attn.kernel = "flex"
        counters.clear()
        started = time.monotonic()
        for sentences, length in translation_batches(sizes.batches, sizes.max_tokens):
            lengths = [length] + [max(1, length - 1 - i % 7) for i in range(sentences - 1)]
            ctx = PositionContext.example(lengths, causal, causal, device, attn.all_terms())
            x = torch.randn(length, len(lengths), sizes.heads * sizes.head_dim, device=device, dtype=dtype,
                            requires_grad=attn.training)
            mask = torch.triu(torch.full((length, length), float("-inf"), device=device, dtype=dtype), 1)
            with torch.set_grad_enabled(attn.training):
                out = attn(x, x, x, key_padding_mask=ctx, attn_mask=mask if causal else None, need_weights=False)[0]
                if attn.training:
                    out.float().sum().backward()
        report.compilations.append(dict(variant=f"{name} ({side}, {mode})", batches=sizes.batches,
                                        graphs=counters["stats"]["unique_graphs"], seconds=time.monotonic() - started))
        log(f"{name} ({side}): {report.compilations[-1]['graphs']} graphs compiled over {sizes.batches} batches")
        report.write()


# ------------------------------------------------------------------------------------ main
def parse_cli(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--tiny", action="store_true", help="the smoke sizes (with --device cpu)")
    parser.add_argument("--output", type=Path, default=Path("gpu-verify-output"))
    parser.add_argument("--parts", nargs="+", choices=("correctness", "long", "translation"),
                        default=["correctness", "long", "translation"])
    parser.add_argument("--correctness-budget", type=float, default=240.0,
                        help="seconds part a may take before it stops (default: %(default)s)")
    parser.add_argument("--jobs", type=int, default=None,
                        help="processes that check configurations side by side (default on CUDA: "
                        "min(8, max(4, CPU cores // 2)), since compiling flex_attention is CPU-bound; 1 on the CPU)")
    parser.add_argument("--long-budget", type=float, default=120.0,
                        help="seconds part b may take before it stops (default: %(default)s)")
    parser.add_argument("--compilations-budget", type=float, default=40.0,
                        help="seconds part c's compilation count may take before it stops (default: %(default)s)")
    parser.add_argument("--timeout", type=float, default=100.0,
                        help="seconds part c's benchmark command may take (default: %(default)s; the defaults sum "
                        "to about 10 minutes)")
    cli = parser.parse_args(argv)
    if cli.device == "cpu" and not cli.tiny:
        parser.error("--device cpu runs the smoke form only: add --tiny")
    return cli


def default_jobs(device: Any) -> int:
    """Part a's processes: on CUDA half the CPU cores (compiling flex_attention is CPU-bound), 4 to 8; 1 on the CPU."""
    return min(8, max(4, (os.cpu_count() or 8) // 2)) if device.type == "cuda" else 1


def header(machine: Any) -> List[str]:
    import torch

    return [f"- device: {machine.describe()}", f"- torch {torch.__version__}, CUDA {torch.version.cuda}",
            f"- started {time.strftime('%Y-%m-%d %H:%M:%S')}"]


def main(argv: Optional[Sequence[str]] = None) -> int:
    cli = parse_cli(argv)
    try:
        machine = detect_machine(cli.device)
    except NoDevice as error:
        print(str(error).replace("gpu_check", "gpu_verify").replace("make gpu-check", "make gpu-verify")
              .replace("gpu_check.py", "gpu_verify.py"), file=sys.stderr)
        return 2
    import torch

    import fairseq_posattn  # noqa: F401  (imports fairseq, which sets the root logger to DEBUG)
    logging.getLogger().setLevel(logging.WARNING)
    started = time.monotonic()

    def log(message: str) -> None:
        print(f"[gpu-verify {time.monotonic() - started:5.0f} s] {message}", flush=True)

    sizes, device = (TINY if cli.tiny else GPU), torch.device(cli.device)
    report = Report(cli.output, machine.describe(), header(machine))
    report.write()
    if "correctness" in cli.parts:
        jobs = cli.jobs if cli.jobs is not None else default_jobs(device)
        correctness(report, sizes, device, cli.correctness_budget, jobs, log)
    if "long" in cli.parts:
        long_blocks(report, sizes, device, cli.long_budget, log)
    if "translation" in cli.parts:
        compilations(report, sizes, device, cli.compilations_budget, log)
        args = ["--variants", *sizes.translation, "--decode-variants", "--min-len", "10", "--max-len", "120",
                "--max-positions", "128"]
        if cli.tiny:
            args = ["--variants", *sizes.translation, "--decode-variants", "--steps", "1", "--warmup", "0",
                    "--embed-dim", "16", "--ffn-dim", "32", "--heads", "2", "--layers", "1", "--vocab-size", "64",
                    "--max-tokens", "256", "--min-len", "10", "--max-len", "24", "--max-positions", "32",
                    "--threads", "1"]
        benchmark_part(report.translation, args, cli.device, "translation", cli.output, cli.timeout)
    report.notes.append(f"Finished in {time.monotonic() - started:.0f} s.")
    report.write()
    print((cli.output / "report.md").read_text(encoding="utf-8"), end="")
    failed = any(r["verdict"] != "agrees" for r in report.correctness) or any(
        row.result == "FAILED" for row in report.long_blocks + report.translation)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
