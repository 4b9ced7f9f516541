#!/usr/bin/env python
"""Markdown table of part-of-speech accuracy: mean and sd over seeds, per variant and subset.

Reads ``{run dir}/seed*/validate.log`` (fairseq-validate with ``--criterion pos_tagging``) and
``train.log`` (its ``wall_seconds`` line, written by run.sh)::

    python examples/pos_tagging/results_table.py --variant "SAN+PE[add]=out/runs/pe_add" ...
"""

import argparse
import glob
import os
import re
import statistics
from typing import Dict, List

METRICS = ("accuracy", "oov_accuracy", "ambiguous_accuracy")
VALID_LINE = re.compile(r"valid on '(?P<subset>[^']+)' subset \| (?P<stats>.*)$")


def read_validation(path: str) -> Dict[str, Dict[str, float]]:
    """subset -> metric -> value, from one fairseq-validate log."""
    scores: Dict[str, Dict[str, float]] = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            match = VALID_LINE.search(line.rstrip())
            if match:
                stats = dict(item.split(" ", 1) for item in match["stats"].split(" | ") if " " in item)
                scores[match["subset"]] = {m: float(stats[m]) for m in METRICS if m in stats}
    if not scores:
        raise SystemExit(f"{path}: no 'valid on ... subset' line: did fairseq-validate fail? (see the log)")
    return scores


def wall_seconds(path: str) -> float:
    with open(path, encoding="utf-8") as f:
        found = [float(line.split()[1]) for line in f if line.startswith("wall_seconds ")]
    return found[-1] if found else float("nan")


def mean_sd(values: List[float]) -> str:
    if not values:
        return "n/a"
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.mean(values):.2f} ± {sd:.2f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--variant", action="append", required=True, metavar="NAME=DIR",
                        help="a variant's name and its runs folder (holding seed*/validate.log)")
    args = parser.parse_args()
    rows, subsets = [], []
    for spec in args.variant:
        name, _, directory = spec.partition("=")
        seeds = sorted(glob.glob(os.path.join(directory, "seed*")))
        scores = [read_validation(os.path.join(seed, "validate.log")) for seed in seeds]
        walls = [wall_seconds(os.path.join(seed, "train.log")) for seed in seeds]
        subsets += [s for s in dict.fromkeys(s for score in scores for s in score) if s not in subsets]
        rows.append((name, scores, walls))
    for subset in subsets:
        print(f"\n{subset} set, mean ± sd over seeds (accuracy in %):\n")
        print("| model | seeds | all | OOV | ambiguous | training s / run |")
        print("|---|---|---|---|---|---|")
        for name, scores, walls in rows:
            cells = [mean_sd([s[subset][m] for s in scores if m in s.get(subset, {})]) for m in METRICS]
            print(f"| {name} | {len(scores)} | {' | '.join(cells)} | {statistics.mean(walls):.0f} |")


if __name__ == "__main__":
    main()
