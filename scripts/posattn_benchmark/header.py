"""The report's header: the machine, the models' sizes, how each quantity was measured, the batches."""

import argparse
import os
import platform
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from posattn_benchmark.batches import PIECES_PER_WORD
from posattn_benchmark.groups import Group
from posattn_benchmark.paths import display_path
from posattn_benchmark.variants import (
    HUGGINGFACE, HUGGINGFACE_SPEED, LANGUAGE_MODELING, NO_METHOD_TARGET, POSATTN_ARCH, POSATTN_LM_ARCH, PYTORCH,
    REFERENCES, TARGETS_BY_KIND, TRANSLATION, VANILLA_ARCH, VANILLA_LM_ARCH,
)
from posattn_benchmark.worker import BEAM_SIZE, LABEL_SMOOTHING


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
    if task == PYTORCH:
        return pytorch_line(sizes, run["params"], cli)
    if task == LANGUAGE_MODELING:
        count = sizes["decoder_layers"]
        models, layers = f"`{VANILLA_LM_ARCH}` vs `{POSATTN_LM_ARCH}`", f"{count} layer{'s' * (count != 1)}"
    else:
        models = f"`{VANILLA_ARCH}` vs `{POSATTN_ARCH}`"
        layers = f"{sizes['encoder_layers']}+{sizes['decoder_layers']} layers"
    return (f"- Models: {models} (the flags below are on the latter), embed {sizes['embed']}, FFN "
            f"{sizes['ffn']}, {layers}, {sizes['heads']} heads, vocabulary {cli.vocab_size}, dropout "
            f"0.1; vanilla {run['params'] / 1e6:.1f}M parameters.")


def pytorch_line(sizes: Dict[str, int], params: int, cli: argparse.Namespace) -> str:
    """The plain-PyTorch groups' models: their layers, the reference, the step and the no-method bound."""
    layers = sizes["layers"]
    return (f"- Plain PyTorch: a token embedding (vocabulary {cli.vocab_size}) and {layers} causal self-attention "
            f"layer{'s' * (layers != 1)}, each `x = x + attention(x)`, embed {sizes['embed_dim']}, {sizes['heads']} "
            "heads, no dropout; the reference's layers are a hand-written module (`q_proj`, `k_proj`, `v_proj`, "
            "`out_proj`) calling `F.scaled_dot_product_attention(q, k, v, is_causal=True)` "
            f"({params:,} parameters), each row's are `posattn.SelfAttention` layers of the same "
            "projections built from one `posattn.position_options(True, max_positions, **options)` (the options "
            "below), sharing one `posattn.batch_context(None, True, length)` per batch. Step: forward, the mean "
            "square of the last layer's output as the loss, backward, Adam. Bounds: no method "
            f"<= {NO_METHOD_TARGET.time:.2f} / {NO_METHOD_TARGET.memory:.2f}, a method its kind's (as above).")


def huggingface_lines(group: Group, cli: argparse.Namespace) -> List[str]:
    """The Hugging Face group's lines: its models (from its worker), its step, generation and targets."""
    if not group.about:
        return [f"- {group.title}: {group.skipped or 'crashed'}."]
    sizes = group.about["sizes"]
    layers = sizes["num_hidden_layers"]
    additive, explicit = TARGETS_BY_KIND["additive"].time, TARGETS_BY_KIND["key_value"].time
    return [
        f"- {group.title}: `transformers.LlamaForCausalLM` (transformers {group.about['transformers']}), hidden "
        f"{sizes['hidden_size']}, intermediate {sizes['intermediate_size']}, {layers} layer{'s' * (layers != 1)}, "
        f"{sizes['num_attention_heads']} heads ({sizes['num_key_value_heads']} key/value heads), vocabulary "
        f"{cli.vocab_size}, max positions {group.max_positions}, {group.about['params'] / 1e6:.1f}M parameters, "
        "on `attn_implementation=\"sdpa\"` with its own RoPE, against the same model (the same weights) switched "
        "by `posattn_huggingface.apply_position_method(model, **options)` (a row per variant of every method a "
        "causal model takes; the ones the front-end refuses are listed as such). Step: forward (the right-padded "
        "sentences of the language-model group, their attention mask, `use_cache=False`) + cross entropy + "
        "backward + Adam, round-robin as above. Generation: `model.generate(do_sample=False, "
        f"min_new_tokens=max_new_tokens={cli.decode_length})` with the cache, eval mode, batches of "
        f"{cli.decode_batch_size} of those sentences as left-padded prompts, round-robin, warm-up rounds: "
        f"{cli.warmup}, timed rounds: {cli.decode_rounds}; tokens/s: the generated tokens over the summed time; "
        "speed ratio: median over the rounds of the reference's time over the model's. One worker process runs "
        f"both, no memory run. Targets: step time <= {additive:.2f} for additive terms, <= {explicit:.2f} for "
        f"explicit-path ones (by the method's kind, as above), generation speed >= {HUGGINGFACE_SPEED:.2f}.",
    ]


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
    transformers = "".join(f", transformers {group.about['transformers']}" for group in groups if group.about)
    lines = [
        "# transformer_posattn vs fairseq transformer: train step, peak memory, beam search",
        "",
        f"- Machine: {cpu_name()}, {os.cpu_count()} CPUs, {sample['threads']} torch threads, "
        f"device {sample['device']}; torch {sample['torch']}, fairseq {sample['fairseq']}{transformers}, "
        f"Python {platform.python_version()}; models in {cli.precision}; 1-minute load average {load[0]:.1f} at the start, "
        f"{load[1]:.1f} at the end.",
    ]
    lines += [line for task in (TRANSLATION, LANGUAGE_MODELING, PYTORCH)
              if (line := model_line(groups, task, cli)) is not None]
    if any(group.task == TRANSLATION for group in groups):
        lines.append(
            f"- Structural side data: each source of m BPE pieces gets a forest of real UD EWT trees "
            f"(`{display_path(str(cli.conllu))}`) of about m / {PIECES_PER_WORD} words, the extra pieces "
            "as subwords of random words; depth, tin and tout per token as `--task translation_structural` "
            "collates them, computed once per process outside every timed region.")
    if any(group.task in (TRANSLATION, LANGUAGE_MODELING) for group in groups):
        lines.append(f"- Step: forward + label-smoothed cross entropy (eps {LABEL_SMOOTHING}; language models: "
                     "plain cross entropy) + backward + Adam, on the same batches for every model (checked by hash).")
    lines += [
        f"- Time: one process runs every model of a group round-robin, one step each per batch, order "
        f"rotated per round; warm-up rounds: {cli.warmup}, then timed rounds: {cli.steps} "
        "(time.perf_counter). Step time: median over the rounds; time ratio: median over the rounds "
        f"of the step time over vanilla's in the same round. {MALLOC_NOTES[cli.malloc]}",
    ]
    if any(group.measures_memory for group in groups):
        lines.append(f"- Peak memory: each model alone in a fresh process, two steps (the first batch, then the "
                     f"largest, with the Adam state in place), {memory_method}; vanilla runs first and last, its "
                     "row is their mean.")
    if cli.decode_variants and any(group.task != HUGGINGFACE and group.decodes for group in groups):
        lines.append(
            f"- Decoding: fairseq's SequenceGenerator as fairseq-generate builds it (beam {BEAM_SIZE}, "
            "length penalty 1, normalized scores), eval mode, the source's `net_input` to the encoder "
            "(a language model, which has none, decodes incrementally from the start, as fairseq-generate "
            "--task language_modeling does without a prefix); "
            f"untrained models, so every hypothesis is forced to {cli.decode_length} tokens + EOS "
            f"(min_len = max_len_b = {cli.decode_length}, max_len_a = 0) and every model decodes the "
            f"same number of steps; one process, round-robin as above, warm-up rounds: {cli.warmup}, "
            f"timed rounds: {cli.decode_rounds}. Sentences/s: the timed rounds' sentences over their "
            "summed time; speed ratio: median over the rounds of vanilla's time over the model's (above "
            "1 is faster).")
    lines.append("- Targets: the ratio bounds for each kind of term (time / memory; speed for decoding: >= 0.90 "
                 "for every model with decoder terms, >= 0.95 for the structural ones' beam search, >= 0.75 for "
                 "the convolutions' greedy steps), checked on the ratios as printed.")
    for group in groups:
        if group.task == HUGGINGFACE:
            lines += huggingface_lines(group, cli)
            continue
        if group.greedy:
            lines.append(f"- {group.title}: `model.decoder(tokens, incremental_state=state)` once per token, the "
                         "argmax appended (greedy, as a sampling loop runs a language model), in eval mode without "
                         f"gradients; --tokens-per-sample and --max-target-positions {group.max_positions}; the "
                         "short contexts where a step's fixed costs weigh most. The models step in lockstep: at "
                         "each token every model takes its step, in an order rotated from token to token, each "
                         "step timed alone.")
            continue
        shapes = next((runs[0]["batch_shapes"] for runs in group.memory.values()), [])
        seen = ", ".join(sorted({f"{b} x {t}" for b, t in shapes})) or "none"
        if group.task == LANGUAGE_MODELING:
            lines.append(f"- {group.title}: {group.shape.describe()} (batches of {seen} tokens), "
                         f"--tokens-per-sample and --max-target-positions {group.max_positions}.")
            continue
        if group.task == PYTORCH:
            rows = "every row" if group.only is None else "the layer without a method alone"
            lines.append(f"- {group.title}: {group.shape.describe()} (batches of {seen} tokens, no pad), max "
                         f"positions {group.max_positions}; {rows}.")
            continue
        decoded = sorted({f"{b} x {t}" for b, t in group.decode_shapes})
        decoding = f"; decoding: {', '.join(decoded) or 'none'}" if group.decode_shapes else ""
        lines.append(f"- {group.title}: {group.shape.describe()} (source batches of "
                     f"{seen} tokens{decoding}), --max-source/target-positions {group.max_positions}.")
    return lines
