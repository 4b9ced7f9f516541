"""``posattn-learning-curves``: a validation metric against updates, from fairseq-train logs.

Reads the logs (fairseq-train's stdout/stderr, ``--log-format simple`` or ``json``) of several runs,
groups them by label (the same label several times = several seeds of one variant: drawn as their
mean with a min-max or ± sd band), and writes one PNG, the extracted points as JSON beside it
(same name, ``.json``), and prints a markdown table of the best and final value per label::

    posattn-learning-curves --run vanilla=runs/vanilla/seed1/train.log \\
        --run vanilla=runs/vanilla/seed2/train.log --run DA=runs/da/seed1/train.log \\
        --metric accuracy --output learning_curves.png

Any validation statistic fairseq logs can be the metric (accuracy, loss, ppl, oov_accuracy, ...).
"""

import argparse
import json
import logging
import os
from typing import List, Optional

from fairseq_posattn.cli import name_and_path, reported_errors, setup_logging
from fairseq_posattn.inspect.learning_curves import (
    X_CHOICES,
    curves_json,
    draw,
    lower_is_better,
    read_groups,
    summary_table,
)

logger = logging.getLogger("posattn-learning-curves")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="posattn-learning-curves", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run", type=name_and_path("LABEL"), action="append", required=True, metavar="LABEL=PATH",
                        help="a run's label and its fairseq-train log; repeat a label for several seeds")
    parser.add_argument("--metric", default="accuracy", help="validation statistic to draw (default: accuracy)")
    parser.add_argument("--x", choices=X_CHOICES, default="num_updates", help="x axis (default: num_updates)")
    parser.add_argument("--subset", default="valid", help="validation subset (default: valid)")
    parser.add_argument("--band", choices=["minmax", "sd"], default="minmax",
                        help="band around the mean of a label's runs: their min-max range or ± sd (default: minmax)")
    parser.add_argument("--best", choices=["max", "min"],
                        help="which end is best in the table (default: min for losses and ppl, else max)")
    parser.add_argument("--title", help="picture title")
    parser.add_argument("--output", default="learning_curves.png", help="PNG to write (default: learning_curves.png)")
    parser.add_argument("--table", help="also write the markdown table to this file")
    return parser


def run(args: argparse.Namespace) -> str:
    """Read, draw, write; return the markdown table."""
    groups = read_groups(args.run, args.metric, args.x, args.subset)
    lower = args.best == "min" if args.best else lower_is_better(args.metric)
    os.makedirs(os.path.dirname(os.path.abspath(args.output)), exist_ok=True)
    draw(groups, args.metric, args.x, args.subset, args.output, args.band, args.title)
    points = os.path.splitext(args.output)[0] + ".json"
    with open(points, "w", encoding="utf-8") as f:
        json.dump(curves_json(groups, args.metric, args.x, args.subset), f)
    logger.info("wrote %s and %s", args.output, points)
    table = summary_table(groups, args.metric, lower, args.x)
    if args.table:
        with open(args.table, "w", encoding="utf-8") as f:
            f.write(table)
    return table


def main(argv: Optional[List[str]] = None) -> None:
    args = build_parser().parse_args(argv)
    setup_logging()
    with reported_errors("posattn-learning-curves"):
        table = run(args)
    print(table, end="")


if __name__ == "__main__":
    main()
