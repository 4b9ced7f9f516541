"""Sentence-classification corpora in the ``label sentence`` format, split for fairseq.

SST-2 as distributed with Kim (2014)'s ``stsa.binary.{train,dev,test}`` holds one example per line:
the label, one space, the (tokenized, lower-cased) sentence. fairseq's ``--task sentence_prediction``
reads two binarized folders, ``input0/`` (the sentences) and ``label/`` (one label per line), so each
split becomes two parallel text files, ``{split}.input0`` and ``{split}.label``, for
``fairseq-preprocess --only-source``. :func:`split_corpus` does it; ``posattn-prepare-classification``
is its command line::

    posattn-prepare-classification --train stsa.binary.train --valid stsa.binary.dev --labels 0 1 \\
        --destdir sst2-text

Every split is read and checked before anything is written: an empty line, a line without a
sentence after its label, a label outside ``--labels``, or a label of a later split that the
training split never uses (fairseq-preprocess would silently turn it into ``<unk>``) is an error
naming ``file:line``. Without ``--labels`` every first field is a label, so a typo makes a class of its
own: a label on under 1% of the training examples is a warning with every label's count
(:func:`warn_rare_labels`).
"""

import logging
import os
from collections import Counter
from dataclasses import dataclass
from typing import Dict, Iterator, List, Optional, Sequence

from fairseq_posattn.atomic_io import read_lines, write_lines

logger = logging.getLogger(__name__)

SPLITS = ("train", "valid", "test")
#: a training label on fewer than this share of the examples is warned about (without ``--labels``)
RARE_LABEL_SHARE = 0.01


@dataclass
class LabelledSentence:
    label: str
    text: str
    line: int


def read_labelled_sentences(path: str, labels: Optional[Sequence[str]] = None) -> Iterator[LabelledSentence]:
    """Yield each line's label and sentence; malformed lines raise ``ValueError`` naming ``path:line``."""
    for number, line in enumerate(read_lines(path), start=1):
        fields = line.split(None, 1)
        if not fields:
            raise ValueError(f"{path}:{number}: empty line; expected 'label sentence'")
        if len(fields) == 1:
            raise ValueError(f"{path}:{number}: label {fields[0]!r} without a sentence; expected 'label sentence'")
        label, text = fields[0], fields[1].strip()
        if labels is not None and label not in labels:
            raise ValueError(f"{path}:{number}: label {label!r} is not one of {', '.join(labels)} "
                             f"(is the line in 'label sentence' order?)")
        yield LabelledSentence(label, text, number)


def check_labels_seen(path: str, examples: List[LabelledSentence], train_labels: set) -> None:
    """A label that training never shows would be binarized as ``<unk>``: refuse it."""
    for example in examples:
        if example.label not in train_labels:
            raise ValueError(f"{path}:{example.line}: label {example.label!r} never occurs in the training "
                             f"split (its labels: {', '.join(sorted(train_labels))})")


def warn_rare_labels(path: str, examples: List[LabelledSentence]) -> None:
    """Log every label's count in the training examples; warn about each label on fewer than
    ``RARE_LABEL_SHARE`` of them, naming its first ``path:line`` (a typo'd label is a class of its own)."""
    counts = Counter(example.label for example in examples)
    summary = ", ".join(f"{label!r} x{count}" for label, count in counts.most_common())
    logger.info("%s: %d labels: %s", path, len(counts), summary)
    for label, count in counts.items():
        if count < RARE_LABEL_SHARE * len(examples):
            line = next(example.line for example in examples if example.label == label)
            usual = ",".join(sorted(other for other in counts if other != label))
            logger.warning("%s:%d: label %r is on %d of the %d training examples (labels: %s); every label becomes "
                           "a class: if it is a typo, fix the line; pin the label set with --labels %s (then any "
                           "other label is an error)", path, line, label, count, len(examples), summary, usual)


def split_corpus(splits: Dict[str, str], destdir: str, labels: Optional[Sequence[str]] = None) -> Dict[str, int]:
    """Write ``destdir/{split}.input0`` and ``destdir/{split}.label`` for every ``split -> path``.

    ``splits`` must hold ``train``. Returns the number of examples per split. Nothing is written
    unless every split reads cleanly.
    """
    if "train" not in splits:
        raise ValueError("split_corpus needs a 'train' split: its labels define the label dictionary")
    read = {split: list(read_labelled_sentences(path, labels)) for split, path in splits.items()}
    for split, examples in read.items():
        if not examples:
            raise ValueError(f"{splits[split]}: no examples")
    if labels is None:
        warn_rare_labels(splits["train"], read["train"])
    train_labels = {example.label for example in read["train"]}
    for split, examples in read.items():
        check_labels_seen(splits[split], examples, train_labels)
    for split, examples in read.items():
        write_lines(os.path.join(destdir, f"{split}.input0"), (e.text for e in examples))
        write_lines(os.path.join(destdir, f"{split}.label"), (e.label for e in examples))
        logger.info("%s: %d examples from %s", split, len(examples), splits[split])
    return {split: len(examples) for split, examples in read.items()}

