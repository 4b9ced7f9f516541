"""Binarized part-of-speech data: the vocabularies, sentence encoding, and the fairseq dataset.

A prepared data directory (``posattn-prepare-tagging``) holds ``dict.words.txt``, ``dict.tags.txt``,
``dict.chars.txt``, ``tagging.json`` (the settings it was made with) and, per split, four mmap
indexed datasets: ``{split}.words`` (word ids), ``{split}.chars`` (each word's first ``max_chars``
character ids, right-padded, flattened), ``{split}.tags`` (tag ids) and ``{split}.flags`` (per word
OOV / ambiguous bits, see :mod:`fairseq_posattn.data.tagged_corpus`).
"""

import json
import os
from dataclasses import asdict, dataclass
from typing import Dict, List, Sequence, Tuple

import numpy as np
import torch
from fairseq.data import Dictionary, FairseqDataset, data_utils

META_FILE = "tagging.json"
SPLIT_FIELDS = ("words", "chars", "tags", "flags")
DICTIONARIES = ("words", "chars", "tags")


def dictionary_file(name: str) -> str:
    """``dict.{name}.txt``: the file of the ``words``, ``chars`` or ``tags`` dictionary."""
    return f"dict.{name}.txt"


@dataclass
class TaggingSettings:
    """How a data directory was prepared (``tagging.json``)."""

    tag_column: str
    max_length: int
    max_chars: int
    vocab_fraction: float

    def save(self, directory: str) -> None:
        with open(os.path.join(directory, META_FILE), "w", encoding="utf-8") as f:
            json.dump(asdict(self), f, indent=1)

    @classmethod
    def load(cls, directory: str) -> "TaggingSettings":
        path = os.path.join(directory, META_FILE)
        if not os.path.exists(path):
            raise FileNotFoundError(
                f"{path} not found: {directory} is not a part-of-speech data directory; make one with "
                f"posattn-prepare-tagging --train TRAIN.conllu --valid DEV.conllu --destdir {directory}")
        with open(path, encoding="utf-8") as f:
            return cls(**json.load(f))


@dataclass
class TaggingVocabulary:
    """Word, character and tag dictionaries (fairseq :class:`~fairseq.data.Dictionary` each)."""

    words: Dictionary
    chars: Dictionary
    tags: Dictionary

    @classmethod
    def load(cls, directory: str) -> "TaggingVocabulary":
        return cls(*(Dictionary.load(os.path.join(directory, dictionary_file(name))) for name in DICTIONARIES))

    def save(self, directory: str) -> None:
        for name, dictionary in self.files().items():
            dictionary.save(os.path.join(directory, name))

    def files(self) -> Dict[str, Dictionary]:
        """The dictionaries by their file name in a data directory."""
        return {dictionary_file(name): getattr(self, name) for name in DICTIONARIES}

    def encode_words(self, words: Sequence[str], max_chars: int) -> Tuple[torch.Tensor, torch.Tensor]:
        """Word ids ``(n,)`` and character ids ``(n * max_chars,)`` (each word's first ``max_chars``
        characters, right-padded with the character pad)."""
        word_ids = torch.tensor([self.words.index(w) for w in words], dtype=torch.long)
        chars = torch.full((len(words), max_chars), self.chars.pad(), dtype=torch.long)
        for row, word in enumerate(words):
            ids = [self.chars.index(c) for c in word[:max_chars]]
            chars[row, :len(ids)] = torch.tensor(ids, dtype=torch.long)
        return word_ids, chars.view(-1)

    def encode_tags(self, tags: Sequence[str]) -> torch.Tensor:
        return torch.tensor([self.tags.index(t) for t in tags], dtype=torch.long)


def split_path(directory: str, split: str, name: str) -> str:
    return os.path.join(directory, f"{split}.{name}")


class TaggingDataset(FairseqDataset):
    """Sentences (or pieces of at most t words) with their characters, tags and OOV/ambiguous flags.

    Batches are right-padded: ``net_input`` holds ``src_tokens`` ``(B, T)``, ``src_lengths`` and
    ``src_chars`` ``(B, T, max_chars)``; ``target`` ``(B, T)`` uses the tag dictionary's pad;
    ``flags`` ``(B, T)`` is 0 at pads.
    """

    def __init__(self, words, chars, tags, flags, vocabulary: TaggingVocabulary, max_chars: int,
                 shuffle: bool = True):
        self.words, self.chars, self.tags, self.flags = words, chars, tags, flags
        self.vocabulary = vocabulary
        self.max_chars = max_chars
        self.shuffle = shuffle
        self.sizes = np.asarray(words.sizes, dtype=np.int64)

    @classmethod
    def load(cls, directory: str, split: str, vocabulary: TaggingVocabulary, max_chars: int,
             shuffle: bool) -> "TaggingDataset":
        dictionaries = {"words": vocabulary.words, "chars": vocabulary.chars, "tags": vocabulary.tags,
                        "flags": None}
        parts = {}
        for name in SPLIT_FIELDS:
            path = split_path(directory, split, name)
            parts[name] = data_utils.load_indexed_dataset(path, dictionaries[name])
            if parts[name] is None:
                raise FileNotFoundError(
                    f"{path}.bin/.idx not found: prepare the {split!r} split with posattn-prepare-tagging")
        return cls(**parts, vocabulary=vocabulary, max_chars=max_chars, shuffle=shuffle)

    def __getitem__(self, index: int) -> Dict[str, torch.Tensor]:
        return {
            "id": index,
            "words": self.words[index].long(),
            "chars": self.chars[index].long().view(-1, self.max_chars),
            "tags": self.tags[index].long(),
            "flags": self.flags[index].long(),
        }

    def __len__(self) -> int:
        return len(self.sizes)

    def num_tokens(self, index: int) -> int:
        return int(self.sizes[index])

    def batch_by_size(self, indices: np.ndarray, max_tokens=None, max_sentences=None,
                      required_batch_size_multiple: int = 1):
        """fairseq's batching; evaluation splits use batch-size multiple 1, because fairseq drops a
        last batch that is not a multiple (and its words would be missing from the accuracy)."""
        if not self.shuffle:
            required_batch_size_multiple = 1
        return super().batch_by_size(indices, max_tokens, max_sentences, required_batch_size_multiple)

    def num_tokens_vec(self, indices: np.ndarray) -> np.ndarray:
        return self.sizes[indices]

    def size(self, index: int) -> int:
        return int(self.sizes[index])

    def ordered_indices(self) -> np.ndarray:
        """Shuffled, then stably sorted by length (fairseq's usual length-bucketed batching; fairseq
        seeds numpy with ``--seed`` + epoch around this call, so batches differ between epochs)."""
        order = np.random.permutation(len(self)) if self.shuffle else np.arange(len(self))
        return order[np.argsort(self.sizes[order], kind="mergesort")]

    def collater(self, samples: List[Dict[str, torch.Tensor]]) -> Dict:
        return collate_tagging(samples, self.vocabulary, self.max_chars)


def collate_tagging(samples: List[Dict[str, torch.Tensor]], vocabulary: TaggingVocabulary,
                    max_chars: int) -> Dict:
    """Right-padded batch of ``samples`` (``words``, ``chars`` ``(n, max_chars)``, and ``tags`` and
    ``flags`` where known: text to be tagged has none)."""
    if not samples:
        return {}
    words = data_utils.collate_tokens([s["words"] for s in samples], vocabulary.words.pad())
    batch, length = words.shape
    chars = torch.full((batch, length, max_chars), vocabulary.chars.pad(), dtype=torch.long)
    for row, sample in enumerate(samples):
        chars[row, :sample["chars"].size(0)] = sample["chars"]
    lengths = torch.tensor([s["words"].numel() for s in samples], dtype=torch.long)
    collated = {
        "id": torch.tensor([s["id"] for s in samples], dtype=torch.long),
        "nsentences": batch,
        "ntokens": int(lengths.sum()),
        "net_input": {"src_tokens": words, "src_lengths": lengths, "src_chars": chars},
    }
    if "tags" in samples[0]:
        collated["target"] = data_utils.collate_tokens([s["tags"] for s in samples], vocabulary.tags.pad())
        collated["flags"] = data_utils.collate_tokens([s["flags"] for s in samples], 0)
    return collated
