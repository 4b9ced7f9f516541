"""``posattn-prepare-tagging``: CoNLL-U files -> vocabularies and binarized part-of-speech splits.

The word vocabulary keeps the most frequent ``vocab_fraction`` of the unique training word forms
(Dufter et al. 2020, Table 1b, UD: 50%); characters and tags come from the training file. Every
file is written to a temporary directory first and moved into ``destdir`` only once all splits are
complete (:func:`fairseq_posattn.atomic_io.atomic_directory_update`), so an interrupted run never
leaves a half-written data directory behind.
"""

import logging
from dataclasses import dataclass
from typing import Dict, Iterable, Iterator, List, Sequence, Tuple

import torch
from fairseq.data import Dictionary, indexed_dataset
from tqdm import tqdm

from fairseq_posattn.atomic_io import atomic_directory_update
from fairseq_posattn.data.tagged_corpus import (
    AMBIGUOUS_FLAG,
    OOV_FLAG,
    TaggedSentence,
    TrainingLexicon,
    piece_slices,
    read_tagged_conllu,
)
from fairseq_posattn.data.tagging_dataset import (
    SPLIT_FIELDS,
    TaggingSettings,
    TaggingVocabulary,
    split_path,
)

logger = logging.getLogger(__name__)


@dataclass
class SplitSummary:
    split: str
    path: str
    sentences: int
    pieces: int
    words: int
    oov: int
    ambiguous: int
    unknown_tags: int


def build_vocabulary(lexicon: TrainingLexicon, vocab_fraction: float) -> TaggingVocabulary:
    """fairseq dictionaries of the kept word forms, every training character and every training tag."""
    words, chars, tags = Dictionary(), Dictionary(), Dictionary()
    for word in lexicon.vocabulary(vocab_fraction):
        words.add_symbol(word, lexicon.counts[word])
    for word, count in lexicon.counts.items():
        for char in word:
            chars.add_symbol(char, count)
    for tag, count in lexicon.tag_counts.most_common():
        tags.add_symbol(tag, count)
    words.finalize(padding_factor=8)
    chars.finalize(padding_factor=8)
    return TaggingVocabulary(words, chars, tags)


def prepare_tagging_data(splits: Dict[str, Sequence[str]], destdir: str, tag_column: str = "upos",
                         max_length: int = 60, max_chars: int = 20, vocab_fraction: float = 0.5,
                         long_sentences: str = "split") -> List[SplitSummary]:
    """Write the vocabularies of ``splits["train"]`` and every split of ``splits`` (name -> CoNLL-U
    files, concatenated in order) binarized into ``destdir``; return one summary per split."""
    _check_settings(splits, max_length, max_chars, vocab_fraction, long_sentences)
    train = list(_read_files(splits["train"], tag_column, "train"))
    lexicon = TrainingLexicon.from_sentences(sentence for _, sentence in train)
    vocabulary = build_vocabulary(lexicon, vocab_fraction)
    settings = TaggingSettings(tag_column, max_length, max_chars, vocab_fraction)
    with atomic_directory_update(destdir) as staging:
        vocabulary.save(staging)
        settings.save(staging)
        summaries = [
            _binarize_split(name, ", ".join(paths),
                            train if name == "train" else _read_files(paths, tag_column, name),
                            staging, vocabulary, lexicon, settings, long_sentences)
            for name, paths in splits.items()
        ]
    logger.info("vocabulary: %d words (%.0f%% of %d unique training forms), %d characters, %d tags",
                len(vocabulary.words) - vocabulary.words.nspecial, 100 * vocab_fraction,
                len(lexicon.counts), len(vocabulary.chars) - vocabulary.chars.nspecial,
                len(vocabulary.tags) - vocabulary.tags.nspecial)
    return summaries


def _check_settings(splits: Dict[str, Sequence[str]], max_length: int, max_chars: int,
                    vocab_fraction: float, long_sentences: str) -> None:
    if "train" not in splits or not splits["train"]:
        raise ValueError("a training file is required: the vocabularies and the OOV/ambiguous word "
                         "sets come from it (--train TRAIN.conllu)")
    if max_length < 1 or max_chars < 1:
        raise ValueError(f"--max-length and --max-chars must be positive, got {max_length} and {max_chars}")
    if not 0 < vocab_fraction <= 1:
        raise ValueError(f"--vocab-fraction is a share of the unique training words in (0, 1], got {vocab_fraction}")
    if long_sentences not in ("split", "error"):
        raise ValueError(f"--long-sentences must be split or error, got {long_sentences!r}")


def _read_files(paths: Sequence[str], tag_column: str, split: str) -> Iterator[Tuple[str, TaggedSentence]]:
    """The sentences of ``paths`` in order; a file without any is an error (fairseq-train would fail
    later on the empty split, or learn no tag)."""
    for path in paths:
        empty = True
        for sentence in read_tagged_conllu(path, tag_column):
            empty = False
            yield path, sentence
        if empty:
            raise ValueError(f"{path}: no sentence (the file is empty or holds only comments), so the {split} "
                             f"split would have no words to {'learn from' if split == 'train' else 'score'}; "
                             f"give --{split} a CoNLL-U file with tagged sentences")


def _binarize_split(name: str, source: str, sentences: Iterable[Tuple[str, TaggedSentence]], staging: str,
                    vocabulary: TaggingVocabulary, lexicon: TrainingLexicon, settings: TaggingSettings,
                    long_sentences: str) -> SplitSummary:
    builders = {
        field: indexed_dataset.make_builder(split_path(staging, name, field) + ".bin", "mmap",
                                            vocab_size=len(vocabulary.chars if field == "chars" else vocabulary.words))
        for field in SPLIT_FIELDS
    }
    summary = SplitSummary(name, source, 0, 0, 0, 0, 0, 0)
    unknown_tag = vocabulary.tags.unk()
    for path, sentence in tqdm(sentences, desc=f"binarize {name}", unit=" sentences", leave=False):
        _check_length(path, sentence, settings.max_length, long_sentences)
        summary.sentences += 1
        flags = lexicon.flags(sentence.words)
        for piece in piece_slices(len(sentence.words), settings.max_length):
            word_ids, chars = vocabulary.encode_words(sentence.words[piece], settings.max_chars)
            tag_ids = vocabulary.encode_tags(sentence.tags[piece])
            builders["words"].add_item(word_ids)
            builders["chars"].add_item(chars)
            builders["tags"].add_item(tag_ids)
            builders["flags"].add_item(torch.tensor(flags[piece], dtype=torch.long))
            summary.pieces += 1
            summary.unknown_tags += int(tag_ids.eq(unknown_tag).sum())
        summary.words += len(sentence.words)
        summary.oov += sum(f & OOV_FLAG > 0 for f in flags)
        summary.ambiguous += sum(f & AMBIGUOUS_FLAG > 0 for f in flags)
    for field, builder in builders.items():
        builder.finalize(split_path(staging, name, field) + ".idx")
    _log_summary(summary, settings.max_length)
    return summary


def _check_length(path: str, sentence: TaggedSentence, max_length: int, long_sentences: str) -> None:
    if long_sentences == "error" and len(sentence.words) > max_length:
        raise ValueError(
            f"{path}:{sentence.line}: sentence of {len(sentence.words)} words is longer than --max-length "
            f"{max_length}; raise --max-length (and the model's --max-source-positions) or use "
            f"--long-sentences split")


def _log_summary(summary: SplitSummary, max_length: int) -> None:
    logger.info(
        "%s (%s): %d sentences -> %d pieces of <= %d words, %d words (%d OOV, %d ambiguous)%s",
        summary.split, summary.path, summary.sentences, summary.pieces, max_length, summary.words,
        summary.oov, summary.ambiguous,
        f"; {summary.unknown_tags} tags not seen in training (always counted wrong)" if summary.unknown_tags else "")
