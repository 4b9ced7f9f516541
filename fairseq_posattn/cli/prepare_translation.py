"""``posattn-prepare-translation``: tokenize raw parallel text and apply joint BPE.

Reads ``RAW_DIR/{split}.{lang}``, writes ``OUT_DIR/{split}.tok.{lang}``, ``OUT_DIR/bpe.codes`` and
``OUT_DIR/{split}.bpe.{lang}``, the input of
``fairseq-preprocess --trainpref OUT_DIR/train.bpe --validpref OUT_DIR/valid.bpe ...``.
"""

import argparse
from typing import List, Optional

from fairseq_posattn.cli import positive_int, reported_errors, setup_logging
from fairseq_posattn.data.text_pipeline import DEFAULT_SPLITS, prepare_translation_corpus


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="posattn-prepare-translation", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--raw-dir", required=True, help="folder with raw {split}.{lang} files")
    parser.add_argument("--out-dir", required=True, help="folder for the tokenized and BPE files")
    parser.add_argument("--source-lang", "-s", required=True, help="source language suffix, e.g. en")
    parser.add_argument("--target-lang", "-t", required=True, help="target language suffix, e.g. de")
    parser.add_argument("--bpe-merges", type=positive_int, default=10000,
                        help="joint BPE merge operations learned on train (default: %(default)s)")
    parser.add_argument("--splits", nargs="+", default=list(DEFAULT_SPLITS),
                        help="splits to prepare; must include train (default: %(default)s)")
    parser.add_argument("--max-lines", type=positive_int, default=None,
                        help="keep only the first N lines of every split (quick experiments)")
    return parser


def main(argv: Optional[List[str]] = None) -> None:
    parser = build_parser()
    args = parser.parse_args(argv)
    if "train" not in args.splits:
        parser.error(f"--splits {' '.join(args.splits)} lacks train, on which BPE is learned")
    if len(set(args.splits)) != len(args.splits):
        parser.error(f"--splits {' '.join(args.splits)} names a split twice")
    setup_logging()
    with reported_errors("posattn-prepare-translation"):
        prepare_translation_corpus(args.raw_dir, args.out_dir, args.source_lang, args.target_lang,
                                   splits=args.splits, bpe_merges=args.bpe_merges, max_lines=args.max_lines)


if __name__ == "__main__":
    main()
