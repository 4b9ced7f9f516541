"""The report of the suite's records: ``posattn-tasks report`` writes a page (markdown) with the method x task
table, every task's table and plot, the passkey heat maps, the language model's loss against position, and the
verdict of each claim of :mod:`posattn_tasks.claims`; :func:`results_section` is the summary the project's
results page (docs/results.md) carries. Nothing on either is typed by hand: every number is read from the
records."""

import datetime
import os
from collections import defaultdict
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from posattn_tasks import plots
from posattn_tasks.claims import CLAIMS, LEARNED, ComparisonResult, claim_verdict, judge, metric_of
from posattn_tasks.methods import method_label, method_names
from posattn_tasks.records import all_records
from posattn_tasks.statistics import mean_sd
from posattn_tasks.tasks import GENERATED, TASKS
from posattn_tasks.tasks.base import Sizes
from posattn_tasks.tasks.language_model import LanguageModelling
from posattn_tasks.tasks.passkey import DEPTHS, MULTIPLES, split_name

Key = Tuple[str, str, int]  # task, method, seed
Records = Dict[Key, Dict[str, Any]]
SEEDS = (1, 2, 3)


def load(root: Path) -> Dict[Tuple[str, str], Records]:
    """The records under ``root`` by (tier, model)."""
    groups: Dict[Tuple[str, str], Records] = defaultdict(dict)
    for record in all_records(root):
        groups[(record["tier"], record["model"])][(record["task"], record["method"], record["seed"])] = record
    return dict(groups)


def values(records: Records, task: str, method: str, split: str, metric: str) -> List[float]:
    found = [metric_of(r, split, metric) for (t, m, _), r in sorted(records.items()) if t == task and m == method]
    return [v for v in found if v is not None]


def refused(records: Records, task: str, method: str, split: str) -> bool:
    for (t, m, _), record in records.items():
        if t == task and m == method:
            scores = record["scores"]
            return bool(scores.get("refused", {}).get(split) if "perplexity" in scores
                        else scores.get(split, {}).get("refused"))
    return False


def cell(records: Records, task: str, method: str, split: str, metric: str = "answer_accuracy") -> str:
    """``mean ± sd`` over the seeds (accuracies in percent), ``refused``, or ``-`` (not run)."""
    found = values(records, task, method, split, metric)
    if not found:
        return "refused" if refused(records, task, method, split) else "-"
    mean, sd = mean_sd(found)
    if metric == "answer_accuracy":
        mean, sd = 100 * mean, 100 * sd
    return f"{mean:.1f} ± {sd:.1f}" if len(found) > 1 else f"{mean:.1f}"


def methods_present(records: Records) -> List[str]:
    seen = {method for _, method, _ in records}
    return [m for m in method_names() if m in seen] + sorted(seen - set(method_names()))


def tasks_present(records: Records) -> List[str]:
    seen = {task for task, _, _ in records}
    return [t for t in TASKS if t in seen]


def headline_splits(task: str) -> Tuple[str, str]:
    """The summary table's two columns of a task: in distribution and the longest test."""
    if task == "passkey":
        return "1x", "8x"
    if task == LanguageModelling.name:
        return "1x", "32x"
    return "1x", "8x"


def headline(records: Records, task: str, method: str, split: str) -> str:
    """A summary cell: accuracy in percent (passkey: the mean over depths), the language model's perplexity."""
    if task == LanguageModelling.name:
        found = values(records, task, method, split, "perplexity")
        return f"{mean_sd(found)[0]:.0f}" if found else ("refused" if refused(records, task, method, split) else "-")
    splits = [split_name(int(split[:-1]), d) for d in DEPTHS] if task == "passkey" else [split]
    per_split = [values(records, task, method, s, "answer_accuracy") for s in splits]
    if not all(per_split):
        return "refused" if any(refused(records, task, method, s) for s in splits) else "-"
    return f"{100 * mean_sd([mean_sd(v)[0] for v in per_split])[0]:.0f}"


def summary_table(records: Records) -> List[str]:
    tasks = tasks_present(records)
    head = "| method | " + " | ".join(f"{t} {' / '.join(headline_splits(t))}" for t in tasks) + " |"
    rows = [head, "|---|" + "---|" * len(tasks)]
    for method in methods_present(records):
        cells = [" / ".join(headline(records, t, method, s) for s in headline_splits(t)) for t in tasks]
        rows.append(f"| {method_label(method)} | " + " | ".join(cells) + " |")
    return rows


def chance_of(task: str) -> float:
    return 1.0 / len(GENERATED[task]().answer_tokens()) if task in GENERATED else 0.0


def best_in_distribution(records: Records, task: str) -> Tuple[str, float]:
    """The method with the highest mean accuracy on ``task`` in distribution, and that accuracy (passkey: the
    mean over depths)."""
    splits = [split_name(1, d) for d in DEPTHS] if task == "passkey" else ["1x"]
    means = {m: mean_sd([mean_sd(v)[0] for v in found])[0] for m in methods_present(records)
             for found in [[values(records, task, m, s, "answer_accuracy") for s in splits]] if all(found)}
    method = max(means, key=means.__getitem__)
    return method, means[method]


def judged(records: Records) -> List[Tuple[Any, List[ComparisonResult]]]:
    seeds = sorted({seed for _, _, seed in records})
    chance = {task: chance_of(task) for task in GENERATED}
    best = {task: best_in_distribution(records, task)[1] for task in tasks_present(records) if task in GENERATED}
    return [(claim, [judge(c, records, seeds, chance, best) for c in claim.comparisons]) for claim in CLAIMS]


def side_text(values_by_seed: Mapping[int, float], metric: str) -> str:
    if not values_by_seed:
        return "-"
    mean, sd = mean_sd(list(values_by_seed.values()))
    scale = 100 if metric == "answer_accuracy" else 1
    return f"{scale * mean:.1f} ± {scale * sd:.1f}"


def claim_lines(claim: Any, results: Sequence[ComparisonResult]) -> List[str]:
    lines = [f"**{claim.paper}**: {claim.statement}. **Verdict: {claim_verdict(results)}.**", "",
             "| system | reference | metric | system | reference | Δ per seed | p | verdict |",
             "|---|---|---|---|---|---|---|---|"]
    for result in results:
        c = result.comparison
        metric = "accuracy %" if c.system.metric == "answer_accuracy" else "perplexity"
        scale = 100 if c.system.metric == "answer_accuracy" else 1
        deltas = ", ".join(f"{scale * d:+.1f}" for _, d in sorted(result.deltas.items())) or "-"
        p = "-" if result.p_value is None else f"{result.p_value:.3f}"
        lines.append(f"| {c.system.describe()} | {c.reference.describe()} | {metric}"
                     f"{' (higher)' if c.direction > 0 else ' (lower)'} | {side_text(result.system, c.system.metric)}"
                     f" | {side_text(result.reference, c.reference.metric)} | {deltas} | {p} | {result.verdict} |")
    return lines + ["", f"The paper's numbers: {claim.paper_numbers} At our size: {claim.caveat}", ""]


class Pictures:
    """The page's pictures in ``directory``, linked relative to the page's folder."""

    def __init__(self, directory: Path, page_dir: Path):
        self.directory, self.page_dir, self.written = directory, page_dir, []

    def path(self, name: str) -> Path:
        self.directory.mkdir(parents=True, exist_ok=True)
        self.written.append(self.directory / name)
        return self.directory / name

    def link(self, path: Path, alt: str) -> str:
        return f"![{alt}]({Path(os.path.relpath(path, self.page_dir)).as_posix()})"


def accuracy_picture(pictures: Pictures, records: Records, task: str, prefix: str) -> Optional[str]:
    multiples = ["1x", "2x", "4x", "8x"]
    curves = {}
    for method in methods_present(records):
        points = [(int(s[:-1]), mean_sd(v)[0]) for s in multiples
                  for v in [values(records, task, method, s, "answer_accuracy")] if v]
        if points:
            curves[method_label(method)] = ([x for x, _ in points], [100 * y for _, y in points])
    if not curves:
        return None
    path = plots.lines(pictures.path(f"{prefix}{task}.png"), f"{task}: accuracy against test length",
                       "test length / training length", "answers right (%)", curves, log_x=True, multiples=True)
    return pictures.link(path, f"{task}: accuracy against test length")


def passkey_picture(pictures: Pictures, records: Records, prefix: str) -> Optional[str]:
    maps = {}
    for method in methods_present(records):
        grid = [[(lambda v: mean_sd(v)[0] if v else None)(values(records, "passkey", method, split_name(m, d),
                                                                   "answer_accuracy")) for m in MULTIPLES]
                for d in DEPTHS]
        if any(v is not None for row in grid for v in row):
            maps[method_label(method)] = grid
    if not maps:
        return None
    path = plots.heat_maps(pictures.path(f"{prefix}passkey.png"), "passkey: digits right by depth (rows) and "
                           "test length / training length (columns)", maps, [f"{d:g}" for d in DEPTHS],
                           [f"{m}x" for m in MULTIPLES])
    return pictures.link(path, "passkey retrieval heat maps")


def loss_picture(pictures: Pictures, records: Records, prefix: str, training_length: int) -> Optional[str]:
    curves = {}
    for method in methods_present(records):
        found = [r["scores"]["curve"] for (t, m, _), r in sorted(records.items())
                 if t == LanguageModelling.name and m == method and "curve" in r["scores"]]
        if found:
            positions = found[0]["positions"]
            curves[method_label(method)] = (positions, [sum(c["loss"][i] for c in found) / len(found)
                                                        for i in range(len(positions))])
    if not curves:
        return None
    path = plots.lines(pictures.path(f"{prefix}language-model-loss.png"), "language model: loss against position "
                       "(non-overlapping windows of 32 x the training length)", "position (tokens)",
                       "loss (nats)", curves, log_x=True, mark=training_length)
    return pictures.link(path, "loss against position")


def task_section(records: Records, task: str, sizes: Sizes, pictures: Optional[Pictures], prefix: str) -> List[str]:
    built = GENERATED[task]() if task in GENERATED else None
    about = built or LanguageModelling
    lines = [f"### {task}", "", f"{about.about[0].upper()}{about.about[1:]} ({about.citation}). Trained on "
             f"{sizes.size} {about.unit}, {sizes.steps} steps of {sizes.batch_size} examples, learning rate "
             f"{sizes.learning_rate:g}.", ""]
    if task == LanguageModelling.name:
        splits = [f"{m}x" for m in (1, 2, 4, 8, 16, 32)]
        lines += ["Perplexity, non-overlapping windows (mean ± sd over seeds):", "",
                  "| method | " + " | ".join(splits) + " |", "|---|" + "---|" * len(splits)]
        lines += [f"| {method_label(m)} | " + " | ".join(cell(records, task, m, s, "perplexity") for s in splits)
                  + " |" for m in methods_present(records)]
        picture = pictures and plots.available() and loss_picture(pictures, records, prefix, sizes.size)
    else:
        method, accuracy = best_in_distribution(records, task)
        lines += [f"Calibration: the best method in distribution is {method_label(method)}, "
                  f"{100 * accuracy:.1f}% of answers right" + (
                      "." if accuracy >= LEARNED else f", below the {100 * LEARNED:.0f}% the suite aims for: no "
                      "method learns the task at this size, so its longer tests and the verdicts on it say "
                      "little."), ""]
        splits = [s.name for s in built.splits()]
        if task == "passkey":
            splits = [f"{m}x-depth{d}" for m in MULTIPLES for d in (0, 50, 100)]
        lines += ["Answers right, % (mean ± sd over seeds):", "", "| method | " + " | ".join(splits) + " |",
                  "|---|" + "---|" * len(splits)]
        lines += [f"| {method_label(m)} | " + " | ".join(cell(records, task, m, s) for s in splits) + " |"
                  for m in methods_present(records)]
        picture = pictures and plots.available() and (
            passkey_picture(pictures, records, prefix) if task == "passkey"
            else accuracy_picture(pictures, records, task, prefix))
    return lines + ([""] + [picture] if picture else []) + [""]


def timing_lines(records: Records) -> List[str]:
    """The processor time per run by task (the wall time of a run on a busy machine says little), and in all."""
    by_task: Dict[str, List[float]] = defaultdict(list)
    for (task, _, _), record in records.items():
        by_task[task].append(record.get("cpu_seconds", record["wall_seconds"]))
    total = sum(sum(v) for v in by_task.values())
    parts = ", ".join(f"{t} {mean_sd(by_task[t])[0]:.0f} s" for t in tasks_present(records))
    threads = sorted({r["machine"]["threads"] for r in records.values()})
    return [f"Processor time per run (training and test, mean; {'/'.join(map(str, threads))} thread(s) a run): "
            f"{parts}; {total / 3600:.1f} core-hours in all."]


def group_lines(tier: str, model: str, records: Records, pictures: Optional[Pictures], root_text: str) -> List[str]:
    planned = len(TASKS) * len(method_names()) * len(SEEDS)
    some = next(iter(records.values()))
    size = some["settings"]["model_size"]
    lines = [f"## Tier {tier}, model {model}", "",
             f"{len(records)} runs recorded of the {planned} of the full grid ({len(TASKS)} tasks x "
             f"{len(method_names())} methods x {len(SEEDS)} seeds). Model: {size['layers']} layers, width "
             f"{size['dim']}, {size['heads']} heads; {some['settings']['test_examples']} test examples per split. "
             f"Resume with `posattn-tasks run --tier {tier} --model {model} --jobs 2 --records {root_text}` "
             f"(finished runs are kept; the command runs the rest).", ""] + timing_lines(records) + [""]
    lines += ["### Every method on every task", "",
              "Accuracy (% of answers right, mean over seeds) in distribution / at the longest test length; "
              "passkey: the mean over depths; language model: perplexity at 1x / 32x the training length.", ""]
    lines += summary_table(records) + ["", "### The papers' claims", ""]
    for claim, results in judged(records):
        lines += claim_lines(claim, results)
    for task in tasks_present(records):
        sizes = Sizes(**some_record(records, task)["settings"]["sizes"])
        lines += task_section(records, task, sizes, pictures, f"{tier}-{model}-")
    return lines


def some_record(records: Records, task: str) -> Dict[str, Any]:
    return next(r for (t, _, _), r in records.items() if t == task)


def build_page(root: Path, pictures: Optional[Pictures], page_dir: Path) -> str:
    groups = load(root)
    root_text = Path(os.path.relpath(root, Path.cwd())).as_posix()
    lines = ["# The comparison suite: which position method, for what?", "",
             f"Generated by `posattn-tasks report` on {datetime.date.today().isoformat()} from the records in "
             f"`{Path(os.path.relpath(root, page_dir)).as_posix()}`; every number is read from them. "
             "The tasks, the model, the verdict rule and how to run the suite: "
             "[the suite's README](../examples/comparison/README.md).", ""]
    if not plots.available():
        lines += ["(No plots: matplotlib is not installed.)", ""]
    if not groups:
        lines += ["No runs are recorded yet.", ""]
    for (tier, model), records in sorted(groups.items()):
        lines += group_lines(tier, model, records, pictures, root_text)
    return "\n".join(lines).rstrip() + "\n"


def write_report(root: Path, out: Path, images: Path) -> str:
    """Write the page ``out`` and its pictures in ``images``; returns what was written."""
    out = out.resolve()
    pictures = Pictures(images.resolve(), out.parent) if plots.available() else None
    page = build_page(root.resolve(), pictures, out.parent)
    out.parent.mkdir(parents=True, exist_ok=True)
    temporary = out.with_name(f".{out.name}.tmp")
    temporary.write_text(page, encoding="utf-8")
    os.replace(temporary, out)
    return f"wrote {out} and {len(pictures.written) if pictures else 0} picture(s)"


def results_section(root: Path, page_dir: Path, tier: str = "cpu", model: str = "posattn") -> List[str]:
    """The results page's section on the suite: the method x task table, the claims' verdicts of ``tier``'s
    records and the plots of the suite's own page (``page_dir``/comparison.md, with the tables per task), which
    ``posattn-tasks report`` draws."""
    records = load(root).get((tier, model), {}) if root.is_dir() else {}
    link = "comparison.md"
    lines = [f"Every registered causal method, NoPE and the sinusoidal APE on the synthetic tasks of position "
             f"papers (flip-flop, selective copy, counting, associative recall, passkey, copy / reverse / addition "
             f"past the training length, state tracking) and PTB's loss against position, by `posattn-tasks` "
             f"(its {tier} tier: 2-layer, width-64 models trained minutes each on a CPU). Every table per task, the "
             f"plots, the sizes and the commands: [comparison.md]({link}).", ""]
    if not records:
        return lines + ["No runs of this tier are recorded yet.", ""]
    lines += [f"{len(records)} runs recorded of the {len(TASKS) * len(method_names()) * len(SEEDS)} of the grid.",
              "", "Accuracy (%) in distribution / at the longest test; passkey: the mean over depths; "
              "language model: perplexity at 1x / 32x.", ""] + summary_table(records)
    lines += ["", "| claim | paper | verdict |", "|---|---|---|"]
    lines += [f"| {claim.statement} | {claim.paper} | {claim_verdict(results)} |" for claim, results in
              judged(records)]
    images = page_dir / "images" / "comparison"
    for name, alt in (("language-model-loss", "loss against position"), ("passkey", "passkey retrieval"),
                      ("reverse", "reverse: accuracy against test length")):
        picture = images / f"{tier}-{model}-{name}.png"
        if picture.is_file():
            lines += ["", f"![{alt}]({Path(os.path.relpath(picture, page_dir)).as_posix()})"]
    return lines + [""]
