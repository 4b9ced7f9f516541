"""``posattn-prepare-classification``: ``label sentence`` files -> fairseq's sentence_prediction text files.

Example (SST-2 as distributed with Kim (2014): ``stsa.binary.{train,dev}``)::

    posattn-prepare-classification --train stsa.binary.train --valid stsa.binary.dev --labels 0 1 \\
        --destdir sst2-text

Writes ``{split}.input0`` (the sentences) and ``{split}.label`` (their labels), the input of
``fairseq-preprocess --only-source`` into ``input0/`` and ``label/`` for ``--task sentence_prediction``.
Every split is checked before anything is written: an empty line, a label without a sentence, a label
outside ``--labels`` or a label that the training split never uses is an error naming ``file:line``.
The labels' counts are logged; without ``--labels``, a label on under 1% of the training examples (a
typo makes a class of its own) is a warning naming its first ``file:line``.
"""

import argparse
from typing import List, Optional

from fairseq_posattn.cli import reported_errors, setup_logging
from fairseq_posattn.data.sentence_classification import SPLITS, split_corpus


def build_parser() -> argparse.ArgumentParser:
    """The options of ``posattn-prepare-classification`` (the module docstring is its description)."""
    parser = argparse.ArgumentParser(prog="posattn-prepare-classification", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    for split in SPLITS:
        parser.add_argument(f"--{split}", required=split == "train", metavar="FILE",
                            help=f"{split} split, one 'label sentence' per line")
    parser.add_argument("--labels", nargs="+", type=label_list, metavar="LABEL",
                        help="the allowed labels, e.g. 0,1 or 0 1: any other is an error (default: any first "
                             "field; a label on under 1%% of the training examples, perhaps a typo, is a warning)")
    parser.add_argument("--destdir", required=True, help="where {split}.input0 and {split}.label go")
    return parser


def main(argv: Optional[List[str]] = None) -> None:
    args = build_parser().parse_args(argv)
    setup_logging()
    splits = {split: getattr(args, split) for split in SPLITS if getattr(args, split)}
    labels = [label for given in args.labels for label in given] if args.labels else None
    with reported_errors("posattn-prepare-classification"):
        split_corpus(splits, args.destdir, labels)


def label_list(text: str) -> List[str]:
    """argparse type: ``0,1`` -> ``["0", "1"]`` (a label holds no comma and no space)."""
    labels = text.split(",")
    if not all(labels):
        raise argparse.ArgumentTypeError(f"expected labels separated by commas, e.g. 0,1, got {text!r}")
    return labels


if __name__ == "__main__":
    main()
