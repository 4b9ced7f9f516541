"""Markdown table of fairseq-eval-lm results (valid / test perplexity) from the logs of run_ptb.sh.

Reads ``eval.<model>.<subset>.log`` (fairseq-eval-lm output) and ``train.<model>.log``
(fairseq-train output, with a ``wall_seconds N`` line appended by the script) in ``--logs``::

    python examples/language_model/results_table.py --logs ptb-lm-output/logs --models lstm_lm tf_da

fairseq-eval-lm prints ``Evaluated N tokens in ...`` and ``Loss (base 2): X, Perplexity: Y``;
the perplexity is 2 ** X where X is the mean base-2 loss over all N scored tokens (every target
token, end of sentence included).
"""

import argparse
import math
import os
import re
import sys
from typing import Dict, List, Optional

LOSS_RE = re.compile(r"Loss \(base 2\): ([-+0-9.naif]+), Perplexity: ([-+0-9.naif]+)")
TOKENS_RE = re.compile(r"Evaluated ([0-9,]+) tokens")
PARAMS_RE = re.compile(r"num\. (?:shared )?model params: ([0-9,]+)")
UPDATE_RE = re.compile(r"num_updates[ =]+([0-9]+)")
EPOCH_STATS_RE = re.compile(r"\| train \| epoch .*?\| wpb ([0-9.]+) .*?\| num_updates ([0-9]+)")
WALL_RE = re.compile(r"^wall_seconds (\d+)", re.M)


def read(path: str) -> Optional[str]:
    if not os.path.exists(path):
        return None
    with open(path, encoding="utf-8", errors="replace") as f:
        return f.read()


def parse_eval(text: Optional[str]) -> Dict[str, float]:
    """``loss`` (base 2), ``ppl`` and ``tokens`` of one fairseq-eval-lm log (empty if absent)."""
    if text is None:
        return {}
    found: Dict[str, float] = {}
    matches = LOSS_RE.findall(text)
    if matches:
        loss, ppl = matches[-1]
        found["loss"], found["ppl"] = float(loss), float(ppl)
    tokens = TOKENS_RE.findall(text)
    if tokens:
        found["tokens"] = int(tokens[-1].replace(",", ""))
    return found


def parse_train(text: Optional[str]) -> Dict[str, float]:
    """Parameters, last update number and wall seconds of one fairseq-train log."""
    if text is None:
        return {}
    found: Dict[str, float] = {}
    params = PARAMS_RE.findall(text)
    if params:
        found["params"] = int(params[0].replace(",", ""))
    updates = UPDATE_RE.findall(text)
    if updates:
        found["updates"] = int(updates[-1])
    epochs = EPOCH_STATS_RE.findall(text)  # end-of-epoch stats: words per batch over the epoch
    if epochs:
        found["tokens"] = 0
        done = 0
        for wpb, updates in epochs:
            found["tokens"] += round(float(wpb) * (int(updates) - done))
            done = int(updates)
    wall = WALL_RE.findall(text)
    if wall:
        found["wall"] = int(wall[-1])
    return found


def fmt(value: Optional[float], spec: str) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return format(value, spec)


def table(logs: str, models: List[str]) -> str:
    rows = [
        "| model | params | updates | train tokens | train wall (s) | valid loss (base 2) | valid ppl | test loss (base 2) | test ppl | test tokens scored |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for model in models:
        train = parse_train(read(os.path.join(logs, f"train.{model}.log")))
        valid = parse_eval(read(os.path.join(logs, f"eval.{model}.valid.log")))
        test = parse_eval(read(os.path.join(logs, f"eval.{model}.test.log")))
        rows.append(
            f"| {model} | {fmt(train.get('params'), ',')} | {fmt(train.get('updates'), 'd')} | {fmt(train.get('tokens'), ',')} "
            f"| {fmt(train.get('wall'), 'd')} | {fmt(valid.get('loss'), '.3f')} | {fmt(valid.get('ppl'), '.2f')} "
            f"| {fmt(test.get('loss'), '.3f')} | {fmt(test.get('ppl'), '.2f')} | {fmt(test.get('tokens'), ',')} |"
        )
    return "\n".join(rows) + "\n"


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--logs", required=True, help="folder with train.<model>.log and eval.<model>.<subset>.log")
    parser.add_argument("--models", nargs="+", required=True, help="model names, in table order")
    args = parser.parse_args(argv)
    sys.stdout.write(table(args.logs, args.models))
    return 0


if __name__ == "__main__":
    sys.exit(main())
