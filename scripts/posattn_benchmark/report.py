"""The markdown report: header lines on the machine, models and method, the train-step and beam-search
tables with a row group per batch shape, the Hugging Face group's table, the structural prepare table, the
targets and the noise."""

import argparse
import statistics
from typing import Any, Dict, List, Optional, Sequence, Tuple

from posattn_benchmark.groups import Group
from posattn_benchmark.header import header_lines
from posattn_benchmark.paths import display_path
from posattn_benchmark.stats import (CHECKS, PREPARE_TARGET, memory_ratio, peak_mb, prepare_check, speed_ratio,
                                    target_checks, time_ratio)
from posattn_benchmark.variants import HUGGINGFACE, PYTORCH, TARGETS, VARIANTS_BY_NAME, Variant
from posattn_benchmark.worker import BEAM_SIZE

#: relative spread of vanilla's step times beyond which the report warns that the machine was busy
NOISE_WARNING = 0.10
#: the row of ``scripts/benchmark_structure.py`` that the target applies to: what
#: ``posattn-prepare-structure`` runs per sentence
PREPARE_STEP = "align + side data + binarize"


def flags_cell(variant: Variant) -> str:
    """A row's flags; a plain-PyTorch row's keyword options as written in Python."""
    if variant.task == PYTORCH:
        return f"`{', '.join(variant.flags)}`" if variant.flags else f"`{variant.arch}`"
    if variant.flags:
        return "`" + " ".join(variant.flags) + "`"
    return f"`--arch {variant.arch}`"


def ratio_cell(ratio: Optional[float]) -> str:
    return "" if ratio is None else f"{ratio:.2f}"


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
    for variant in (reference, *group.decoders(variants)):
        rate = sentences / (sum(group.decoding[variant.name]) / 1000)
        rows.append(f"| {variant.label} | {flags_cell(variant)} | {rate:.1f} | "
                    f"{ratio_cell(speed_ratio(group, variant.name))} "
                    f"| {target_cell(group, variant.name, ('speed',))} |")
    return rows


def options_cell(group: Group, variant: Variant) -> str:
    """A Hugging Face row's ``apply_position_method`` options as written in Python (the reference: not
    switched)."""
    if variant == group.reference:
        return "not switched (`attn_implementation=\"sdpa\"`)"
    return f"`{', '.join(variant.flags)}`" if variant.flags else "none"


def huggingface_row(group: Group, variant: Variant, new_tokens: int) -> str:
    """One row of the Hugging Face table: step time and ratio, tokens/s of generation and ratio, target; or the
    front-end's refusal."""
    if variant.name in group.refused:
        return (f"| {variant.label} | {options_cell(group, variant)} | not in the Hugging Face front-end: "
                f"{group.refused[variant.name]} | | | | |")
    times, generated = group.timing.get(variant.name), group.decoding.get(variant.name)
    step = f"{statistics.median(times):.0f}" if times else "not timed"
    rate = (f"{sum(group.decode_sentences) * new_tokens / (sum(generated) / 1000):.0f}" if generated
            else "not generated")
    step_ratio, generation_ratio = time_ratio(group, variant.name), speed_ratio(group, variant.name)
    return (f"| {variant.label} | {options_cell(group, variant)} | {step} | {ratio_cell(step_ratio)} | {rate} "
            f"| {ratio_cell(generation_ratio)} | {target_cell(group, variant.name, ('time', 'speed'))} |")


def huggingface_lines(group: Group, variants: Sequence[Variant], decode_variants: Sequence[Variant],
                      new_tokens: int) -> Tuple[List[str], str]:
    """The Hugging Face group's table (its train-step and generation columns; a row per variant and decoding
    variant, the front-end's refusals among them), and a line on its baseline's noise."""
    lines = ["", f"**{group.title}**", ""]
    if group.skipped is not None:
        return lines + [f"Skipped: {group.skipped}."], f"skipped ({group.skipped})"
    if "huggingface" in group.failures:
        return lines + [f"Crashed: {group.failures['huggingface']}"], "crashed, so nothing was timed"
    lines += ["| method | `apply_position_method` options | step time (ms) | time ratio | generation (tokens/s) "
              "| speed ratio | target |", "|---|---|---:|---:|---:|---:|---|"]
    rows = dict.fromkeys([group.reference, *group.applicable(variants), *group.decoders(decode_variants)])
    lines += [huggingface_row(group, variant, new_tokens) for variant in rows]
    reference = group.timing.get(group.reference.name)
    return lines, "step time " + spread(reference) if reference else "not timed"


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
        ratio, met = prepare_check(prepare)
        lines.append(f"- Structural prepare ({PREPARE_STEP}): {ratio:.2f}x as fast as fairseq-preprocess "
                     f"binarizing the same BPE text (target >= {PREPARE_TARGET:.2f}: {'met' if met else 'MISSED'}); "
                     f"{prepare['rates'][PREPARE_STEP]:,.0f} sentences/s on one core.")
    return lines


def prepare_lines(prepare: Dict[str, Any]) -> List[str]:
    """The structural prepare section: the source, a table of sentences per second and the speed ratio
    to fairseq-preprocess binarizing the same text."""
    lines = [
        "", "**Structural prepare** (`scripts/benchmark_structure.py --skip-parse`: one process, "
        f"one thread, the best of {prepare['repeat']} runs, the parse excluded) on "
        f"`{display_path(prepare['conllu'])}`: {prepare['sentences']} sentences, "
        f"{prepare['pieces_per_sentence']:.1f} BPE pieces per sentence ({prepare['bpe_merges']} "
        "merges learned on its words).",
        "", "| step | sentences/s (one core) |", "|---|---:|",
    ]
    lines += [f"| {step} | {rate:,.0f} |" for step, rate in prepare["rates"].items()]
    versus = prepare["fairseq_preprocess"]
    cpu = versus["cpu"]
    lines += [
        "", f"Against fairseq (the same BPE text, {versus['rounds']} paired rounds in the same process: "
        "`fairseq-preprocess --only-source --srcdict ... --workers 1`, less its cost for a one-line file, then "
        f"`write_side_data`): {cpu['fairseq_rate']:,.0f} against {cpu['structure_rate']:,.0f} sentences/s of "
        f"CPU time, ratio {cpu['ratio']:.2f} (median; rounds {min(cpu['ratios']):.2f}-{max(cpu['ratios']):.2f}; "
        f"by the wall clock {versus['wall']['ratio']:.2f}).",
    ]
    return lines


def render(groups: Sequence[Group], variants: Sequence[Variant], decode_variants: Sequence[Variant],
           prepare: Optional[Dict[str, Any]], cli: argparse.Namespace, load: Tuple[float, float]) -> str:
    """The report: header lines, the train-step table and the decoding table with a row group per
    batch shape, the Hugging Face group's table, the structural prepare table, the targets and the baselines'
    noise.

    ``load`` is the 1-minute load average at the start and at the end of the run."""
    sample = next((runs[0] for g in groups for runs in g.memory.values()),
                  next((g.about for g in groups if g.about), None))
    if sample is None:
        skipped = [f"- {group.title}: skipped: {group.skipped}." for group in groups if group.skipped is not None]
        return "\n".join(["Nothing was measured: every run crashed or was skipped; see the log above.",
                          *skipped]) + "\n"
    lines = header_lines(groups, cli, load, sample)
    default_malloc = any(group.timing_default_malloc for group in groups)
    default_header, default_rule = (" time ratio, default malloc |", "---:|") if default_malloc else ("", "")
    training_groups = [group for group in groups if group.measures_memory]
    if training_groups:
        lines += ["", "**Train step**", "",
                  f"| variant | flags | step time (ms) | time ratio |{default_header} peak memory (MB) "
                  "| memory ratio | target |",
                  f"|---|---|---:|---:|{default_rule}---:|---:|---|"]
    notes = []
    for group in training_groups:
        rows, noise = group_rows(group, variants, default_malloc)
        lines.append(f"| **{group.title}** |" + " |" * (6 + default_malloc))
        lines += rows
        notes.append(f"- Baseline, {group.title}: {noise}.")
    decoding_groups = [group for group in groups if group.task != HUGGINGFACE and group.decoders(decode_variants)]
    if decoding_groups:
        lines += ["", "**Decoding**", "", "| variant | flags | sentences/s | speed ratio | target |",
                  "|---|---|---:|---:|---|"]
        for group in decoding_groups:
            how = "" if group.greedy else f": beam {BEAM_SIZE}, {cli.decode_length} tokens + EOS per hypothesis"
            lines.append(f"| **{group.title}{how}** | | | | |")
            lines += decode_rows(group, decode_variants)
    for group in (group for group in groups if group.task == HUGGINGFACE):
        table, noise = huggingface_lines(group, variants, decode_variants, cli.decode_length)
        lines += table
        notes.append(f"- Baseline, {group.title}: {noise}.")
    if prepare is not None:
        lines += prepare_lines(prepare)
    lines += ["", "**Targets**", ""] + target_lines(groups, prepare)
    return "\n".join(lines + ["", "**Noise**", ""] + notes) + "\n"

