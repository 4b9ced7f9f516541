"""The parent side: runs the worker subprocesses of every group in order (each measurement in a fresh
process, with the malloc settings of its kind), checks that they all saw the same batches, and runs
the structural prepare timing of ``scripts/benchmark_structure.py``. The Hugging Face group runs in one worker
(no memory runs), or not at all where transformers is missing."""

import argparse
import json
import logging
import os
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from posattn_benchmark.groups import Group
from posattn_benchmark.paths import PACKAGE_DIR, STRUCTURE_BENCHMARK
from posattn_benchmark.variants import HUGGINGFACE, LANGUAGE_MODELING, PYTORCH, Variant
from posattn_benchmark.worker import RESULT_MARKER, LlamaSpec, WorkerSpec
from posattn_tools.runs import capture, side_flags

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
#: ``transformer_iwslt_de_en``'s sizes, which the language models take too ("of the same size")
IWSLT_SIZES = {"embed-dim": 512, "ffn-embed-dim": 1024, "attention-heads": 4}

logger = logging.getLogger("benchmark")


def measure(spec: WorkerSpec, env: Dict[str, str]) -> Dict[str, Any]:
    """Run one worker subprocess (:func:`posattn_tools.runs.capture`) with ``env`` added to the environment;
    raise ``RuntimeError`` carrying its stderr if it fails."""
    completed = capture([sys.executable, str(PACKAGE_DIR), "--worker", spec.to_json()], {**os.environ, **env})
    for line in reversed(completed.stdout.splitlines()):
        if completed.returncode == 0 and line.startswith(RESULT_MARKER):
            return json.loads(line[len(RESULT_MARKER):])
    raise RuntimeError(completed.stderr.strip() or f"worker exited with status {completed.returncode}")


def measure_prepare(conllu: Path) -> Dict[str, Any]:
    """The structural prepare timing of ``scripts/benchmark_structure.py`` (one thread, parse excluded)
    on ``conllu``: the rates of its steps and its speed ratio to fairseq-preprocess binarizing the same
    BPE text (``fairseq_preprocess``); raise ``RuntimeError`` carrying its stderr if it fails."""
    command = [sys.executable, str(STRUCTURE_BENCHMARK), "--conllu", str(conllu), "--skip-parse", "--json"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    completed = capture(command, env)
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
        # memory runs (vanilla twice), timing (once or twice), decoding; the Hugging Face group's one worker
        self.total = sum(1 if group.task == HUGGINGFACE else
                         (len(group.applicable(self.variants)) + 3 + self.also_default_malloc) * group.trains
                         + bool(group.decoders(self.decode_variants)) for group in groups)

    def spec(self, group: Group, mode: str, variants: Sequence[Variant]) -> WorkerSpec:
        cli = self.cli
        decoding = mode == "decoding"
        return WorkerSpec(mode=mode, task=group.task, variants=tuple(variants),
                          size_flags=() if group.task in (HUGGINGFACE, PYTORCH) else size_flags(cli, group.task),
                          max_positions=group.max_positions,
                          shape=group.shape.sentences(cli.decode_batch_size) if decoding and not group.greedy
                          else group.shape,
                          vocab_size=cli.vocab_size, warmup=cli.warmup,
                          steps=cli.decode_rounds if decoding else cli.steps, seed=cli.seed,
                          device=cli.device, threads=cli.threads, conllu=str(cli.conllu),
                          decode_length=group.decode_length or cli.decode_length, precision=cli.precision,
                          greedy=group.greedy, llama=self.llama_spec(group) if group.task == HUGGINGFACE else None,
                          pytorch=pytorch_sizes(cli) if group.task == PYTORCH else None)

    def llama_spec(self, group: Group) -> LlamaSpec:
        """The Hugging Face group's Llama sizes and generation: ``--decode-batch-size`` prompts, ``--decode-rounds``
        rounds, by the ``--decode-variants`` of the group and the reference."""
        generated = [variant.name for variant in group.decoders(self.decode_variants)]
        return LlamaSpec(llama_sizes(self.cli), self.cli.decode_batch_size, self.cli.decode_rounds,
                         tuple([group.reference.name, *generated] if generated else []))

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
        the decoding speed of vanilla and the decoding variants (the Hugging Face group: :meth:`run_huggingface`)."""
        if group.task == HUGGINGFACE:
            self.run_huggingface(group)
            return
        reference, variants = group.reference, group.applicable(self.variants)
        if group.trains:
            self.measure_memory(group, [reference, *variants, reference])
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
        decode_variants = group.decoders(self.decode_variants)
        if decode_variants:
            decoders = [reference, *decode_variants]
            result = self.run(group, "decoding", decoders, f"{'greedy decoding' if group.greedy else 'beam search'} "
                              f"of {len(decoders)} models, {'in lockstep' if group.greedy else 'round-robin'}")
            if result is not None:
                group.decoding = result["decode_ms"]
                group.decode_sentences = result["sentences"]
                group.decode_shapes = result["batch_shapes"]

    def run_huggingface(self, group: Group) -> None:
        """The Hugging Face group in one worker: the round-robin train steps of the reference and of every
        variant, then the greedy generation of the reference and the decoding variants; the worker records the
        variants whose method the front-end refuses. Skipped, with the reason logged, where transformers is
        missing."""
        if group.skipped is not None:
            self.done += 1
            logger.warning("[%d/%d] %s: skipped: %s", self.done, self.total, group.title, group.skipped)
            return
        models: List[Variant] = list(dict.fromkeys([group.reference, *group.applicable(self.variants),
                                                    *group.decoders(self.decode_variants)]))
        result = self.run(group, "huggingface", models,
                          f"train steps and greedy generation of {len(models)} models, round-robin")
        if result is not None:
            group.timing, group.refused, group.about = result["step_ms"], result["refused"], result["about"]
            group.decoding, group.decode_sentences = result["decode_ms"], result["sentences"]
            group.decode_shapes = result["batch_shapes"]
            for name, refusal in group.refused.items():
                logger.info("    not in the Hugging Face front-end: %s: %s", name, refusal)

    def measure_memory(self, group: Group, variants: Sequence[Variant]) -> None:
        """The memory workers of ``variants``, ``--memory-jobs`` at a time (a peak RSS is its own
        process's, so concurrent workers do not disturb each other's measurement), in order."""
        def one(variant: Variant) -> Optional[Dict[str, Any]]:
            return self.run(group, "memory", [variant],
                            f"memory of {variant.label} {' '.join(variant.flags)}".rstrip())

        with ThreadPoolExecutor(max_workers=self.cli.memory_jobs) as pool:
            results = list(pool.map(one, variants))
        for variant, result in zip(variants, results):
            if result is not None:
                group.memory.setdefault(variant.name, []).append(result)
                logger.info("    peak of %s: %.0f MB", variant.label, result["peak_mb"])


def llama_sizes(cli: argparse.Namespace) -> Dict[str, int]:
    """The Hugging Face Llama's ``LlamaConfig`` sizes: the language models' (the iwslt preset's, overridden by
    ``--embed-dim``, ``--ffn-dim``, ``--heads``; a key/value head per head, as theirs), ``--hf-layers`` layers."""
    heads = cli.heads or IWSLT_SIZES["attention-heads"]
    return {"hidden_size": cli.embed_dim or IWSLT_SIZES["embed-dim"],
            "intermediate_size": cli.ffn_dim or IWSLT_SIZES["ffn-embed-dim"], "num_hidden_layers": cli.hf_layers,
            "num_attention_heads": heads, "num_key_value_heads": heads}


def pytorch_sizes(cli: argparse.Namespace) -> Dict[str, int]:
    """The plain-PyTorch group's layers: the iwslt preset's width and heads (overridden by ``--embed-dim`` and
    ``--heads``), ``--layers`` layers."""
    return {"embed_dim": cli.embed_dim or IWSLT_SIZES["embed-dim"],
            "heads": cli.heads or IWSLT_SIZES["attention-heads"],
            "layers": cli.layers}


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
    return tuple(side_flags(sides, overrides))

