"""Learning curves from fairseq-train logs: a validation metric against updates (or epochs).

Dufter et al. (2020, Figure 2 and Table 2a) compare position variants by their development accuracy
over the course of training; this module reads that curve out of the logs fairseq-train writes,
groups the runs of one variant (one label, several seeds), and draws one picture: per label the mean
over its runs as a line, with the runs' min-max range (or mean ± sd) as a band.

fairseq-train logs every validation once, tagged with the subset's name, in either format:

- ``--log-format simple`` (and tqdm)::

    ... | INFO | valid | epoch 003 | valid on 'valid' subset | loss 0.52 | accuracy 91.2 | ... | num_updates 300

- ``--log-format json``, the subset's name prefixed to every statistic but the epoch::

    ... | INFO | valid | {"epoch": 3, "valid_loss": "0.52", "valid_accuracy": "91.2", ..., "valid_num_updates": "300"}

One point per x value: where a log repeats one (a resumed run appended to its log, or several
validations within one epoch with ``x = epoch``) the later line wins.
"""

import json
import re
import statistics
from dataclasses import dataclass, field
from typing import Dict, Iterator, List, Optional, Sequence, Tuple

SIMPLE_RE = re.compile(r"(?:epoch (?P<epoch>\d+) \| )?valid on '(?P<subset>[^']+)' subset \| (?P<stats>.*?)\s*$")
JSON_RE = re.compile(r"\| (?P<tag>[^|\s]+) \| (?P<stats>\{.*\})\s*$")
DONE_RE = re.compile(r"done training in ([0-9.]+) seconds")
X_CHOICES = ("num_updates", "epoch")
LOWER_IS_BETTER = ("loss", "nll_loss", "ppl", "wer", "uer")


class LogError(ValueError):
    """A log that cannot give the requested curve; the message names the file."""


def _number(value: object) -> Optional[float]:
    try:
        return float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None


def _simple_stats(match: "re.Match") -> Dict[str, float]:
    stats = {}
    for item in match["stats"].split(" | "):
        key, _, value = item.partition(" ")
        number = _number(value)
        if number is not None:
            stats[key] = number
    if match["epoch"] is not None:
        stats["epoch"] = float(match["epoch"])
    return stats


def _json_stats(text: str, subset: str) -> Optional[Dict[str, float]]:
    try:
        raw = json.loads(text)
    except json.JSONDecodeError:
        return None
    prefix = f"{subset}_"
    stats = {key[len(prefix):]: _number(value) for key, value in raw.items() if key.startswith(prefix)}
    stats["epoch"] = _number(raw.get("epoch"))
    return {key: value for key, value in stats.items() if value is not None}


def read_validations(path: str, subset: str = "valid") -> Iterator[Dict[str, float]]:
    """Every validation of ``subset`` in one fairseq-train log, in log order, as ``{stat: value}``
    (``epoch``, ``num_updates``, ``loss``, ``accuracy``, ... without the JSON subset prefix)."""
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            match = SIMPLE_RE.search(line)
            if match and match["subset"] == subset:
                yield _simple_stats(match)
                continue
            match = JSON_RE.search(line)
            if match and match["tag"] == subset:
                stats = _json_stats(match["stats"], subset)
                if stats is not None:
                    yield stats


def training_seconds(path: str) -> Optional[float]:
    """fairseq-train's ``done training in N seconds``, or None for an unfinished log."""
    with open(path, encoding="utf-8", errors="replace") as f:
        found = DONE_RE.findall(f.read())
    return float(found[-1]) if found else None


@dataclass
class Curve:
    """One run's ``(x, value)`` points, sorted by x."""

    path: str
    points: List[Tuple[float, float]]

    @property
    def final(self) -> float:
        return self.points[-1][1]

    def best(self, lower_is_better: bool) -> Tuple[float, float]:
        """``(x, value)`` of the best validation; the latest among ties, as fairseq's checkpoint_best."""
        key = (lambda p: (-p[1], p[0])) if lower_is_better else (lambda p: (p[1], p[0]))
        return max(self.points, key=key)


def read_curve(path: str, metric: str = "accuracy", x: str = "num_updates", subset: str = "valid") -> Curve:
    """The ``metric`` of every ``subset`` validation in the log ``path`` against ``x``."""
    if x not in X_CHOICES:
        raise ValueError(f"x must be one of {', '.join(X_CHOICES)}, got {x!r}")
    try:
        validations = list(read_validations(path, subset))
    except OSError as e:
        raise LogError(f"{path}: cannot read the log ({e.strerror})") from e
    by_x = {v[x]: v[metric] for v in validations if x in v and metric in v}
    if not by_x:
        if not validations:
            raise LogError(f"{path}: no validation line for subset '{subset}' (is it a fairseq-train log "
                           f"of a run that validated on '{subset}'?)")
        seen = sorted({key for v in validations for key in v} - {"epoch", "num_updates"})
        raise LogError(f"{path}: no '{subset}' validation line has both {metric!r} and {x!r}; "
                       f"its validation metrics are: {', '.join(seen)}")
    return Curve(path, sorted(by_x.items()))


@dataclass
class CurveGroup:
    """The runs of one label (e.g. one variant over several seeds)."""

    label: str
    curves: List[Curve] = field(default_factory=list)

    def aggregate(self) -> List[Dict[str, float]]:
        """Per x seen in any run: ``n`` runs there, their ``mean``, ``sd`` (0 for one run), ``min``, ``max``."""
        values: Dict[float, List[float]] = {}
        for curve in self.curves:
            for x, y in curve.points:
                values.setdefault(x, []).append(y)
        return [
            {"x": x, "n": len(ys), "mean": statistics.mean(ys), "sd": statistics.stdev(ys) if len(ys) > 1 else 0.0,
             "min": min(ys), "max": max(ys)}
            for x, ys in sorted(values.items())
        ]


def read_groups(runs: Sequence[Tuple[str, str]], metric: str = "accuracy", x: str = "num_updates",
                subset: str = "valid") -> List[CurveGroup]:
    """``(label, log path)`` pairs to one :class:`CurveGroup` per label, in order of first appearance."""
    groups: Dict[str, CurveGroup] = {}
    for label, path in runs:
        groups.setdefault(label, CurveGroup(label)).curves.append(read_curve(path, metric, x, subset))
    return list(groups.values())


def lower_is_better(metric: str) -> bool:
    """True for losses, perplexities and error rates; False for accuracies, BLEU, F1, ..."""
    return metric in LOWER_IS_BETTER or metric.endswith("_loss")


def mean_sd(values: Sequence[float], digits: int = 2) -> str:
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.mean(values):.{digits}f} ± {sd:.{digits}f}"


def summary_table(groups: Sequence[CurveGroup], metric: str, lower: bool, x: str = "num_updates") -> str:
    """Markdown: per label the best and the final validation ``metric`` (mean ± sd over its runs),
    where the best one was reached, and fairseq's training time per run."""
    lines = [f"| model | runs | best {metric} | final {metric} | {x} at best | training s / run |",
             "|---|---|---|---|---|---|"]
    for group in groups:
        best = [curve.best(lower) for curve in group.curves]
        seconds = [s for s in (training_seconds(c.path) for c in group.curves) if s is not None]
        time = f"{statistics.mean(seconds):.0f}" if seconds else "n/a"
        lines.append(f"| {group.label} | {len(group.curves)} | {mean_sd([v for _, v in best])} | "
                     f"{mean_sd([c.final for c in group.curves])} | {mean_sd([p for p, _ in best], 0)} | {time} |")
    return "\n".join(lines) + "\n"


def curves_json(groups: Sequence[CurveGroup], metric: str, x: str, subset: str) -> Dict[str, object]:
    """The extracted points and their aggregate, as written beside the picture."""
    return {
        "metric": metric, "x": x, "subset": subset,
        "groups": [{"label": g.label, "runs": [{"path": c.path, "points": c.points} for c in g.curves],
                    "aggregate": g.aggregate()} for g in groups],
    }


def draw(groups: Sequence[CurveGroup], metric: str, x: str, subset: str, output: str, band: str = "minmax",
         title: Optional[str] = None) -> None:
    """One PNG: per label the mean over its runs, and a band (``minmax`` range or ``sd`` around the mean)."""
    import matplotlib  # only when drawing, after the caller has set up logging

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(6.4, 4.2), dpi=100)
    for group in groups:
        rows = group.aggregate()
        xs = [r["x"] for r in rows]
        mean = [r["mean"] for r in rows]
        low = [r["min"] if band == "minmax" else r["mean"] - r["sd"] for r in rows]
        high = [r["max"] if band == "minmax" else r["mean"] + r["sd"] for r in rows]
        runs = len(group.curves)
        (line,) = axes.plot(xs, mean, marker="o", markersize=3, label=f"{group.label} ({runs} run{'s' * (runs > 1)})")
        if runs > 1:
            axes.fill_between(xs, low, high, color=line.get_color(), alpha=0.2, linewidth=0)
    axes.set_xlabel("updates" if x == "num_updates" else "epoch")
    axes.set_ylabel(f"{subset} {metric}")
    spread = "min-max over runs" if band == "minmax" else "mean ± sd over runs"
    axes.set_title(title or f"{subset} {metric} (line: mean, band: {spread})", fontsize=10)
    axes.grid(True, alpha=0.3)
    axes.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(output, format="png")
    plt.close(figure)
