"""``posattn-prepare-tagging``: CoNLL-U treebank files -> a ``--task pos_tagging`` data directory.

Example (UD English-EWT, the paper's UD settings: UPOS, t = 60, 20 characters, 50% of the words)::

    posattn-prepare-tagging --train en_ewt-ud-train.conllu --valid en_ewt-ud-dev.conllu \\
        --test en_ewt-ud-test.conllu --destdir data-bin/ewt

Writes ``dict.{words,chars,tags}.txt``, ``tagging.json`` and ``{train,valid,test}.{words,chars,tags,
flags}.{bin,idx}``. Training files may be gzip-compressed (``.gz``).
"""

import argparse
from typing import Dict, List, Optional

from fairseq_posattn.cli import positive_int, reported_errors, setup_logging
from fairseq_posattn.data.tagged_corpus import TAG_COLUMNS
from fairseq_posattn.data.tagging_binarize import prepare_tagging_data


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="posattn-prepare-tagging", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--train", nargs="+", required=True, metavar="CONLLU",
                        help="training file(s): vocabularies, OOV and ambiguous words come from them")
    parser.add_argument("--valid", nargs="+", default=[], metavar="CONLLU", help="development file(s)")
    parser.add_argument("--test", nargs="+", default=[], metavar="CONLLU", help="test file(s)")
    parser.add_argument("--destdir", required=True, help="data directory to write")
    parser.add_argument("--tag-column", choices=sorted(TAG_COLUMNS), default="upos",
                        help="tags to learn: UPOS (column 4) or XPOS (column 5)")
    parser.add_argument("--max-length", type=positive_int, default=60,
                        help="longest sentence piece t in words (Dufter et al.: 60); the model's "
                             "--max-source-positions must be at least this")
    parser.add_argument("--long-sentences", choices=["split", "error"], default="split",
                        help="a longer sentence is split into consecutive pieces (every word is still "
                             "tagged and scored) or is an error")
    parser.add_argument("--max-chars", type=positive_int, default=20,
                        help="characters per word seen by the character CNN (Dufter et al.: 20)")
    parser.add_argument("--vocab-fraction", type=float, default=0.5,
                        help="share of the unique training word forms kept in the word vocabulary, most "
                             "frequent first (Dufter et al., UD: 0.5); the rest become <unk>")
    return parser


def main(argv: Optional[List[str]] = None) -> None:
    setup_logging()
    args = build_parser().parse_args(argv)
    splits: Dict[str, List[str]] = {"train": args.train}
    splits.update({name: paths for name, paths in (("valid", args.valid), ("test", args.test)) if paths})
    with reported_errors("posattn-prepare-tagging"):
        prepare_tagging_data(splits, args.destdir, args.tag_column, args.max_length, args.max_chars,
                             args.vocab_fraction, args.long_sentences)


if __name__ == "__main__":
    main()
