#!/usr/bin/env python
"""Markdown tables of part-of-speech accuracy: mean and sd over seeds, per variant and subset.

Reads ``{run dir}/seed*/validate.log`` (fairseq-validate with ``--criterion pos_tagging``) and
``train.log`` (its ``wall_seconds`` line, written by run.sh)::

    python examples/pos_tagging/results_table.py --variant "SAN+PE[add]=out/runs/pe_add" ...

With ``--treebank-root ROOT --treebanks A B ...`` the run folders are relative to ``ROOT/A``,
``ROOT/B``, ...: one row per treebank (all-word accuracy, test set where there is one, else dev) and
the macro mean over treebanks with the average sd over seeds, as Dufter et al.'s Table 2c/2d.
"""

import argparse
import glob
import os
import re
import statistics
from typing import Dict, List, Tuple

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


def read_runs(directory: str) -> List[Dict[str, Dict[str, float]]]:
    """The validation scores of every seed of one variant."""
    seeds = sorted(glob.glob(os.path.join(directory, "seed*")))
    if not seeds:
        raise SystemExit(f"{directory}: no seed* run folders")
    return [read_validation(os.path.join(seed, "validate.log")) for seed in seeds]


def variant_table(variants: List[Tuple[str, str]]) -> None:
    rows, subsets = [], []
    for name, directory in variants:
        scores = read_runs(directory)
        walls = [wall_seconds(os.path.join(seed, "train.log"))
                 for seed in sorted(glob.glob(os.path.join(directory, "seed*")))]
        subsets += [s for s in dict.fromkeys(s for score in scores for s in score) if s not in subsets]
        rows.append((name, scores, walls))
    for subset in subsets:
        print(f"\n{subset} set, mean ± sd over seeds (accuracy in %):\n")
        print("| model | seeds | all | OOV | ambiguous | training s / run |")
        print("|---|---|---|---|---|---|")
        for name, scores, walls in rows:
            cells = [mean_sd([s[subset][m] for s in scores if m in s.get(subset, {})]) for m in METRICS]
            print(f"| {name} | {len(scores)} | {' | '.join(cells)} | {statistics.mean(walls):.0f} |")


def treebank_table(root: str, treebanks: List[str], variants: List[Tuple[str, str]]) -> None:
    means: Dict[str, List[float]] = {name: [] for name, _ in variants}
    sds: Dict[str, List[float]] = {name: [] for name, _ in variants}
    print("| treebank | " + " | ".join(name for name, _ in variants) + " |")
    print("|---" * (len(variants) + 1) + "|")
    for treebank in treebanks:
        cells = []
        for name, directory in variants:
            scores = read_runs(os.path.join(root, treebank, directory))
            subset = "test" if all("test" in s for s in scores) else "valid"
            values = [s[subset]["accuracy"] for s in scores]
            means[name].append(statistics.mean(values))
            sds[name].append(statistics.stdev(values) if len(values) > 1 else 0.0)
            cells.append(f"{means[name][-1]:.2f}")
        print(f"| {treebank} | " + " | ".join(cells) + " |")
    print("| **macro mean** (avg. sd) | " + " | ".join(
        f"{statistics.mean(means[name]):.2f} ({statistics.mean(sds[name]):.2f})" for name, _ in variants) + " |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--variant", action="append", required=True, metavar="NAME=DIR",
                        help="a variant's name and its runs folder (holding seed*/validate.log)")
    parser.add_argument("--treebank-root", help="folder of per-treebank outputs (run_ud_treebanks.sh)")
    parser.add_argument("--treebanks", nargs="*", default=[], help="treebank folders under --treebank-root")
    args = parser.parse_args()
    variants = [tuple(spec.partition("=")[::2]) for spec in args.variant]
    if args.treebank_root:
        treebank_table(args.treebank_root, args.treebanks, variants)
    else:
        variant_table(variants)


if __name__ == "__main__":
    main()
