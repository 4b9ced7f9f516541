"""``posattn-tag``: tag a CoNLL-U file with a trained ``san_tagger`` and write CoNLL-U back.

Example::

    posattn-tag data-bin/ewt --path checkpoints/checkpoint_best.pt \\
        --input en_ewt-ud-test.conllu --output en_ewt-ud-test.pred.conllu

Only the tag column the data directory was prepared with (UPOS or XPOS) changes, on the lines of
syntactic words; comments, multiword tokens, empty nodes and every other column are copied as they
are. When the input already holds tags in that column, the accuracy over its words is printed.
"""

import argparse
import logging
import sys
from typing import List, Optional

import torch
from fairseq import checkpoint_utils

import fairseq_posattn  # noqa: F401  (registers the task and the model)
from fairseq_posattn.cli import setup_logging
from fairseq_posattn.data.tagged_corpus import read_tagged_conllu, write_predicted_tags

logger = logging.getLogger("posattn-tag")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("data", help="data directory made by posattn-prepare-tagging (its dictionaries)")
    parser.add_argument("--path", required=True, help="checkpoint of a model trained with --task pos_tagging")
    parser.add_argument("--input", required=True, help="CoNLL-U file to tag (.gz is read through gzip)")
    parser.add_argument("--output", required=True, help="CoNLL-U file to write")
    parser.add_argument("--batch-size", type=int, default=64, help="sentence pieces per batch")
    parser.add_argument("--cpu", action="store_true", help="run on the CPU even when a GPU is present")
    return parser


def main(argv: Optional[List[str]] = None) -> None:
    setup_logging()
    args = build_parser().parse_args(argv)
    models, _, task = checkpoint_utils.load_model_ensemble_and_task([args.path], arg_overrides={"data": args.data})
    model = models[0]
    if torch.cuda.is_available() and not args.cpu:
        model.cuda()
    column = task.settings.tag_column
    try:
        sentences = list(read_tagged_conllu(args.input, column, require_tags=False))
    except ValueError as error:
        sys.exit(f"posattn-tag: {error}")
    predicted = task.tag_sentences(model, [s.words for s in sentences], args.batch_size)
    by_line = {line: tag for s, tags in zip(sentences, predicted) for line, tag in zip(s.word_lines, tags)}
    written = write_predicted_tags(args.input, args.output, by_line, column)
    logger.info("tagged %d words of %d sentences (%s) -> %s", written, len(sentences), column.upper(), args.output)
    gold = [(g, p) for s, tags in zip(sentences, predicted) for g, p in zip(s.tags, tags) if g != "_"]
    if gold:
        correct = sum(g == p for g, p in gold)
        print(f"{column.upper()} accuracy {100 * correct / len(gold):.2f} ({correct}/{len(gold)} words of {args.input})")


if __name__ == "__main__":
    main()
