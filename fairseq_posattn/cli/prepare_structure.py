"""``posattn-prepare-structure``: write a split's structural side data next to fairseq-preprocess's.

Example (after ``fairseq-preprocess --source-lang en --target-lang de ... --destdir data-bin``)::

    posattn-prepare-structure --conllu prepared/train.conllu --bpe prepared/train.bpe.en \\
        --destdir data-bin --split train --source-lang en --target-lang de

``--conllu`` is the parse of the *tokenized* source (``posattn-parse``), ``--bpe`` the BPE text that
fairseq-preprocess binarized. The output is ``{destdir}/{split}.{src}-{tgt}.{src}.structure.{bin,idx}``, where
``--task translation_structural`` reads it. The binarized source is ``{split}.{src}-{tgt}.{src}``, or, as
fairseq's translation task finds it, ``{split}.{tgt}-{src}.{src}`` of a data directory binarized for the other
direction (de-en from an en-de data-bin).
Before anything is aligned, the three inputs must hold the same number of sentences; then every
sentence's pieces must rebuild its parsed words and match its binarized length. Errors name the files
(and ``file:line``) and nothing is written.
"""

import argparse
import os
from typing import Any, List, Optional, Tuple

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
    binarized, source = binarized_source(args.destdir, args.split, args.source_lang, args.target_lang)
    check_sentence_counts(args.bpe, args.conllu, binarized, len(source.sizes))
    parses = ((s.words, s.heads, s.line) for s in read_conllu(args.conllu))
    prefix = structure_prefix(args.destdir, args.split, args.source_lang, args.target_lang)
    write_side_data(parses, args.bpe, prefix, conllu_path=args.conllu, expected_sizes=source.sizes)


def binarized_source(destdir: str, split: str, src: str, tgt: str) -> Tuple[str, Any]:
    """The prefix and dataset of the split's binarized source, where fairseq's translation task finds it:
    ``split.src-tgt.src``, else ``split.tgt-src.src`` (a data directory binarized for the other direction).
    ValueError if neither is there, with the fairseq-preprocess command that makes it."""
    for pair in (f"{src}-{tgt}", f"{tgt}-{src}"):
        prefix = os.path.join(destdir, f"{split}.{pair}.{src}")
        source = data_utils.load_indexed_dataset(prefix, None)
        if source is not None:
            return prefix, source
    missing = f"no binarized source {destdir}/{split}.{src}-{tgt}.{src}.{{bin,idx}} (nor {split}.{tgt}-{src}.{src})"
    dictionaries = [os.path.join(destdir, f"dict.{lang}.txt") for lang in (src, tgt)]
    if all(os.path.isfile(path) for path in dictionaries):
        raise ValueError(f"{missing}: binarize the split into {destdir} with its dictionaries (fairseq-preprocess "
                         f"refuses to build new ones there): fairseq-preprocess --source-lang {src} --target-lang "
                         f"{tgt} --srcdict {dictionaries[0]} --tgtdict {dictionaries[1]} {_prefix_option(split)} "
                         f"--destdir {destdir}, PREFIX.{src} and PREFIX.{tgt} being the split's BPE text")
    raise ValueError(f"{missing}: run fairseq-preprocess first, with --destdir {destdir} --source-lang {src} "
                     f"--target-lang {tgt}")


def _prefix_option(split: str) -> str:
    """fairseq-preprocess's option that binarizes ``split`` from the BPE text ``PREFIX.{src,tgt}``."""
    if split in ("train", "valid", "test"):
        return f"--{split}pref PREFIX"
    return (f"--validpref or --testpref PREFIX0,PREFIX1,... (the (k+1)-th of the prefixes makes split valid{{k}} or "
            f"test{{k}}, for {split})")


if __name__ == "__main__":
    main()
