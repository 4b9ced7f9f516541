"""Part-of-speech tagged sentences from CoNLL-U, the training lexicon, and predictions written back.

Dufter et al. (2020, section 3) tag the *syntactic words* of a treebank and report accuracy over
all words, out-of-vocabulary words and ambiguous words. As CoNLL-U defines, multiword-token lines
(``3-4``) only group surface tokens and empty nodes (``5.1``) belong to the enhanced graph: both are
skipped, and the words inside a range are tagged. Our definitions (written down in the README):

* **OOV**: a word form that never occurs in the training file (case-sensitive). The model's word
  vocabulary may be smaller (the paper keeps 50% of the unique training words); rare training words
  then reach the model as ``<unk>`` but still count as in-vocabulary here, as in the paper's text.
* **ambiguous**: a word form seen with more than one tag in the training file.

Sentences longer than the model's maximum length t (60 in the paper) are split into consecutive
pieces of at most t words, in training and in prediction alike, so that every word is tagged.
"""

import math
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Dict, Iterable, Iterator, List, Optional, Sequence, Set

from fairseq_posattn.atomic_io import atomic_write
from fairseq_posattn.structure.conllu_io import is_word_line, iter_blocks, open_text, split_columns

TAG_COLUMNS = {"upos": 3, "xpos": 4}
OOV_FLAG = 1
AMBIGUOUS_FLAG = 2


@dataclass
class TaggedSentence:
    """The syntactic words of one sentence, their tags (``_`` when untagged) and their line numbers."""

    words: List[str]
    tags: List[str]
    word_lines: List[int]

    @property
    def line(self) -> int:
        return self.word_lines[0]


def read_tagged_conllu(path: str, column: str = "upos", require_tags: bool = True) -> Iterator[TaggedSentence]:
    """Yield every sentence's words and ``column`` (``upos`` or ``xpos``) tags, in file order.

    With ``require_tags`` a missing tag (``_``) is an error naming ``path:line``; without it (text to
    be tagged) tags may be ``_``.
    """
    index = TAG_COLUMNS[column]
    for block in iter_blocks(path):
        sentence = TaggedSentence([], [], [])
        for number, line in block:
            if line.startswith("#"):
                continue
            cols = split_columns(path, number, line)
            if not is_word_line(path, number, cols[0], len(sentence.words) + 1):
                continue
            tag = cols[index]
            if require_tags and (tag == "_" or not tag):
                raise ValueError(
                    f"{path}:{number}: word {cols[0]} {cols[1]!r} has no {column.upper()} tag (column "
                    f"{index + 1} is {tag!r}); tag it, or choose the other column with --tag-column")
            sentence.words.append(cols[1])
            sentence.tags.append(tag)
            sentence.word_lines.append(number)
        if sentence.words:
            yield sentence
        elif any(not line.startswith("#") for _, line in block):
            raise ValueError(f"{path}:{block[0][0]}: sentence without syntactic words (only multiword-token "
                             f"or empty-node lines)")


def piece_slices(length: int, max_length: int) -> List[slice]:
    """Consecutive pieces of at most ``max_length`` words covering a sentence of ``length`` words."""
    return [slice(start, start + max_length) for start in range(0, length, max_length)]


@dataclass
class TrainingLexicon:
    """What the training file says about word forms: their counts and the tags seen with each."""

    counts: Counter = field(default_factory=Counter)
    tags_of: Dict[str, Set[str]] = field(default_factory=lambda: defaultdict(set))
    tag_counts: Counter = field(default_factory=Counter)

    @classmethod
    def from_sentences(cls, sentences: Iterable[TaggedSentence]) -> "TrainingLexicon":
        lexicon = cls()
        for sentence in sentences:
            lexicon.counts.update(sentence.words)
            lexicon.tag_counts.update(sentence.tags)
            for word, tag in zip(sentence.words, sentence.tags):
                lexicon.tags_of[word].add(tag)
        return lexicon

    def flags(self, words: Sequence[str]) -> List[int]:
        """Per word: ``OOV_FLAG`` if never seen in training, ``AMBIGUOUS_FLAG`` if seen with more
        than one tag, else 0."""
        return [
            OOV_FLAG if word not in self.counts
            else AMBIGUOUS_FLAG if len(self.tags_of[word]) > 1 else 0
            for word in words
        ]

    def vocabulary(self, fraction: float) -> List[str]:
        """The most frequent ``ceil(fraction * unique words)`` word forms (ties: first seen first)."""
        keep = math.ceil(fraction * len(self.counts))
        return [word for word, _ in self.counts.most_common(keep)]


def write_predicted_tags(input_path: str, output_path: str, predictions: Dict[int, str],
                         column: str = "upos") -> int:
    """Copy ``input_path`` to ``output_path`` (atomically) with the tag of every word line listed in
    ``predictions`` (line number -> tag) replaced; every other byte of the file is kept.

    Returns the number of tags written.
    """
    index = TAG_COLUMNS[column]
    written = 0
    with open_text(input_path) as lines, atomic_write(output_path) as out:
        for number, line in enumerate(lines, start=1):
            tag: Optional[str] = predictions.get(number)
            if tag is not None:
                ending = line[len(line.rstrip("\r\n")):]
                cols = line.rstrip("\r\n").split("\t")
                cols[index] = tag
                line = "\t".join(cols) + ending
                written += 1
            out.write(line)
    return written
