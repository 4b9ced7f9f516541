"""``posattn-prepare-structure``: write a split's structural side data next to fairseq-preprocess's.

Example (after ``fairseq-preprocess --source-lang en --target-lang de ... --destdir data-bin``)::

    posattn-prepare-structure --conllu prepared/train.conllu --bpe prepared/train.bpe.en \\
        --destdir data-bin --split train --source-lang en --target-lang de

``--conllu`` is the parse of the *tokenized* source (``posattn-parse``), ``--bpe`` the BPE text that
fairseq-preprocess binarized. The output is ``{destdir}/{split}.{src}-{tgt}.{src}.structure.{bin,idx}``.
Before anything is aligned, the three inputs must hold the same number of sentences; then every
sentence's pieces must rebuild its parsed words and match its binarized length. Errors name the files
(and ``file:line``) and nothing is written.
"""

import argparse
import os
from typing import List, Optional

from fairseq.data import data_utils

from fairseq_posattn.cli import reported_errors, setup_logging
from fairseq_posattn.structure.binarize import check_sentence_counts, write_side_data
from fairseq_posattn.structure.conllu_io import read_conllu
from fairseq_posattn.tasks.translation_structural import structure_prefix

PROG = "posattn-prepare-structure"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--conllu", required=True, help="CoNLL-U parse of the tokenized source split")
    parser.add_argument("--bpe", required=True, help="BPE source text of the split, as binarized")
    parser.add_argument("--destdir", required=True, help="fairseq-preprocess --destdir")
    parser.add_argument("--split", required=True, help="split name as binarized: train, valid, test, ...")
    parser.add_argument("--source-lang", required=True)
    parser.add_argument("--target-lang", required=True)
    return parser


def main(argv: Optional[List[str]] = None) -> None:
    args = build_parser().parse_args(argv)
    setup_logging()
    with reported_errors(PROG):
        prepare_structure(args)


def prepare_structure(args: argparse.Namespace) -> None:
    """Check the inputs (present, same number of sentences), then align, compute and write the side data."""
    for option, path in (("--conllu", args.conllu), ("--bpe", args.bpe)):
        if not os.path.isfile(path):
            raise ValueError(f"{option} {path}: no such file")
    binarized = os.path.join(args.destdir, f"{args.split}.{args.source_lang}-{args.target_lang}.{args.source_lang}")
    source = data_utils.load_indexed_dataset(binarized, None)
    if source is None:
        raise ValueError(f"no binarized source {binarized}.{{bin,idx}}: run fairseq-preprocess first, with "
                         "the same --destdir and languages")
    check_sentence_counts(args.bpe, args.conllu, binarized, len(source.sizes))
    parses = ((s.words, s.heads, s.line) for s in read_conllu(args.conllu))
    prefix = structure_prefix(args.destdir, args.split, args.source_lang, args.target_lang)
    write_side_data(parses, args.bpe, prefix, conllu_path=args.conllu, expected_sizes=source.sizes)


if __name__ == "__main__":
    main()
