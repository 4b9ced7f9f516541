"""``posattn-tag``: tag a CoNLL-U file with a trained ``san_tagger`` and write CoNLL-U back.

Example::

    posattn-tag data-bin/ewt --path checkpoints/checkpoint_best.pt \\
        --input en_ewt-ud-test.conllu --output en_ewt-ud-test.pred.conllu

Only the tag column the data directory was prepared with (UPOS or XPOS) changes, on the lines of
syntactic words; comments, multiword tokens, empty nodes and every other column are copied as they
are. When the input already holds tags in that column, the accuracy over its words is printed.

Gold tags the model does not know (not in the data directory's ``dict.tags.txt``) always count as
wrong: some of them is a warning naming the first line, how many and the likely cause (e.g. XPOS tags in
the UPOS column); all of them is an error, before the model is loaded and nothing is written. Pass
``--no-gold`` when the column does not hold gold tags of the model's kind: the file is tagged without
an accuracy.

A data directory whose dictionaries are not those the checkpoint was trained with is refused when the
model loads (:mod:`fairseq_posattn.data.fingerprint`), and so is an ``--output`` that is the input.
"""

import argparse
import logging
from collections import Counter
from typing import List, Optional, Sequence

import torch
from fairseq import checkpoint_utils
from fairseq.data import Dictionary

import fairseq_posattn  # noqa: F401  (registers the task and the model)
from fairseq_posattn.atomic_io import refuse_output_that_is_an_input
from fairseq_posattn.cli import positive_int, reported_errors, setup_logging
from fairseq_posattn.data.fingerprint import DataMismatchError
from fairseq_posattn.data.tagged_corpus import TAG_COLUMNS, TaggedSentence, read_tagged_conllu, write_predicted_tags
from fairseq_posattn.data.tagging_dataset import TaggingSettings, TaggingVocabulary

PROG = "posattn-tag"
logger = logging.getLogger(PROG)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("data", help="data directory made by posattn-prepare-tagging (its dictionaries)")
    parser.add_argument("--path", required=True, help="checkpoint of a model trained with --task pos_tagging")
    parser.add_argument("--input", required=True, help="CoNLL-U file to tag (.gz is read through gzip)")
    parser.add_argument("--output", required=True, help="CoNLL-U file to write")
    parser.add_argument("--batch-size", type=positive_int, default=64, help="sentence pieces per batch")
    parser.add_argument("--cpu", action="store_true", help="run on the CPU even when a GPU is present")
    parser.add_argument("--no-gold", action="store_true",
                        help="the input's tag column is not gold tags of the model's kind: overwrite it, print "
                             "no accuracy")
    return parser


def main(argv: Optional[List[str]] = None) -> None:
    setup_logging()
    args = build_parser().parse_args(argv)
    with reported_errors(PROG):
        tag_file(args)


def tag_file(args: argparse.Namespace) -> None:
    """Read and check the input, then load the model, tag and write; print the accuracy over the gold tags."""
    refuse_output_that_is_an_input(args.output, args.input, args.path)
    column = TaggingSettings.load(args.data).tag_column
    sentences = list(read_tagged_conllu(args.input, column, require_tags=False))
    if not args.no_gold:
        check_gold_tags(args.input, sentences, TaggingVocabulary.load(args.data).tags, column)
    try:
        models, _, task = checkpoint_utils.load_model_ensemble_and_task([args.path],
                                                                        arg_overrides={"data": args.data})
    except DataMismatchError as error:
        raise error.naming(args.path) from None
    model = models[0]
    if torch.cuda.is_available() and not args.cpu:
        model.cuda()
    predicted = task.tag_sentences(model, [s.words for s in sentences], args.batch_size)
    by_line = {line: tag for s, tags in zip(sentences, predicted) for line, tag in zip(s.word_lines, tags)}
    written = write_predicted_tags(args.input, args.output, by_line, column)
    logger.info("tagged %d words of %d sentences (%s) -> %s", written, len(sentences), column.upper(), args.output)
    gold = [(g, p) for s, tags in zip(sentences, predicted) for g, p in zip(s.tags, tags) if g != "_"]
    if gold and not args.no_gold:
        correct = sum(g == p for g, p in gold)
        print(f"{column.upper()} accuracy {100 * correct / len(gold):.2f} "
              f"({correct}/{len(gold)} words of {args.input})")


def check_gold_tags(path: str, sentences: Sequence[TaggedSentence], tags: Dictionary, column: str) -> None:
    """Warn when some gold tags (not ``_``) of ``path`` are not among the model's tags (they always count as
    wrong); raise ValueError when none is. Both name the first such ``path:line`` and the likely cause."""
    known = set(tags.symbols[tags.nspecial:])
    gold = [(line, tag) for s in sentences for line, tag in zip(s.word_lines, s.tags) if tag != "_"]
    unknown = [(line, tag) for line, tag in gold if tag not in known]
    if not unknown:
        return
    name, number = column.upper(), TAG_COLUMNS[column] + 1
    other = next(c for c in TAG_COLUMNS if c != column).upper()
    frequent = ", ".join(f"{tag!r} x{n}" for tag, n in Counter(tag for _, tag in unknown).most_common(5))
    first = f"{path}:{unknown[0][0]}: gold {name} tag {unknown[0][1]!r} is not one of the model's {len(known)} tags"
    if len(unknown) == len(gold):
        raise ValueError(
            f"{first}, and neither is any of the {len(gold)} gold tags of the file (most frequent: {frequent}): "
            f"the accuracy would be 0. The model tags {name} (column {number}); does the file hold other tags "
            f"there, e.g. {other} tags in the {name} column? Tag a file with {name} tags in column {number}, use "
            f"a model prepared with posattn-prepare-tagging --tag-column {other.lower()}, or pass --no-gold to "
            "tag without an accuracy")
    logger.warning("%s; %d of %d gold tags (%.1f%%) are unknown to the model and count as wrong (most frequent: "
                   "%s). Likely causes: other tags in column %d (e.g. %s tags in the %s column: see "
                   "posattn-prepare-tagging --tag-column), or tags that the training data never had",
                   first, len(unknown), len(gold), 100 * len(unknown) / len(gold), frequent, number, other, name)


if __name__ == "__main__":
    main()
