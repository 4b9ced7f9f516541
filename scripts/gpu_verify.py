"""``make gpu-verify``: the fused attention paths proven and timed on a GPU, in one short run.

Three parts, in this order, each table written to ``report.md`` and ``results.json`` as soon as it is
done, so that a run cut off by its time limit still returns the most important part:

a. **correctness**: every kernel path each registered method's layers can take on the device (the
   path ``auto`` takes in training and in scoring, and flex_attention wherever the terms allow it),
   against the explicit path (``kernel_self_check.compare_paths``): forward and every gradient, fp32
   and bf16, left and right padding, causal and not, at lengths that cover the kernels' known failure
   modes (not a multiple of 128, length % 128 == 64); the self-check's own batch (200 / 137) is one of
   them, its time the check's cost. Compilation dominates: the configurations run in order of use
   (language models first) until ``--correctness-budget`` seconds are spent.
b. **long blocks**: the benchmark's language-model blocks group, ``transformer_lm_posattn`` against
   fairseq's ``transformer_lm`` (d 512, 8 heads, 6 layers, bf16) at 512-4,096 tokens: train-step time
   and peak-memory ratios per method and kernel path.
c. **translation lengths**: ``torch._dynamo``'s compilations over 200 batches of Multi30k-like lengths
   (10-120 tokens) for each method that takes flex_attention, then the benchmark's translation group
   at those lengths.

``--device cpu --tiny`` is the smoke form (the test suite runs it): the same code at toy sizes.
"""

import argparse
import json
import logging
import os
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

from gpu_check import BENCHMARK, FULL_LONG_LM, TINY_LONG_LM, CommandError, NoDevice, Row, benchmark_rows, \
    detect_machine, run

#: (longest, shortest) sentence of each correctness batch; the self-check's batch among them
GPU_LENGTHS = ((17, 11), (127, 84), (192, 128), (200, 137), (513, 342), (1000, 667))
TINY_LENGTHS = ((17, 11), (40, 26))
#: where a side's layers run: (causal, right-padded), language models first
SIDES = (("decoder", True, True), ("encoder", False, False), ("encoder", False, True))
#: the methods whose benchmark variants take flex_attention on CUDA, and those that missed on an H100
TRANSLATION_VARIANTS = ("san-p-r", "t5-bias", "conv-1d", "rotary", "direct-absolute", "direct-relative",
                        "distance-aware", "shaw-keys-only")
TINY_TRANSLATION_VARIANTS = ("t5-bias",)
#: the structural method's keys-only form (its variants need parses, so the registry lists none)
STRUCTURAL_KEYS_ONLY = {"structural_positions": "relative", "structural_keys_only": True}


@dataclass
class Sizes:
    heads: int
    head_dim: int
    lengths: Tuple[Tuple[int, int], ...]
    dtypes: Tuple[str, ...]
    long_lm: Tuple[str, ...]
    translation: Tuple[str, ...]
    batches: int
    max_tokens: int
    sides: Tuple[Tuple[str, bool, bool], ...] = SIDES


GPU = Sizes(8, 64, GPU_LENGTHS, ("float32", "bfloat16"), FULL_LONG_LM, TRANSLATION_VARIANTS, 200, 4096)
TINY = Sizes(2, 8, TINY_LENGTHS, ("float32",), TINY_LONG_LM, TINY_TRANSLATION_VARIANTS, 6, 256, SIDES[:2])


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
                  "| variant | side | mode | dtype | path | verdict | largest error (tensor, lengths) | "
                  "self-check batch |", "|---|---|---|---|---|---|---|---|"]
        lines += [f"| {r['variant']} | {r['side']} | {r['mode']} | {r['dtype']} | {r['path']} | {r['verdict']} | "
                  f"{r['largest']:.1e} ({r['tensor']}, {r['at']}) | {r['check_seconds']:.3f} s |"
                  for r in self.correctness]
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
    from fairseq_posattn.modules.position_terms.registry import methods_of

    for side in ("decoder", "encoder"):
        for method in methods_of(side):
            for name, values in method.variants.items():
                yield name, side, dict(values)
    yield "structural-keys-only", "encoder", STRUCTURAL_KEYS_ONLY


def build_layer(side: str, causal: bool, values: Dict[str, Any], sizes: Sizes, max_positions: int, dtype: Any,
                device: Any) -> Any:
    """One attention layer of ``values`` with random parameters (most start at zero), on ``device``."""
    import torch

    from fairseq_posattn.models.position_options import SidePositionOptions
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

    from fairseq_posattn.modules.attention import EXPLICIT, FLEX

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


def correctness(report: Report, sizes: Sizes, device: Any, budget: float, log: Any) -> None:
    """Part a: every configuration until ``budget`` seconds are spent (module docstring)."""
    import torch

    from fairseq_posattn.modules.kernel_self_check import CHECK_LENGTHS, compare_paths
    from fairseq_posattn.modules.position_context import PositionContext
    from fairseq_posattn.models.position_options import PositionOptionError

    torch._dynamo.config.cache_size_limit = 256  # one compilation per configuration, kept
    started = time.monotonic()
    configurations = [(name, side, values, causal, right, dtype_name)
                      for side_name, causal, right in sizes.sides for name, side, values in layer_variants()
                      if side == side_name for dtype_name in sizes.dtypes]
    longest = max(length for length, _ in sizes.lengths)
    for done, (name, side, values, causal, right, dtype_name) in enumerate(configurations):
        if time.monotonic() - started > budget:
            report.notes.append(f"Correctness: {len(configurations) - done} of {len(configurations)} layer "
                                f"configurations not reached within the {budget:.0f} s budget.")
            return
        dtype = getattr(torch, dtype_name)
        try:
            attn = build_layer(side, causal, values, sizes, longest, dtype, device)
        except PositionOptionError as error:  # e.g. the 1d convolution's t limit
            log(f"{name}: {error}")
            continue
        for mode, path in fused_paths(attn, device):
            attn.train(mode == "training")
            attn.kernel = "flex" if path == "flex_attention" else "auto"
            found = []
            for lengths in sizes.lengths:
                ctx = PositionContext.example(lengths, right, causal, "structural" in name, device)
                comparison = compare_paths(attn, path, ctx, dtype, gradients=mode == "training")
                found.append((comparison, lengths))
            worst, at = max(found, key=lambda item: item[0].largest[1])
            check = [c.seconds for c, lengths in found if lengths == CHECK_LENGTHS] or [found[-1][0].seconds]
            padding = "right" if right else "left"
            report.correctness.append(dict(
                variant=name, side=f"{'causal' if causal else 'bidirectional'}, {padding}-padded", mode=mode,
                dtype=dtype_name, path=path, verdict="agrees" if all(c.agrees for c, _ in found) else "DISAGREES",
                largest=worst.largest[1], tensor=worst.largest[0], at="/".join(map(str, at)),
                check_seconds=check[0], errors={"/".join(map(str, lengths)): c.errors for c, lengths in found}))
            log(f"{name} {side} {mode} {dtype_name} {path}: {report.correctness[-1]['verdict']} "
                f"(largest {worst.largest[1]:.1e} in {worst.largest[0]})")
            report.write()


# ------------------------------------------------------------------------------------ b, c. benchmark
def benchmark_part(report_rows: List[Row], args: Sequence[str], device: str, name: str, output: Path,
                   timeout: float) -> None:
    """Run the benchmark with ``args``; its train-step rows go into ``report_rows``."""
    markdown = output / f"{name}.md"
    command = [sys.executable, str(BENCHMARK), "--device", device, "--skip-prepare", "--malloc", "reuse",
               *args, "--output", str(markdown)]
    try:
        run(command, output / "logs" / f"{name}.log", dict(os.environ), timeout)
    except CommandError as error:
        if not markdown.exists():
            report_rows.append(Row(name, device, " ".join(args), "FAILED", str(error)))
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

    from fairseq_posattn.modules.attention import FLEX
    from fairseq_posattn.modules.position_context import PositionContext

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
            ctx = PositionContext.example(lengths, causal, causal, "structural" in name, device)
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
    parser.add_argument("--correctness-budget", type=float, default=200.0,
                        help="seconds part a may take before it stops (default: %(default)s)")
    parser.add_argument("--compilations-budget", type=float, default=60.0,
                        help="seconds part c's compilation count may take before it stops (default: %(default)s)")
    parser.add_argument("--timeout", type=float, default=170.0,
                        help="seconds each benchmark command may take (default: %(default)s; the defaults sum to "
                        "about 10 minutes)")
    cli = parser.parse_args(argv)
    if cli.device == "cpu" and not cli.tiny:
        parser.error("--device cpu runs the smoke form only: add --tiny")
    return cli


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
        correctness(report, sizes, device, cli.correctness_budget, log)
    if "long" in cli.parts:
        benchmark_part(report.long_blocks, ["--skip-short", "--lm", "--lm-blocks-only", *sizes.long_lm],
                       cli.device, "long-blocks", cli.output, cli.timeout)
        report.write()
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
