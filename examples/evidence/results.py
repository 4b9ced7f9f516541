#!/usr/bin/env python
"""Write docs/results.md and its pictures from the evidence runs' records (nothing typed by hand).

    python examples/evidence/results.py [--evidence-out evidence-output] [--output docs/results.md]

With ``EVIDENCE_RECORDS`` naming another records folder the page (and its pictures) is written inside that
folder unless ``--output`` says otherwise: the repository's page only ever shows the repository's records.

For every claim of :mod:`paper_claims`: the paper's numbers, ours (mean ± sd over the seeds that
finished, with the budget), the paired bootstrap p-value of each seed against the reference system of
the same seed where one exists (BLEU, tagging accuracy), and a verdict by the rule written on the
page. Runs that have not finished yet are shown as "not run yet", so the page can be made at any time
and fills in as runs finish. Every number comes from the runs' records (:mod:`records`, committed in
``examples/evidence/records/``), so that a fresh clone makes the same page; the settings (seeds,
budgets) are those the records were made under (``records/settings.json``), else the environment's.
What this machine is running or has failed is the runner's business (``run.sh status``), not the page's.
"""

import argparse
import datetime
import os
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple

if __name__ == "__main__":  # run as a script: the tools' shared module, scripts/posattn_tools/runs.py, by name
    sys.path.insert(1, str(Path(__file__).resolve().parents[2] / "scripts"))

import results_readers as readers  # noqa: E402
from evidence_plan import (EXTRAPOLATION_MODES, EXTRAPOLATION_MULTIPLIERS, EXTRAPOLATION_STRIDE,  # noqa: E402
                           EXTRAPOLATION_TRAIN_LENGTH, LSTM_AUTHORS_SYSTEMS, LSTM_SYSTEMS, TASKS, Run, Settings,
                           build_plan, classification_budget, display, extrapolation_budget, extrapolation_family,
                           extrapolation_lengths, extrapolation_recipe, lm_budget, system_labels, systems_of,
                           tagging_budget, translation_budget)
from paper_claims import NO_EFFECT, Claim, claims_for, extrapolation_metric  # noqa: E402
from records import TRAIN_LOG, default_page, read_record, record_dir, records_root  # noqa: E402
from records import load_settings as recorded_settings  # noqa: E402

from posattn_tools.runs import training_device  # noqa: E402

from fairseq_posattn.atomic_io import atomic_write  # noqa: E402
from fairseq_posattn.cli import setup_logging  # noqa: E402
from fairseq_posattn.data.significance import SIGNIFICANCE_LEVEL, TIE  # noqa: E402
from fairseq_posattn.inspect.learning_curves import Curve, CurveGroup, draw  # noqa: E402
from posattn_tasks.report import results_section  # noqa: E402

#: the comparison suite's records (examples/comparison/README.md), summarised in the page's last section
COMPARISON_RECORDS = Path(__file__).resolve().parents[1] / "comparison" / "records"

REPRODUCED, NOT_REPRODUCED, INCONCLUSIVE = "reproduced in direction", "not reproduced", "inconclusive"
NO_EFFECT_REPRODUCED = "reproduced (no effect)"
NOT_RUN, INCOMPLETE, MEASURED = "not run yet", "incomplete", "measured only"
METRIC_NAMES = {
    "bleu_test": "BLEU, test_2016_flickr", "bleu_valid": "BLEU, validation set",
    "test_ppl": "test perplexity (lower is better)", "valid_ppl": "valid perplexity", "accuracy": "dev accuracy (%)",
    "accuracy_epoch1": "dev accuracy after epoch 1 (%)",
    "oov_accuracy": "accuracy on OOV words (%)", "ambiguous_accuracy": "accuracy on ambiguous words (%)",
    "final_accuracy": "final dev accuracy (%)",
    "best_accuracy": "best dev accuracy (%)", "epochs": "epochs", "train_hours": "training h",
}
EXTRAPOLATION_METRICS = {
    extrapolation_metric(mode, m): f"valid perplexity at {m} x {EXTRAPOLATION_TRAIN_LENGTH} tokens, "
                                   f"{'non-overlapping' if mode == 'nonoverlapping' else 'sliding window'}"
    for mode in EXTRAPOLATION_MODES for m in EXTRAPOLATION_MULTIPLIERS}
METRIC_NAMES.update(EXTRAPOLATION_METRICS)
#: the sign of Δ when the system is better (default +1)
BETTER_SIGN = {"test_ppl": -1, "valid_ppl": -1, **{metric: -1 for metric in EXTRAPOLATION_METRICS}}
SECTION_TITLES = {
    "translation": "Translation: Multi30k English-German (Wang et al. 2019, Table 1, and sequential methods)",
    "lm": "Language modelling: Penn Treebank (Dagan 2019, Table 1)",
    "tagging": "Part-of-speech tagging: UD English-EWT (Dufter et al. 2020, Table 2)",
    "classification": "Sentence classification: SST-2 (Wu et al. 2021, Table 4)",
    "extrapolation": "Length extrapolation: train short, test long on PTB (Press et al. 2022, Figure 1)",
}
#: per task: the systems table's columns (the first with its per-seed values) and the claims' metrics
COLUMNS = {
    "translation": ["bleu_test", "bleu_valid"],
    "lm": ["test_ppl", "valid_ppl", "epochs", "train_hours"],
    "tagging": ["accuracy", "oov_accuracy", "ambiguous_accuracy", "accuracy_epoch1", "epochs"],
    "classification": ["final_accuracy", "best_accuracy"],
}


# ------------------------------------------------------------------------------------- statistics
def mean_sd(values: Sequence[float], digits: int = 2) -> str:
    """``mean ± sample sd``; one value alone (one seed: no sd to show)."""
    if not values:
        return "–"
    if len(values) == 1:
        return f"{values[0]:.{digits}f}"
    return f"{statistics.mean(values):.{digits}f} ± {statistics.stdev(values):.{digits}f}"


def in_all(n: int) -> str:
    return f"in all {n} seeds" if n > 1 else "in the one seed"


def sign_word(value: float) -> str:
    return "Δ > 0" if value > 0 else "Δ < 0" if value < 0 else "Δ = 0"


def verdict(claim: Claim, deltas: Dict[int, float], p_values: Dict[int, Optional[float]],
            planned: int) -> Tuple[str, str]:
    """The verdict and one sentence of why, by the rules stated on the page."""
    n = len(deltas)
    if n == 0:
        return NOT_RUN, "no seed of both systems has finished."
    tested = [p for p in p_values.values() if p is not None]
    # a difference that prints as 0.00 is a tie, never significant, whatever the bootstrap's p
    significant = sum(p is not None and p < SIGNIFICANCE_LEVEL and abs(deltas.get(seed, 0.0)) >= TIE
                      for seed, p in p_values.items())
    sig_text = f" (significant in {significant} of {len(tested)})" if tested else ""
    if n < planned:
        verb = "has" if n == 1 else "have"
        return f"{INCOMPLETE} ({n} of {planned} seeds)", f"only {n} of {planned} seeds {verb} finished."
    mean = statistics.mean(deltas.values())
    if claim.kind == NO_EFFECT:
        largest = max(abs(d) for d in deltas.values())
        same_sign = all(d > 0 for d in deltas.values()) or all(d < 0 for d in deltas.values())
        if tested and significant == 0:
            return NO_EFFECT_REPRODUCED, f"no seed differs significantly (largest |Δ| {largest:.2f})."
        if not tested and not same_sign:
            return NO_EFFECT_REPRODUCED, f"the seeds disagree in sign (largest |Δ| {largest:.2f}); no per-seed test."
        if same_sign and (not tested or significant == len(tested)):
            return NOT_REPRODUCED, (f"{sign_word(mean)} {in_all(n)}{sig_text}: a consistent difference "
                                    "where the paper reports none.")
        return INCONCLUSIVE, f"{sign_word(mean)} on average, significant in {significant} of {len(tested)} seeds."
    expected = claim.expected_sign
    agree = sum(d * expected > 0 for d in deltas.values()) if expected else 0
    if expected == 0:
        better = sum(d * BETTER_SIGN.get(claim.metric, 1) > 0 for d in deltas.values())
        return MEASURED, f"the system is better in {better} of {n} seeds{sig_text}; the paper has no number for this."
    if mean * expected > 0 and agree == n:
        return REPRODUCED, f"{sign_word(mean)} {in_all(n)}{sig_text}, as in the paper."
    if mean * expected < 0 and all(d * expected < 0 for d in deltas.values()):
        return NOT_REPRODUCED, f"{sign_word(mean)} {in_all(n)}{sig_text}, against the paper's direction."
    return INCONCLUSIVE, f"the seeds disagree: the paper's direction in {agree} of {n}{sig_text}."


@dataclass
class TaskData:
    """The finished runs of one task (and tag set): their metrics and the per-seed p-values."""

    task: str
    group: str
    runs: List[Run]
    records: Dict[str, Dict[str, object]]  # run id -> its record's run.json, for the finished runs
    metrics: Dict[str, Dict[str, float]] = field(default_factory=dict)
    p_values: Dict[Tuple[str, str, int, str], Optional[float]] = field(default_factory=dict)
    signature: str = ""

    def run(self, system: str, seed: int) -> Optional[Run]:
        return next((r for r in self.runs if r.system == system and r.seed == seed), None)

    def value(self, system: str, seed: int, metric: str) -> Optional[float]:
        run = self.run(system, seed)
        return self.metrics.get(run.id, {}).get(metric) if run else None

    def seeds(self) -> List[int]:
        return sorted({r.seed for r in self.runs if r.seed is not None})

    def systems(self) -> List[str]:
        return list(dict.fromkeys(r.system for r in self.runs))


@dataclass
class ClaimResult:
    claim: Claim
    planned: int
    system_values: Dict[int, float]
    reference_values: Dict[int, float]
    p_values: Dict[int, Optional[float]]

    @property
    def deltas(self) -> Dict[int, float]:
        return {s: self.system_values[s] - self.reference_values[s] for s in self.system_values
                if s in self.reference_values}

    def judged(self) -> Tuple[str, str]:
        return verdict(self.claim, self.deltas, {s: self.p_values.get(s) for s in self.deltas}, self.planned)


def evaluate(claim: Claim, data: TaskData) -> ClaimResult:
    seeds = [s for s in data.seeds() if data.run(claim.system, s) and data.run(claim.reference, s)]
    system_values, reference_values, p_values = {}, {}, {}
    for seed in seeds:
        value, reference = data.value(claim.system, seed, claim.metric), data.value(claim.reference, seed, claim.metric)
        if value is None or reference is None:
            continue
        system_values[seed], reference_values[seed] = value, reference
        p_values[seed] = data.p_values.get((claim.system, claim.reference, seed, claim.metric))
    return ClaimResult(claim, len(seeds), system_values, reference_values, p_values)


# ------------------------------------------------------------------------------------- reading
def finished_runs(data: TaskData) -> List[Run]:
    return [run for run in data.runs if run.id in data.records]


def read_translation(data: TaskData, prep: Optional[Run], n_samples: int) -> None:
    """BLEU of every finished run and p-values against each claim's reference, seed by seed."""
    done = {(r.system, r.seed): r for r in finished_runs(data)}
    if prep is None:
        return
    for subset in ("test", "valid"):
        metric = f"bleu_{subset}"
        by_reference: Dict[str, List[str]] = {}
        for claim in claims_for("translation"):
            if claim.metric == metric:
                by_reference.setdefault(claim.reference, []).append(claim.system)
        for seed in data.seeds():
            for reference, systems in by_reference.items():
                base, others = done.get((reference, seed)), [done[(s, seed)] for s in systems if (s, seed) in done]
                if base is None or not others:
                    continue
                comparison = readers.compare_translations(
                    (base.system, record_dir(base)), [(r.system, record_dir(r)) for r in others], subset,
                    record_dir(prep) / f"reference.{subset}.de", n_samples)
                data.signature = comparison.signature
                for system, bleu in comparison.bleu.items():
                    data.metrics.setdefault(done[(system, seed)].id, {})[metric] = bleu
                    if system != reference:
                        data.p_values[(system, reference, seed, metric)] = comparison.p_value[system]
        for run in done.values():  # a run that no claim pairs yet: its BLEU alone
            if metric not in data.metrics.get(run.id, {}):
                reference_path = record_dir(prep) / f"reference.{subset}.de"
                data.metrics.setdefault(run.id, {})[metric] = readers.bleu(record_dir(run), subset, reference_path)


def read_tagging(data: TaskData, dev: str, n_samples: int) -> None:
    counts = {}
    for run in finished_runs(data):
        data.metrics[run.id] = readers.tagging_metrics(record_dir(run))
        predicted = record_dir(run) / f"dev.pred.{data.group}"
        counts[(run.system, run.seed)] = readers.sentence_counts(dev, str(predicted), data.group)
    for claim in claims_for("tagging", data.group):
        if claim.metric != "accuracy":
            continue
        for seed in data.seeds():
            system, reference = counts.get((claim.system, seed)), counts.get((claim.reference, seed))
            if system is not None and reference is not None:
                data.p_values[(claim.system, claim.reference, seed, claim.metric)] = \
                    readers.paired_accuracy_bootstrap(system[0], reference[0], reference[1], n_samples)


def read_simple(data: TaskData, reader: Callable[[Path], Dict[str, float]]) -> None:
    for run in finished_runs(data):
        data.metrics[run.id] = reader(record_dir(run))


# ------------------------------------------------------------------------------------- pictures
class Pictures:
    """PNGs under ``directory``, linked from the page at ``page_dir``."""

    def __init__(self, directory: Path, page_dir: Path) -> None:
        self.directory, self.page_dir = directory, page_dir
        self.written: List[Path] = []

    def path(self, name: str) -> Path:
        self.directory.mkdir(parents=True, exist_ok=True)
        path = self.directory / name
        self.written.append(path)
        return path

    def link(self, path: Path, alt: str) -> str:
        return f"![{alt}]({os.path.relpath(path, self.page_dir)})"

    def remove_stale(self) -> None:
        for old in self.directory.glob("*.png") if self.directory.exists() else []:
            if old not in self.written:
                old.unlink()


def seeds_picture(pictures: Pictures, name: str, data: TaskData, metric: str, labels: Dict[str, str]) -> Optional[str]:
    """Per system its per-seed values (dots) and their mean (a bar)."""
    systems = [s for s in data.systems() if any(data.value(s, seed, metric) is not None for seed in data.seeds())]
    if not systems:
        return None
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(max(5.0, 0.7 * len(systems) + 2), 3.8), dpi=100)
    for i, system in enumerate(systems):
        values = [(seed, data.value(system, seed, metric)) for seed in data.seeds()]
        values = [(seed, v) for seed, v in values if v is not None]
        axes.scatter([i] * len(values), [v for _, v in values], s=18, zorder=3)
        axes.hlines(statistics.mean(v for _, v in values), i - 0.3, i + 0.3, color="black", linewidth=1.5)
    axes.set_xticks(range(len(systems)))
    axes.set_xticklabels([labels[s] for s in systems], rotation=35, ha="right", fontsize=7)
    axes.set_ylabel(METRIC_NAMES.get(metric, metric))
    axes.set_title(f"{METRIC_NAMES.get(metric, metric)}: dots = seeds, bar = mean", fontsize=9)
    axes.grid(True, axis="y", alpha=0.3)
    figure.tight_layout()
    path = pictures.path(name)
    figure.savefig(path, format="png")
    plt.close(figure)
    return pictures.link(path, f"{metric} per seed")


def curves_picture(pictures: Pictures, name: str, data: TaskData, metric: str, x: str, labels: Dict[str, str],
                   title: str) -> Optional[str]:
    groups = []
    for system in data.systems():
        curves = [Curve(run.id, points) for run in finished_runs(data) if run.system == system
                  for points in [readers.curve(record_dir(run) / TRAIN_LOG, metric, x)] if points]
        if curves:
            groups.append(CurveGroup(labels[system], curves))
    if not groups:
        return None
    path = pictures.path(name)
    draw(groups, metric, x, "valid", str(path), band="minmax", title=title)
    return pictures.link(path, title)


def lm_time_picture(pictures: Pictures, data: TaskData, labels: Dict[str, str]) -> Optional[str]:
    """Valid perplexity against epochs and against training hours, one line per run."""
    runs = [r for r in finished_runs(data) if readers.curve(record_dir(r) / TRAIN_LOG, "ppl", "epoch")]
    if not runs:
        return None
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (by_epoch, by_time) = plt.subplots(1, 2, figsize=(11, 4.2), dpi=100)
    colours: Dict[str, str] = {}
    for run in runs:
        points = readers.curve(record_dir(run) / TRAIN_LOG, "ppl", "epoch")
        hours = readers.training_hours_by_epoch(record_dir(run) / TRAIN_LOG)
        number = list(colours).index(run.system) if run.system in colours else len(colours)
        colour = colours.setdefault(run.system, f"C{number % 10}")
        style = "-" if number < 10 else "--"  # past ten systems the colours repeat, dashed
        label = labels[run.system] if run.seed == min(r.seed for r in runs if r.system == run.system) else None
        by_epoch.plot([e for e, _ in points], [p for _, p in points], marker="o", markersize=3, color=colour,
                      linestyle=style, label=label)
        timed = [(hours[int(e)], p) for e, p in points if int(e) in hours]
        by_time.plot([h for h, _ in timed], [p for _, p in timed], marker="o", markersize=3, color=colour,
                     linestyle=style)
    for axes, xlabel in ((by_epoch, "epoch"), (by_time, "training time (h, fairseq train_wall)")):
        axes.set_yscale("log")
        axes.set_xlabel(xlabel)
        axes.set_ylabel("valid perplexity")
        axes.grid(True, alpha=0.3)
    by_epoch.legend(fontsize=7)
    figure.suptitle("PTB valid perplexity (one line per seed)", fontsize=10)
    figure.tight_layout()
    path = pictures.path("lm_valid_ppl.png")
    figure.savefig(path, format="png")
    plt.close(figure)
    return pictures.link(path, "PTB valid perplexity against epochs and training time")


# ------------------------------------------------------------------------------------- page
def fmt(value: Optional[float], digits: int = 2) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


def digits_of(metric: str) -> int:
    return 0 if metric == "epochs" else 2


def claim_row(result: ClaimResult, labels: Dict[str, str]) -> str:
    claim = result.claim
    judged, why = result.judged()
    paper = "–"
    if claim.has_paper_number:
        paper = f"{claim.paper_system:.2f} vs {claim.paper_reference:.2f} ({claim.paper_delta:+.2f})"
    elif claim.expected_sign:
        paper = f"{'higher' if claim.expected_sign > 0 else 'lower'} (text and curves)"
    deltas = result.deltas
    ours = "–"
    if deltas:
        ours = (f"{mean_sd(list(result.system_values.values()))} vs {mean_sd(list(result.reference_values.values()))};"
                f" Δ {mean_sd(list(deltas.values()))} ({len(deltas)} seed{'s' * (len(deltas) > 1)})")

    def with_p(seed: int) -> str:
        p_value = result.p_values.get(seed)
        return f" (p {p_value:.3f})" if p_value is not None else ""

    per_seed = ", ".join(f"s{seed}: {delta:+.2f}{with_p(seed)}" for seed, delta in sorted(deltas.items())) or "–"
    reading = f" {claim.source or 'The paper'}: {claim.reading}." if claim.reading else ""
    return (f"| {labels[claim.system]} vs {labels[claim.reference]} | {METRIC_NAMES[claim.metric]} | {paper} | "
            f"{ours} | {per_seed} | **{judged}** | {why[0].upper() + why[1:]}{reading} |")


CLAIM_HEADER = ["| claim | metric | paper | ours: system vs reference, Δ = mean ± sd "
                "| Δ per seed (paired bootstrap p) | verdict | why |", "|---|---|---|---|---|---|---|"]


def systems_table(data: TaskData, labels: Dict[str, str]) -> List[str]:
    columns = COLUMNS[data.task]
    header = (f"| system | seeds | {METRIC_NAMES[columns[0]]} | per seed | "
              + " | ".join(METRIC_NAMES[c] for c in columns[1:]) + " | wall time per run (min) |")
    lines = [header, "|---" * (len(columns) + 4) + "|"]
    seeds = data.seeds()
    for system in data.systems():
        done = [s for s in seeds if data.run(system, s) and data.run(system, s).id in data.metrics]  # type: ignore
        cells = []
        for i, metric in enumerate(columns):
            values = [v for v in (data.value(system, s, metric) for s in done) if v is not None]
            cells.append(mean_sd(values, digits_of(metric)))
            if i == 0:
                cells.append(", ".join(f"s{s}: {fmt(data.value(system, s, metric))}" for s in done) or NOT_RUN)
        walls = [float(data.records[data.run(system, s).id]["seconds"]) for s in done]  # type: ignore
        wall = f"{statistics.mean(walls) / 60:.1f}" if walls else "–"
        devices = sorted({training_device(record_dir(data.run(system, s)) / TRAIN_LOG)  # type: ignore
                          for s in done})
        if devices and devices != ["CPU"]:  # runs on a GPU (six side by side): not comparable with the CPU's
            wall += f" ({', '.join(devices)})"
        lines.append(f"| {labels[system]} | {len(done)} of {len(seeds)} | " + " | ".join(cells) + f" | {wall} |")
    return lines


def wall_line(data: TaskData) -> str:
    finished = finished_runs(data)
    total = sum(float(data.records[r.id]["seconds"]) for r in finished)  # type: ignore[arg-type]
    return (f"**Wall time**: {len(finished)} of {len(data.runs)} runs finished, {total / 3600:.2f} h of wall time "
            "in all (the runner's clock, summed over attempts; runs side by side share the machine)."
            + resumed_note(data, finished))


def resumed_note(data: TaskData, finished: Sequence[Run]) -> str:
    """Which finished runs were resumed after an interrupted attempt (their records count every attempt): fairseq
    resumes from its last checkpoint, which gives what an uninterrupted run gives up to the data order and random
    streams after it, not bit for bit."""
    resumed = [r.id for r in finished if len(data.records[r.id].get("attempts", [])) > 1]  # type: ignore[arg-type]
    if not resumed:
        return ""
    return (f" Resumed after an interruption: {len(resumed)} ({', '.join(resumed)}); fairseq resumes from its last "
            "checkpoint, not bit for bit as an uninterrupted run.")


def commands(data: TaskData, extra: Sequence[Run] = ()) -> List[str]:
    first = data.seeds()[0] if data.seeds() else None
    shown = list(extra) + [r for r in data.runs if r.seed == first]
    return (["<details><summary>Exact commands (seed "
             f"{first}; the other seeds differ only in SEED / SEEDS and OUT)</summary>", "", "```"]
            + [run.shell() for run in shown] + ["```", "", "</details>"])


@dataclass
class Section:
    lines: List[str]
    claims: List[Tuple[str, ClaimResult]]


def section(data: TaskData, settings: Settings, pictures: Pictures, extra_runs: Sequence[Run] = ()) -> Section:
    labels = system_labels(settings, data.task)
    suffix = f"_{data.group}" if data.group else ""
    lines: List[str] = []
    results = [evaluate(claim, data) for claim in claims_for(data.task, data.group)]
    lines += CLAIM_HEADER + [claim_row(r, labels) for r in results] + [""]
    lines += systems_table(data, labels) + [""]
    if data.signature:
        lines += [f"sacreBLEU signature: `{data.signature}`.", ""]
    main_metric = COLUMNS[data.task][0]
    pictures_md = [seeds_picture(pictures, f"{data.task}{suffix}_seeds.png", data, main_metric, labels)]
    if data.task == "translation":
        pictures_md.append(curves_picture(pictures, "translation_valid_loss.png", data, "loss", "num_updates", labels,
                                          "valid loss (label-smoothed, base 2) against updates"))
    elif data.task == "lm":
        pictures_md.append(lm_time_picture(pictures, data, labels))
    elif data.task == "tagging":
        pictures_md.append(curves_picture(pictures, f"tagging{suffix}_curves.png", data, "accuracy", "epoch", labels,
                                          f"EWT dev accuracy ({data.group.upper()}) against epochs"))
    else:
        pictures_md.append(curves_picture(pictures, "classification_curves.png", data, "accuracy", "num_updates",
                                          labels, "SST-2 dev accuracy against updates"))
    drawn = [p for p in pictures_md if p]
    lines += ([" ".join(drawn), ""] if drawn else ["*(pictures appear when runs have finished)*", ""])
    lines += [wall_line(data), ""] + commands(data, extra_runs) + [""]
    return Section(lines, [(data.task + (f" ({data.group.upper()})" if data.group else ""), r) for r in results])


#: the perplexity of PTB's valid split under the word frequencies of its train split alone (``</s>`` counted, as
#: fairseq-eval-lm counts it): what a model that ignores its context scores (tests/test_evidence.py recomputes it)
PTB_VALID_UNIGRAM_PERPLEXITY = 687.0


def context_free_note(evaluations: Sequence[Dict], methods: Sequence[str]) -> List[str]:
    """A paragraph naming the methods whose valid perplexity at the training length (mean over seeds) is no
    better than PTB's word frequencies alone: at this budget they have not learnt to use their context, so
    their rows do not measure extrapolation. Nothing when every method is below that level."""
    at_training_length = {}
    for method in methods:
        ppls = [e["ppl"] for e in evaluations if e["method"] == method and e["status"] == "ok"
                and e["mode"] == EXTRAPOLATION_MODES[0] and e["length"] == EXTRAPOLATION_TRAIN_LENGTH]
        if ppls and statistics.mean(ppls) >= PTB_VALID_UNIGRAM_PERPLEXITY:
            at_training_length[method] = statistics.mean(ppls)
    if not at_training_length:
        return []
    named = ", ".join(f"{method} ({ppl:.1f})" for method, ppl in at_training_length.items())
    text = (f"**Not yet using their context**: {named}: their valid perplexity at {EXTRAPOLATION_TRAIN_LENGTH} "
            f"tokens is no better than that of PTB's word frequencies alone ({PTB_VALID_UNIGRAM_PERPLEXITY:.1f}, "
            "a unigram model of the train split): at this budget they have not learnt to use the context, so their "
            "rows show that they evaluate at every length, not how they extrapolate.")
    if any(extrapolation_family(method) == "lstm" for method in at_training_length):
        text += " A recurrent LM leaves this plateau later than a transformer: section 2 trains them for epochs."
    return [text, ""]


#: a plain-PyTorch mean lies within the seeds' spread of the fairseq mean when |Δ| is at most this many pooled
#: seed standard deviations, sqrt((sd_fairseq² + sd_pytorch²) / 2)
SPREAD_FACTOR = 2.0
MODE_TITLES = {"nonoverlapping": "non-overlapping windows", "sliding": "sliding window of stride L/2"}
PerplexityBySeed = Dict[Tuple[str, str, int], Dict[int, float]]


def perplexities_by_seed(evaluations: Sequence[Dict]) -> PerplexityBySeed:
    """``(method, mode, length) -> {seed: perplexity}`` of the evaluations that scored the split."""
    table: PerplexityBySeed = {}
    for e in evaluations:
        if e["status"] == "ok":
            table.setdefault((e["method"], e["mode"], int(e["length"])), {})[int(e["seed"])] = float(e["ppl"])
    return table


def within_spread(fairseq: Sequence[float], pytorch: Sequence[float]) -> Optional[bool]:
    """Whether the two means differ by at most SPREAD_FACTOR pooled seed sds (None below two seeds each)."""
    if min(len(fairseq), len(pytorch)) < 2:
        return None
    pooled = ((statistics.stdev(fairseq) ** 2 + statistics.stdev(pytorch) ** 2) / 2) ** 0.5
    return abs(statistics.mean(pytorch) - statistics.mean(fairseq)) <= SPREAD_FACTOR * pooled


@dataclass
class ComparisonRow:
    """A method's row at one mode and length: its markdown, Δ, whether Δ lies within the spread (None: too few
    seeds)."""

    method: str
    mode: str
    length: int
    markdown: str
    delta: float
    within: Optional[bool]


def comparison_rows(fairseq: PerplexityBySeed, pytorch: PerplexityBySeed, methods: Sequence[str], mode: str,
                    lengths: Sequence[int]) -> List[ComparisonRow]:
    """A table row per method and length that both recipes scored, with the seeds both finished."""
    rows = []
    for method in methods:
        for length in lengths:
            ours, theirs = pytorch.get((method, mode, length), {}), fairseq.get((method, mode, length), {})
            seeds = sorted(set(ours) & set(theirs))
            if not seeds:
                continue
            a, b = [theirs[s] for s in seeds], [ours[s] for s in seeds]
            within = within_spread(a, b)
            judged = "–" if within is None else "yes" if within else "**no**"
            delta = statistics.mean(b) - statistics.mean(a)
            text = (f"| {method} | {length} | {' '.join(map(str, seeds))} | {mean_sd(a, 1)} | {mean_sd(b, 1)} "
                    f"| {delta:+.1f} | {judged} |")
            rows.append(ComparisonRow(method, mode, length, text, delta, within))
    return rows


def pytorch_comparison(fairseq_evaluations: Sequence[Dict], lengths: Sequence[int]) -> List[str]:
    """The plain-PyTorch recipe's perplexities (examples/pytorch) beside the fairseq runs' of the same methods,
    seeds, modes and lengths; nothing when no plain-PyTorch run is recorded."""
    plain = readers.pytorch_extrapolation_records(records_root())
    if not plain:
        return []
    fairseq, pytorch = perplexities_by_seed(fairseq_evaluations), perplexities_by_seed(plain)
    methods = list(dict.fromkeys(e["method"] for e in plain))
    lines = ["### Plain PyTorch beside fairseq (examples/pytorch)", "",
             "`examples/pytorch/extrapolation.py` trains the same model in plain PyTorch around "
             "`posattn.SelfAttention` (fairseq's `transformer_lm` layers: post-norm, embeddings scaled by sqrt(d), "
             "tied output, fairseq's initialisation; the same weights give both models the same logits: "
             "tests/test_pytorch_example.py), on the same dictionary and token stream, with the same "
             "optimiser, schedule, clipping and budget, and scores the valid split the same two ways (records in "
             f"`examples/evidence/records/{readers.PYTORCH_EXTRAPOLATION}/`). The two recipes draw different random "
             "numbers (initial weights, dropout masks, block order). Valid perplexity, mean ± sd over the seeds both "
             "recipes finished; Δ = plain PyTorch − fairseq; *within the spread* when "
             f"|Δ| ≤ {SPREAD_FACTOR:g} × the pooled seed sd, sqrt((sd_fairseq² + sd_PyTorch²) / 2).", ""]
    rows: List[ComparisonRow] = []
    for mode in EXTRAPOLATION_MODES:
        mode_rows = comparison_rows(fairseq, pytorch, methods, mode, lengths)
        rows += mode_rows
        lines += [f"#### {MODE_TITLES[mode]}", "",
                  "| method | L | seeds | fairseq | plain PyTorch | Δ | within the spread |",
                  "|---|---:|---|---:|---:|---:|---|"] + [row.markdown for row in mode_rows] + [""]
    return (lines + comparison_summary(rows, plain, methods) + seed_deltas(fairseq, pytorch, methods, lengths[0])
            + training_loss_table(methods, [FAIRSEQ_RECIPE, PYTORCH_RECIPE]))


def seed_deltas(fairseq: PerplexityBySeed, pytorch: PerplexityBySeed, methods: Sequence[str], length: int) -> List[str]:
    """Δ seed by seed at the training length (non-overlapping windows): within a recipe a seed fixes the order of
    the training blocks and the embedding's initial weights (the first module built) for every method, so the
    methods' rows share their seeds' draws."""
    parts = []
    for method in methods:
        ours, theirs = (table.get((method, EXTRAPOLATION_MODES[0], length), {}) for table in (pytorch, fairseq))
        parts.append(f"{method} " + ", ".join(f"s{seed} {ours[seed] - theirs[seed]:+.1f}"
                                              for seed in sorted(set(ours) & set(theirs))))
    return [f"Δ seed by seed at L = {length} ({MODE_TITLES[EXTRAPOLATION_MODES[0]]}): {'; '.join(parts)}. Within "
            "a recipe a seed fixes the order of the training blocks and the embedding's initial weights (the first "
            "module built) for every method, so the methods' rows are not independent draws: they share their "
            "seeds'.", ""]


#: the logged training intervals compared (both recipes log every 100 updates; fairseq's 500th ends its second
#: epoch's first 46 updates, the plain-PyTorch one updates 401 to 500)
COMPARED_INTERVALS = (100, 200, 300, 400)
#: each recipe's label on the page and the folder of its records (``<method>/seed<N>/``)
FAIRSEQ_RECIPE = ("fairseq", "extrapolation")
PYTORCH_RECIPE = ("plain PyTorch", readers.PYTORCH_EXTRAPOLATION)
HUGGINGFACE_RECIPE = ("Hugging Face", readers.HUGGINGFACE_EXTRAPOLATION)


def training_loss_table(methods: Sequence[str], recipes: Sequence[Tuple[str, str]]) -> List[str]:
    """Per method, the training loss (base 2) of the intervals ending at COMPARED_INTERVALS, mean ± sd over the
    seeds of the last recipe that every other recipe running the method finished, each recipe's (``(label,
    records folder)``) beside the others' ("–" for a recipe without the method), from the records' train.log."""
    root = records_root()
    lines = ["Training loss (base 2, dropout on) of the 100 updates before each count, mean ± sd over the same seeds, "
             f"{' / '.join(label for label, _ in recipes)} (the records' `train.log`):", "",
             "| method | " + " | ".join(f"updates {u - 99}-{u}" for u in COMPARED_INTERVALS) + " |",
             "|---|" + "---:|" * len(COMPARED_INTERVALS)]
    for method in methods:
        ran = [folder for _, folder in recipes if (root / folder / method).is_dir()]
        seeds = [seed.name for seed in sorted((root / recipes[-1][1] / method).glob("seed*"))]
        logs = [{folder: root / folder / method / seed / TRAIN_LOG for folder in ran} for seed in seeds]
        losses = [{folder: readers.interval_training_losses(log) for folder, log in by_recipe.items()}
                  for by_recipe in logs if all(log.is_file() for log in by_recipe.values())]
        losses = [run for run in losses if all(u in run[folder] for folder in ran for u in COMPARED_INTERVALS)]
        cells = [" / ".join(mean_sd([run[folder][u] for run in losses], 3) if folder in ran else "–"
                            for _, folder in recipes) for u in COMPARED_INTERVALS]
        lines.append(f"| {method} | " + " | ".join(cells) + " |")
    return lines + [""]


def comparison_summary(rows: Sequence[ComparisonRow], plain: Sequence[Dict], methods: Sequence[str]) -> List[str]:
    """How many rows lie within the spread, per method the sign of Δ, and the plain-PyTorch training time."""
    judged = [row for row in rows if row.within is not None]
    signs = []
    for method in methods:
        deltas = [row.delta for row in rows if row.method == method]
        signs.append(f"{method} {sum(1 for d in deltas if d > 0)} of {len(deltas)}")
    trained = [float(e["train_seconds"]) for e in plain if "train_seconds" in e]
    beyond = [f"{row.method} at L = {row.length} ({MODE_TITLES[row.mode]})" for row in judged if not row.within]
    why = ([f"Beyond the spread: {'; '.join(beyond)}. The two models compute the same function (the same weights "
            "give the same logits), so such a row measures the training: the table below sets the two recipes' "
            "training losses side by side; what differs in the training is listed in examples/pytorch/README.md "
            "(random streams, the last shorter block, Adam's ε)."] if beyond else [])
    return [f"**{sum(1 for row in judged if row.within)} of {len(judged)}** comparisons within the seeds' spread. "
            f"Plain PyTorch higher (Δ > 0) in: {', '.join(signs)} rows. Plain-PyTorch training: "
            f"{statistics.mean(trained) / 60:.1f} min per run on average (the training alone, its records' "
            "`train_seconds`).", ""] + ([" ".join(why), ""] if why else [])


def recipes_seeds(tables: Sequence[PerplexityBySeed], method: str, mode: str, length: int) -> List[int]:
    """The seeds that every recipe running ``method`` (a table with its key) scored at ``length``."""
    scored = [set(table[(method, mode, length)]) for table in tables if (method, mode, length) in table]
    return sorted(set.intersection(*scored)) if scored else []


def recipe_values(table: PerplexityBySeed, key: Tuple[str, str, int], seeds: Sequence[int]) -> List[float]:
    """The perplexities of ``seeds`` at ``key``; none when the recipe lacks one of them."""
    found = table.get(key, {})
    return [found[s] for s in seeds] if all(s in found for s in seeds) else []


def curve_change(table: PerplexityBySeed, method: str, mode: str, length: int, reference: int,
                 seeds: Sequence[int]) -> Optional[float]:
    """The relative change of the seeds' mean perplexity from ``reference`` (the training length) to ``length``."""
    at, base = (recipe_values(table, (method, mode, n), seeds) for n in (length, reference))
    return statistics.mean(at) / statistics.mean(base) - 1 if at and base else None


def percent(value: Optional[float]) -> str:
    return "–" if value is None else f"{value:+.1%}"


def curve_rows(tables: Sequence[PerplexityBySeed], method: str, mode: str, lengths: Sequence[int]) -> List[str]:
    """A row per length: each recipe's perplexity over the seeds that every recipe running the method scored at
    the training length, and each recipe's change from there."""
    seeds = recipes_seeds(tables, method, mode, lengths[0])
    rows = []
    for length in lengths:
        cells = [mean_sd(recipe_values(table, (method, mode, length), seeds), 1) for table in tables]
        changes = [percent(curve_change(table, method, mode, length, lengths[0], seeds)) for table in tables]
        change = "–" if length == lengths[0] else " / ".join(changes)
        rows.append(f"| {method} | {length} | {' '.join(map(str, seeds))} | {' | '.join(cells)} | {change} |")
    return rows


def curve_summary(tables: Sequence[PerplexityBySeed], labels: Sequence[str], methods: Sequence[str],
                  lengths: Sequence[int]) -> List[str]:
    """The non-overlapping curves in words: the recipes at the training length (the last against the first), each
    method's change to the longest length per recipe, and whether the recipes order the methods that all of them
    ran alike by it."""
    mode, first, last = EXTRAPOLATION_MODES[0], lengths[0], lengths[-1]
    seeds = {m: recipes_seeds(tables, m, mode, first) for m in methods}
    shared = [m for m in methods if seeds[m] and all((m, mode, first) in table for table in tables)]
    changes = {m: [curve_change(table, m, mode, last, first, seeds[m]) for table in tables] for m in methods}
    at_first = []
    for m in shared:
        means = [statistics.mean(recipe_values(table, (m, mode, first), seeds[m])) for table in tables]
        at_first.append(f"{m} {' / '.join(f'{mean:.1f}' for mean in means)} ({labels[-1]} "
                        f"{means[-1] / means[0] - 1:+.0%} against {labels[0]})")
    moved = "; ".join(f"{m} " + " / ".join(percent(change) for change in changes[m]) for m in methods)
    orders = [sorted((m for m in shared if changes[m][i] is not None), key=lambda m, i=i: changes[m][i])
              for i in range(len(tables))]
    alike = all(order == orders[0] for order in orders)
    order_text = "; ".join(f"{label}: {' < '.join(order)}" for label, order in zip(labels, orders))
    ranking = (f"; the recipes order {', '.join(shared)} {'alike' if alike else 'differently'} by that change "
               f"({order_text})" if len(shared) > 1 else "")
    return [f"At L = {first} ({MODE_TITLES[mode]}), {' / '.join(labels)}: {'; '.join(at_first)}. From L = {first} "
            f"to L = {last} the perplexity changes by {moved} (\"–\": a recipe without the method){ranking}.", ""]


#: the Hugging Face model as it ships (examples/huggingface: Llama's own RoPE, no method) and the posattn method
#: that computes the same rotation on other pairs of dimensions
LLAMA_ROPE, ROTARY = "llama-rope", "rotary"


def own_rotation_note(table: PerplexityBySeed, lengths: Sequence[int]) -> List[str]:
    """In the Hugging Face model, Llama's own rotation beside posattn's, from the training length to the longest
    (non-overlapping windows, the seeds both ran); nothing unless both ran."""
    mode, first, last = EXTRAPOLATION_MODES[0], lengths[0], lengths[-1]
    seeds = sorted(set(table.get((LLAMA_ROPE, mode, first), {})) & set(table.get((ROTARY, mode, first), {})))
    curves = {m: [recipe_values(table, (m, mode, n), seeds) for n in (first, last)] for m in (LLAMA_ROPE, ROTARY)}
    if not all(values for pair in curves.values() for values in pair):
        return []
    text = "; ".join(f"{m} {statistics.mean(a):.1f} to {statistics.mean(b):.1f} "
                     f"({percent(statistics.mean(b) / statistics.mean(a) - 1)})" for m, (a, b) in curves.items())
    return [f"In the Hugging Face model, Llama's own RoPE ({LLAMA_ROPE}) and posattn's rotation ({ROTARY}) rotate by "
            "the same frequencies, Llama's on the head's two halves and posattn's on neighbouring pairs of dimensions: "
            "a permutation of the head's dimensions, which the learned projections absorb, maps one onto the other. "
            f"From L = {first} to L = {last} ({MODE_TITLES[mode]}, seeds {' '.join(map(str, seeds))}): {text}.", ""]


def training_minutes(recipes: Sequence[Tuple[str, Sequence[Dict]]]) -> List[str]:
    """Each recipe's mean training time per run, from its records' ``train_seconds``."""
    minutes = [f"{label} {statistics.mean(seconds) / 60:.1f} min" for label, records in recipes
               for seconds in [[float(e["train_seconds"]) for e in records if "train_seconds" in e]] if seconds]
    return [f"Training: {' and '.join(minutes)} per run on average (the training alone, the records' "
            "`train_seconds`; the runs shared the machine with other work, at different times).", ""]


HUGGINGFACE_INTRO = (
    "`examples/huggingface/extrapolation.py` builds a `transformers.LlamaForCausalLM` from a config at the recipe's "
    "sizes (2 layers, hidden size 128, 4 heads, a SwiGLU of width 344: the parameters of the recipe's FFN of 512; "
    "tied embeddings; built for 1,024 positions), switches it to each method with "
    "`posattn_huggingface.apply_position_method` (Llama's own rotation turned off), trains it with "
    "`transformers.Trainer` on the same dictionary and token stream at the same budget (500 updates of 32 blocks of "
    "64 tokens, Adam betas (0.9, 0.98), lr 1e-3, `inverse_sqrt` with 100 warm-up updates, clip-norm 1.0) and scores "
    "the valid split with examples/pytorch's evaluation, the same two ways (records in "
    f"`examples/evidence/records/{readers.HUGGINGFACE_EXTRAPOLATION}/`); `llama-rope` is the Llama model as Hugging "
    "Face ships it, its own RoPE and no method. The model is not fairseq's: Llama's blocks are pre-norm with RMSNorm, "
    "a SwiGLU feed-forward network, no biases, no embedding scale and transformers' initialisation (N(0, 0.02)), "
    "with dropout (0.1) on the attention weights only where fairseq's model drops the embeddings and the residual "
    "branches; Trainer's warm-up starts from lr 0 instead of 1e-7. Equal perplexities are not expected: what "
    "compares is the shape of each method's curve past the training length. Valid perplexity, mean ± sd over the "
    "seeds that every recipe running the method finished; the last column: the mean's change from L = 64, per "
    "recipe.")


def huggingface_comparison(fairseq_evaluations: Sequence[Dict], lengths: Sequence[int]) -> List[str]:
    """The Hugging Face recipe's perplexities (examples/huggingface) beside the fairseq and plain-PyTorch runs' of
    the same methods, seeds, modes and lengths; nothing when no Hugging Face run is recorded."""
    root = records_root()
    huggingface = readers.huggingface_extrapolation_records(root)
    if not huggingface:
        return []
    plain = readers.pytorch_extrapolation_records(root)
    recipes = [FAIRSEQ_RECIPE, PYTORCH_RECIPE, HUGGINGFACE_RECIPE]
    labels = [label for label, _ in recipes]
    tables = [perplexities_by_seed(evaluations) for evaluations in (fairseq_evaluations, plain, huggingface)]
    methods = list(dict.fromkeys(e["method"] for e in huggingface))
    methods.sort(key=lambda m: not all(any(key[0] == m for key in table) for table in tables))  # the shared first
    lines = ["### Hugging Face beside fairseq and plain PyTorch (examples/huggingface)", "", HUGGINGFACE_INTRO, ""]
    for mode in EXTRAPOLATION_MODES:
        lines += [f"#### {MODE_TITLES[mode]} (Hugging Face)", "",
                  f"| method | L | seeds | {' | '.join(labels)} | change from L = {lengths[0]}: {' / '.join(labels)} |",
                  "|---|---:|---|" + "---:|" * len(labels) + "---|"]
        lines += [row for method in methods for row in curve_rows(tables, method, mode, lengths)] + [""]
    return (lines + curve_summary(tables, labels, methods, lengths) + own_rotation_note(tables[-1], lengths)
            + training_loss_table(methods, recipes)
            + training_minutes([(HUGGINGFACE_RECIPE[0], huggingface), (PYTORCH_RECIPE[0], plain)]))


def extrapolation_section(data: TaskData, settings: Settings, pictures: Pictures, prep: Run) -> Section:
    """The claims (a measured-only comparison is left out for a method that refuses its length), then the
    recipe's own tables and picture (examples/length_extrapolation/extrapolation.py) over every finished run."""
    labels = system_labels(settings, data.task)
    evaluations = [entry for run in finished_runs(data) for entry in readers.extrapolation_records(record_dir(run))]
    refused = {(e["method"], readers.extrapolation_metric_of(e))
               for e in evaluations if e["status"] == "refused"}  # a model's refusal does not depend on its seed
    results = [evaluate(claim, data) for claim in claims_for(data.task)
               if claim.is_paper_claim or (claim.system, claim.metric) not in refused]
    lines = CLAIM_HEADER + [claim_row(r, labels) for r in results] + [""]
    recipe = extrapolation_recipe()
    methods = [s for s in data.systems() if any(e["method"] == s for e in evaluations)]
    lengths = extrapolation_lengths(settings)
    if evaluations:
        seeds = " ".join(str(s) for s in data.seeds())
        lines += [f"Mean ± sd over the seeds that finished ({seeds} planned); {recipe.REFUSAL_NOTE}", ""]
        lines += recipe.tables(evaluations, methods, EXTRAPOLATION_MODES, lengths, EXTRAPOLATION_TRAIN_LENGTH,
                               EXTRAPOLATION_STRIDE, heading="###") + [""]
        path = pictures.path("extrapolation_perplexity.png")
        recipe.plot(evaluations, methods, EXTRAPOLATION_MODES, lengths, EXTRAPOLATION_TRAIN_LENGTH,
                    EXTRAPOLATION_STRIDE, str(path))
        lines += [pictures.link(path, "valid perplexity against evaluation length"), ""]
        lines += context_free_note(evaluations, methods)
        lines += pytorch_comparison(evaluations, lengths)
        lines += huggingface_comparison(evaluations, lengths)
    else:
        lines += ["*(tables and picture appear when runs have finished)*", ""]
    lines += [wall_line(data), ""] + commands(data, [prep]) + [""]
    return Section(lines, [(data.task, r) for r in results])


def budgets(task: str, settings: Settings) -> List[str]:
    seeds = " ".join(str(s) for s in settings.seeds[task])
    if task == "translation":
        text = [translation_budget(settings)]
    elif task == "lm":
        return [f"**Seeds**: {seeds}. **Budget**, the same for every model of a kind:", "",
                f"- LSTMs at the short budget ({', '.join(f'`{s}`' for s in LSTM_SYSTEMS)}): "
                f"{lm_budget(settings, LSTM_SYSTEMS[0])}.",
                f"- LSTMs at the authors' budget ({', '.join(f'`{s}`' for s in LSTM_AUTHORS_SYSTEMS)}: "
                f"run_ptb.sh's `MODELS` {', '.join(f'`{m}`' for m in LSTM_AUTHORS_SYSTEMS.values())}): "
                f"{lm_budget(settings, next(iter(LSTM_AUTHORS_SYSTEMS)))}.",
                f"- Transformers: {lm_budget(settings, 'tf_vanilla')}.", ""]
    elif task == "tagging":
        text = [tagging_budget(settings)]
    elif task == "extrapolation":
        first_of: Dict[str, str] = {}  # family -> its first system
        for system in systems_of(task):
            first_of.setdefault(extrapolation_family(system), system)
        return [f"**Seeds**: {seeds}. **Budget**, the same for every model of a kind:", "",
                f"- Transformers: {extrapolation_budget(settings, first_of['tf'])}.",
                f"- The attentive LSTM LMs: {extrapolation_budget(settings, first_of['lstm'])}.", ""]
    else:
        text = [classification_budget(settings)]
    return [f"**Seeds**: {seeds}. **Budget**, the same for every system: " + " ".join(text) + ".", ""]


INTRO = {
    "translation": [
        "Wang et al.'s Table 1 rows 1-7 and 9 (their Chinese-English numbers, compared as a direction) and the "
        "sequential methods on the same recipe (`examples/multi30k_en_de/run.sh`, `PRESET=small`), each row "
        "against its reference of the same seed: rows 2 and 3 against row 1, row 9 against row 7, the others "
        "against row 4. p: sacrebleu's paired bootstrap (1,000 resamples) of the system against the reference "
        "translated by the model of the same seed.", ""],
    "lm": [
        "`examples/language_model/run_ptb.sh` on the full Mikolov PTB, sentence level; perplexity is "
        "fairseq-eval-lm's over every target token, end of sentence included, from `checkpoint_best.pt` in a "
        "fresh process. Dagan's numbers (test perplexity: LSTM 64.96, attentive 76.56, positional attentive "
        "70.92) come from a different code base, perplexity count and training length: compare the direction, "
        "not the number. No per-seed significance test (seeds only). The small transformer LMs get about the "
        "LSTMs' wall time rather than their number of epochs (an epoch of theirs takes about a third of an LSTM "
        "epoch here): the tables' last column shows how close the wall times came. The three LSTMs are trained "
        "at two budgets, each with its own rows and claims: a short one (the first three systems, 6 epochs at "
        "lr 10 with the defaults of the time, made on this machine's CPU), which says how the models compare "
        "early in training but does not test Dagan's claims, and the authors' (the systems named \"authors' "
        "budget\": their schedule, batch, weight decay, initialisation and eps for 40 epochs; "
        "`bash examples/evidence/run_lstm_authors_budget.sh`, six trainings side by side, meant for a GPU: about "
        "35 minutes on one H200, docs/gpu_check.md), which does. A wall time measured on a GPU names it (six runs "
        "shared it).", ""],
    "tagging": [
        "`examples/pos_tagging/run.sh` on UD English-EWT (train / dev; EWT has no test set in our data and we "
        "report dev), UPOS and XPOS (EWT's XPOS is the Penn Treebank tag set, so XPOS is compared with the "
        "paper's PTB results and UPOS with its UD macro means; EWT itself is not among the paper's 47 UD "
        "treebanks). Accuracy over every dev word from `checkpoint_best.pt` (early stopping selects on the dev "
        "set it is reported on, as the paper's early stopping does on its dev set); also over OOV words (word "
        "forms not in the training file) and ambiguous words (forms seen with more than one tag in it), as the "
        "paper reports. p: paired bootstrap over dev sentences (1,000 resamples) against SAN+PE[add] of the "
        "same seed.", "",
        "**What changed with the authors' initialisations** (now the defaults, docs/methods.md \"Differences "
        "from the authors' code\"): the convolutions start from Keras' glorot-uniform filters with a zero bias "
        "instead of PyTorch's default, whose bias of up to ±1/sqrt(fan in) (±0.33 for the 3 x 3 filter) "
        "swamped attention weights of about 1/length; with it +Conv2d was far behind SAN+PE[add] after the "
        "first epoch, with the authors' init it is ahead (the claim \"learns faster\" now holds in direction), "
        "while the final accuracies barely move. A^p starts glorot-normal and a^r at the authors' circulant "
        "bias instead of zero. The earlier runs stay on the page as the systems \"(zero init)\" and \"(PyTorch "
        "init)\", compared with the new ones as measured-only claims.", ""],
    "classification": [
        "`examples/sentence_classification/run.sh` on SST-2 (6,920 train, 872 dev sentences; Wu et al. report "
        "their own split's test set with GloVe vectors). The verdicts use the dev accuracy after the last "
        "update (not selected on dev); the best one is shown beside it. No per-seed significance test (seeds "
        "only). No longer-input classification data set is available offline here (only SST-2), so none was "
        "run.", ""],
    "extrapolation": [
        "`examples/length_extrapolation/run.sh` on PTB read as one token stream: every causal method of the plugin "
        f"(the registry's variants alone, sinusoidal, none, learned, the attentive LSTM LMs) trained on blocks of "
        f"{EXTRAPOLATION_TRAIN_LENGTH} tokens, then fairseq-eval-lm over every token of the valid split at "
        "multiples of that length (the budget below), in non-overlapping windows "
        "(`--context-window 0`, as the paper's Figure 1) and in a sliding window of stride L/2 (each token read "
        "after L/2 to L - 1 earlier ones, beside the paper's appendix's stride 1). Models tied to their training "
        "length refuse longer blocks at start-up. Press et al. train far larger models for far longer on "
        "WikiText-103; their comparison is what is checked, as a direction (ALiBi's perplexity below the "
        "sinusoidal model's past the training length), the other methods against sinusoidal are measured only. "
        "No per-seed significance test (seeds only). What each method computes past its training length: "
        "docs/methods.md, \"Beyond the training length\".", ""],
}

RULES = [
    "## How to read the verdicts", "",
    "Δ = system − reference, per seed (the reference system trained with the same seed); mean ± sd over seeds.",
    "",
    "- A claim of a **direction** (the paper reports the system better or worse): **reproduced in direction** "
    "when the mean Δ has the paper's sign and so does every seed's Δ; **not reproduced** when the mean Δ has "
    "the opposite sign and so does every seed's; otherwise **inconclusive**. The size is not compared: our "
    "data, models and budgets are smaller than the papers'.",
    "- A claim of **no effect** (the paper's text says the two perform alike): **reproduced (no effect)** when "
    "no seed differs significantly (where a per-seed test exists; else when the seeds disagree in sign); "
    "**not reproduced** when every seed differs in the same direction (and significantly, where tested); "
    "otherwise **inconclusive**.",
    f"- Significance: paired bootstrap resampling per seed (BLEU: sacrebleu's; tagging: the same over dev "
    f"sentences), p < {SIGNIFICANCE_LEVEL} counts as significant; it is reported beside the verdict, which "
    "rests on the agreement of the seeds.",
    "- **measured only**: no paper number for this comparison; the same statistics, no verdict.",
    f"- **{NOT_RUN}** / **{INCOMPLETE}**: not every planned seed of both systems has finished; the page fills in "
    "as runs finish.", "",
]


def how_made(settings: Settings, finished: int, planned: int) -> List[str]:
    return [
        "## How this page is made, and how to resume the runs", "",
        f"Generated by `python examples/evidence/results.py` on {datetime.date.today().isoformat()} from the "
        f"records of the evidence runs in `{display(records_root())}/` ({finished} of {planned} runs finished). "
        "Nothing on it is typed by hand: run the script again to refresh it (the runner does at its end).", "",
        "- **Records**: when a run finishes, the runner keeps what this page reads in "
        "`examples/evidence/records/<run id>/`, committed with the code: `run.json` (exact command, budget, wall "
        "time of every attempt, commit), the training log, fairseq-eval-lm / fairseq-validate logs, the "
        "detokenized translations, the predicted dev tags. Checkpoints and binarized data stay in "
        f"`{display(settings.out)}/` (not in git), so the runs accumulate across machines: a recorded run is "
        "finished everywhere, and is done again only when its budget changes (a larger one trains on from its "
        "`checkpoint_last.pt` where that is still on disk, and the record then counts both attempts) or its "
        "record is deleted.",
        "- **Start, or resume after an interruption**, from the repository root: "
        "`nohup bash examples/evidence/run.sh > evidence.log 2>&1 &`. Stop it with `kill -TERM <its pid>`: the "
        "running recipes are stopped and marked interrupted (a runner killed outright, with the machine, leaves "
        "its recipes' attempts open: the next one ends each at the last write into its run's folder, so the "
        "wall times stay counted). The same command carries on: a recorded run is "
        "never redone; on the same machine an interrupted training resumes from its `checkpoint_last.pt`, and "
        "the recipes skip every step whose output exists.",
        "- **Progress**: `bash examples/evidence/run.sh status`; every run with its status and exact command: "
        "`bash examples/evidence/run.sh plan`; per-run status and wall time of every attempt on this machine: "
        f"`{display(settings.out)}/manifest.json`; each run's recipe output: `recipe.log` in its folder.",
        f"- **Selection and budgets** (environment): `TASKS` (default `{' '.join(TASKS)}`), "
        "`SEEDS` or `TRANSLATION_SEEDS` / `LM_SEEDS` / `TAGGING_SEEDS` / `CLASSIFICATION_SEEDS` / "
        "`EXTRAPOLATION_SEEDS`, `<TASK>_SYSTEMS`, `TAG_SETS`, `TRANSLATION_MAX_UPDATE`, `LM_EPOCHS` (LSTMs), "
        "`LM_TF_EPOCHS` (transformers), `LM_LSTM_LR`, `TAGGING_PATIENCE`, `TAGGING_MAX_EPOCH`, "
        "`CLASSIFICATION_MAX_UPDATE`, `EXTRAPOLATION_MAX_UPDATE`, "
        "`JOBS` (runs at once, default 2) and `THREADS` (per run, default 1), `EVIDENCE_OUT`, and the data "
        "folders `MULTI30K_DIR`, `PTB_DIR`, `EWT` (or `EWT_TRAIN` and `EWT_DEV`), `SST2` "
        "(`examples/evidence/evidence_plan.py`).", "",
    ]


def summary(claims: Sequence[Tuple[str, ClaimResult]], settings: Settings) -> List[str]:
    lines = ["## Summary of the papers' claims", "",
             "| task | claim | metric | paper | verdict |", "|---|---|---|---|---|"]
    for task, result in claims:
        claim = result.claim
        if not claim.is_paper_claim:
            continue
        labels = system_labels(settings, claim.task)
        paper = (f"{claim.paper_delta:+.2f}" if claim.has_paper_number
                 else "higher" if claim.expected_sign > 0 else "lower")
        if claim.kind == NO_EFFECT:
            paper += " (no effect)"
        lines.append(f"| {task} | {labels[claim.system]} vs {labels[claim.reference]} | {METRIC_NAMES[claim.metric]} "
                     f"| {paper} | {result.judged()[0]} |")
    return lines + [""]


def load_settings(evidence_out: Optional[str]) -> Settings:
    """The settings the records were made under (else the environment's), with every task, and per task the
    systems the records were made for and those of the environment's plan (by default every system): a
    system of the plan that no runner has tried yet, like the LSTMs at the authors' budget when they were
    added, shows as "not run yet"."""
    env = dict(os.environ)
    if evidence_out:
        env["EVIDENCE_OUT"] = evidence_out
    planned = Settings.from_env(env)
    settings = recorded_settings(planned)
    settings.tasks = list(TASKS)  # every task has its section; those not run show "not run yet"
    settings.systems = {task: [s for s in systems_of(task)
                               if s in settings.systems.get(task, []) + planned.chosen_systems(task)] for task in TASKS}
    return settings


def build_page(settings: Settings, pictures: Pictures, n_samples: int) -> str:
    runs = build_plan(settings)
    records = {run.id: record for run in runs for record in [read_record(run)] if record is not None}
    sections: List[str] = []
    claims: List[Tuple[str, ClaimResult]] = []
    for number, task in enumerate(TASKS, start=1):
        sections += [f"## {number}. {SECTION_TITLES[task]}", ""] + INTRO[task] + budgets(task, settings)
        mine = [r for r in runs if r.task == task and r.seed is not None]
        groups = settings.tag_sets if task == "tagging" else [""]
        for group in groups:
            data = TaskData(task, group, [r for r in mine if r.group == group], records)
            extra: List[Run] = []
            if task == "translation":
                prep = next(r for r in runs if r.id == "translation/data")
                read_translation(data, prep if prep.id in records else None, n_samples)
                extra = [prep]
            elif task == "lm":
                read_simple(data, readers.lm_metrics)
            elif task == "tagging":
                read_tagging(data, settings.data["ewt_dev"], n_samples)
                sections += [f"### {group.upper()}", ""]
            elif task == "extrapolation":
                read_simple(data, readers.extrapolation_metrics)
            else:
                read_simple(data, readers.classification_metrics)
            if task == "extrapolation":
                prep = next(r for r in runs if r.id == "extrapolation/data")
                result = extrapolation_section(data, settings, pictures, prep)
            else:
                result = section(data, settings, pictures, extra)
            sections += result.lines
            claims += result.claims
    sections += [f"## {len(TASKS) + 1}. Synthetic tasks: which position method, for what?", ""]
    sections += results_section(COMPARISON_RECORDS, pictures.page_dir)
    head = ["# Results: do the papers' claims hold here?", "",
            "Every number on this page comes from the logs of the evidence runs "
            "(`examples/evidence/`); rows without finished runs say so."]
    return "\n".join(head + [""] + how_made(settings, len(records), len(runs)) + RULES + summary(claims, settings)
                     + sections)


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--evidence-out", help="the runs' folder, as the exact commands show it "
                        "(default: EVIDENCE_OUT, else evidence-output/)")
    parser.add_argument("--output", default=str(default_page()),
                        help="the page (default: docs/results.md; with EVIDENCE_RECORDS elsewhere, results.md in "
                        "that folder)")
    parser.add_argument("--images", help="folder of its pictures (default: images/results/ beside the page)")
    parser.add_argument("--bootstrap-samples", type=int, default=1000,
                        help="paired bootstrap resamples (default: 1000)")
    args = parser.parse_args(argv)
    setup_logging()
    settings = load_settings(args.evidence_out)
    output = Path(args.output).resolve()
    pictures = Pictures(Path(args.images).resolve() if args.images else output.parent / "images" / "results",
                        output.parent)
    page = build_page(settings, pictures, args.bootstrap_samples)
    with atomic_write(str(output)) as out:
        out.write(page)
    pictures.remove_stale()
    print(f"wrote {output} and {len(pictures.written)} picture(s) in {pictures.directory}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
