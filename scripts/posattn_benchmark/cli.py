"""Command-line options, the profile report and ``main``: parse, run the groups, write the report."""

import argparse
import logging
import os
import sys
from pathlib import Path
from typing import Optional, Sequence, Tuple

import posattn_benchmark
from posattn_benchmark.groups import LONG_LENGTH, Group, build_groups
from posattn_benchmark.header import MALLOC_NOTES
from posattn_benchmark.paths import EWT_DEV, EWT_SAMPLE
from posattn_benchmark.readme import markers, replace_section, section_error
from posattn_benchmark.report import render
from posattn_benchmark.runner import IWSLT_SIZES, Runner, logger, measure_prepare
from posattn_benchmark.variants import (
    DEFAULT_DECODE_VARIANTS, POSATTN_LM_ARCH, VANILLA_LM_ARCH, VARIANT_SETS, VARIANTS_BY_NAME, expand_variant_sets,
)
from posattn_benchmark.worker import PRECISIONS, worker_main

DEVICES = ("cpu", "cuda")


def parse_cli(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=posattn_benchmark.__doc__.split("\n\n")[0])
    add = parser.add_argument
    add("--variants", nargs="+", choices=[*VARIANTS_BY_NAME, *VARIANT_SETS], metavar="NAME",
        help="variants to train, default all (the vanilla baseline always runs): "
        + ", ".join(VARIANTS_BY_NAME) + "; or a set derived from the registry: each-method (the first "
        "variant of every method), lm-each-kernel-path (per method, a language-model row for each set of "
        "CUDA kernel paths its variants take)")
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
    add("--huggingface", action="store_true",
        help="add the Hugging Face group: transformers' LlamaForCausalLM on SDPA with its own RoPE (the language "
        "models' --embed-dim, --ffn-dim and --heads, --hf-layers layers) against the same model switched to each "
        "method by posattn_huggingface.apply_position_method (the hf-* variants; the ones it refuses are listed), "
        "on the language-model sentences: train-step time and greedy generation (model.generate with the cache) "
        "of --decode-length tokens; skipped, with the reason, without transformers")
    add("--hf-layers", type=int, default=4, help="layers of the --huggingface Llama (default: %(default)s)")
    add("--pytorch", action="store_true",
        help="add the plain-PyTorch groups: --layers causal posattn.SelfAttention layers (--embed-dim, --heads) "
        "after a token embedding, sharing one posattn.batch_context per batch, against the same stack of a "
        "hand-written module on F.scaled_dot_product_attention(..., is_causal=True) (the pt-* variants: no method, "
        "and every variant of every causal method), train step (loss: the mean square of the output) and peak "
        "memory on blocks of each --pytorch-lengths")
    add("--pytorch-lengths", type=int, nargs="+", default=[512, 2048, 8192], metavar="N",
        help="with --pytorch: one group per block length (default: %(default)s)")
    add("--pytorch-tokens", type=int, default=8192,
        help="with --pytorch: tokens per batch, the batch = tokens / length blocks (at least 1; default: %(default)s)")
    add("--pytorch-methods-up-to", type=int, default=2048, metavar="N",
        help="with --pytorch: every method in the groups of at most N tokens, the layer without a method alone in "
        "the longer ones (default: %(default)s)")
    add("--skip-short", action="store_true",
        help="leave out the Multi30k-like translation group (to measure only --long, --lm, --pytorch or "
        "--huggingface)")
    add("--lm-batch-size", type=int, default=8,
        help=f"blocks of {LONG_LENGTH} tokens per batch in the --lm blocks group (default: %(default)s)")
    add("--lm-block-lengths", type=int, nargs="+", default=[LONG_LENGTH], metavar="N",
        help="with --lm: one blocks group per length (max positions = the length; default: %(default)s)")
    add("--lm-block-tokens", type=int,
        help="with --lm: tokens per batch of every blocks group, the batch = tokens / length blocks (at "
        "least 1; default: --lm-batch-size blocks)")
    add("--lm-blocks-only", action="store_true",
        help="with --lm: leave out the language-model sentences group")
    add("--precision", choices=PRECISIONS, default="fp32",
        help="dtype of every model and batch's activations: fp32, or bf16 (the model cast to bfloat16, "
        "as fairseq-train --bf16 computes; CUDA or a CPU with bf16; default: %(default)s)")
    add("--decode-batch-size", type=int, default=16,
        help="source sentences per beam-search batch, at most (default: %(default)s)")
    add("--decode-length", type=int, default=20,
        help="tokens of every hypothesis, EOS excluded (default: %(default)s)")
    add("--decode-rounds", type=int, default=15, help="timed decoding rounds (default: %(default)s)")
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
    add("--malloc", choices=list(MALLOC_NOTES), default="reuse",
        help="glibc malloc of the timing workers: `reuse` keeps freed memory for the next allocation "
        "(as jemalloc, tcmalloc or CUDA's allocator), `default` maps and unmaps every large tensor "
        "(page faults at each allocation), `both` times both (the targets are checked on `reuse`; "
        "default: %(default)s)")
    add("--full", action="store_true",
        help="the long run (about an hour on 2 cores): --malloc both, i.e. every group timed again "
        "with glibc's default malloc")
    add("--memory-jobs", type=int, default=2,
        help="memory workers run at once (each measures its own process's peak; the timing and "
        "decoding workers always run alone; default: %(default)s)")
    add("--output", type=Path, help="also write the markdown report to this file")
    add("--readme", type=Path,
        help="also put the report into this markdown file, between the lines {!r} and {!r} (docs/benchmark.md's "
        "current numbers: `make benchmark`), or those of --readme-section".format(*markers(None)))
    add("--readme-section", metavar="NAME",
        help="with --readme: the section between the lines {!r} and {!r} instead (`make benchmark-pytorch`: "
        "pytorch)".format(*markers("NAME")))
    add("--profile", nargs="+", choices=list(VARIANTS_BY_NAME), metavar="NAME",
        help="instead of the measurements, profile the train steps of these variants and of vanilla "
        "with torch.profiler in every group, and print each one's most expensive operators")
    add("--worker", metavar="SPEC_JSON", help=argparse.SUPPRESS)
    cli = parser.parse_args(argv)
    if cli.variants:
        cli.variants = expand_variant_sets(cli.variants)
    if cli.full:
        cli.malloc = "both"
    if (error := resolve_device(cli)) is not None:
        parser.error(error)
    if min(cli.steps, cli.decode_rounds, cli.decode_batch_size, cli.memory_jobs) < 1 or cli.warmup < 0 or (
            cli.threads is not None and cli.threads < 1):
        parser.error("--steps, --decode-rounds, --decode-batch-size, --memory-jobs and --threads must be >= 1, "
                     "--warmup >= 0")
    if not 2 <= cli.min_len <= cli.max_len <= cli.max_positions:
        parser.error("need 2 <= --min-len <= --max-len <= --max-positions")
    if cli.skip_short and not (cli.long or cli.lm or cli.huggingface or cli.pytorch):
        parser.error("--skip-short leaves nothing to measure without --long, --lm, --pytorch or --huggingface")
    if min(cli.pytorch_lengths) < 2 or cli.pytorch_tokens < 1:
        parser.error("--pytorch-lengths must be >= 2, --pytorch-tokens >= 1")
    if cli.hf_layers < 1:
        parser.error("--hf-layers must be >= 1")
    embed_dim, heads = cli.embed_dim or IWSLT_SIZES["embed-dim"], cli.heads or IWSLT_SIZES["attention-heads"]
    if embed_dim % heads:
        parser.error(f"--embed-dim {embed_dim} is not divisible by --heads {heads}: every model would refuse it")
    if min(cli.lm_block_lengths) < 2 or (cli.lm_block_tokens is not None and cli.lm_block_tokens < 2):
        parser.error("--lm-block-lengths and --lm-block-tokens must be >= 2")
    if cli.readme is not None and cli.profile:
        parser.error("--readme takes the benchmark's report, not a --profile")
    if cli.readme_section is not None and cli.readme is None:
        parser.error("--readme-section names a section of the --readme file: give --readme too")
    if cli.readme is not None and (error := section_error(cli.readme, cli.readme_section)) is not None:
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


def profile_report(cli: argparse.Namespace, groups: Sequence[Group], names: Sequence[str]) -> str:
    """torch.profiler tables of vanilla and ``names`` in every group where they apply."""
    runner = Runner(cli, [], [], groups)
    variants = [VARIANTS_BY_NAME[name] for name in dict.fromkeys(names)]
    sections = []
    for group in groups:
        chosen = group.applicable(variants)
        if not chosen:
            continue
        if group.skipped is not None:
            sections.append(f"## {group.title}\n\nskipped: {group.skipped}\n")
            continue
        models = [group.reference, *chosen]
        result = runner.run(group, "profile", models, f"profile of {len(models)} models")
        if result is None:
            sections.append(f"## {group.title}\n\ncrashed: {group.failures['profile']}\n")
            continue
        for variant in (group.reference, *chosen):
            if variant.name in result["refused"]:
                sections.append(f"## {group.title}: {variant.label}\n\nnot in the Hugging Face front-end: "
                                f"{result['refused'][variant.name]}\n")
                continue
            sections.append(f"## {group.title}: {variant.label} {' '.join(variant.flags)}\n\n"
                            f"{cli.steps} train steps, {result['step_ms'][variant.name]:.0f} ms per step "
                            f"under the profiler\n\n```\n{result['tables'][variant.name]}\n```\n")
    return "\n".join(sections)


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
        replace_section(cli.readme, report, cli.readme_section)
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
