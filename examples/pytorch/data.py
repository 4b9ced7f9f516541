"""PTB as one token stream, read the way the fairseq recipe (examples/length_extrapolation) reads it.

fairseq-preprocess (``--only-source``) builds the dictionary from the training split: the four special symbols
``<s>``, ``<pad>``, ``</s>``, ``<unk>`` first, then every word by falling count (ties in alphabetical order),
padded with ``madeupwordNNNN`` entries to a multiple of 8. PTB already writes its rare words ``<unk>``: they
take the special symbol's index. Each line's end is ``</s>``. ``--sample-break-mode none`` reads a split as
one stream of these indices; a block's input is its targets shifted right by one token, the first block's
starting from ``</s>`` (fairseq's ``TokenBlockDataset`` with ``include_targets``).
"""

import gzip
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Iterator, List, Tuple

import torch
from torch import Tensor

SPECIAL_SYMBOLS = ("<s>", "<pad>", "</s>", "<unk>")
PAD, EOS, UNK = 1, 2, 3
SPLIT_NAMES = ("{split}.txt", "{split}.txt.gz", "ptb.{split}.txt", "ptb.{split}.txt.gz")


def split_path(data_dir: Path, split: str) -> Path:
    """The file of ``split`` in ``data_dir``: ``{split}.txt(.gz)`` or ``ptb.{split}.txt(.gz)``."""
    for pattern in SPLIT_NAMES:
        path = data_dir / pattern.format(split=split)
        if path.is_file():
            return path
    names = ", ".join(pattern.format(split=split) for pattern in SPLIT_NAMES)
    raise FileNotFoundError(f"no {split} split in {data_dir} (looked for {names})")


def read_lines(path: Path) -> List[List[str]]:
    """The whitespace-separated words of every line (blank lines keep their end-of-line token)."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        return [line.split() for line in f]


@dataclass
class Dictionary:
    """fairseq's ``Dictionary`` as fairseq-preprocess finalises it (see the module's docstring)."""

    symbols: List[str]

    @classmethod
    def from_lines(cls, lines: List[List[str]], multiple: int = 8) -> "Dictionary":
        counts = Counter(word for line in lines for word in line if word not in SPECIAL_SYMBOLS)
        words = [word for word, _ in sorted(counts.items(), key=lambda item: (-item[1], item[0]))]
        symbols = list(SPECIAL_SYMBOLS) + words
        padding = -len(symbols) % multiple
        return cls(symbols + [f"madeupword{i:04d}" for i in range(padding)])

    def __len__(self) -> int:
        return len(self.symbols)

    def index(self) -> Dict[str, int]:
        return {symbol: i for i, symbol in enumerate(self.symbols)}

    def encode(self, lines: List[List[str]]) -> Tensor:
        """One stream: each line's word indices (``<unk>`` for unknown words) followed by ``</s>``."""
        index = self.index()
        ids = [i for line in lines for i in [index.get(word, UNK) for word in line] + [EOS]]
        return torch.tensor(ids, dtype=torch.long)


@dataclass
class Corpus:
    dictionary: Dictionary
    train: Tensor
    valid: Tensor


def load_corpus(data_dir: Path, eval_split: str = "valid") -> Corpus:
    """The dictionary of the training split, and the training and evaluation splits as token streams."""
    train_lines = read_lines(split_path(data_dir, "train"))
    dictionary = Dictionary.from_lines(train_lines)
    eval_lines = read_lines(split_path(data_dir, eval_split))
    return Corpus(dictionary, dictionary.encode(train_lines), dictionary.encode(eval_lines))


def shifted_inputs(targets: Tensor) -> Tensor:
    """The model's input stream: every target preceded by the token before it, the first by ``</s>``."""
    return torch.cat([targets.new_tensor([EOS]), targets[:-1]])


def training_blocks(stream: Tensor, block_length: int) -> Tuple[Tensor, Tensor]:
    """``(inputs, targets)``, each ``(blocks, block_length)``: the stream cut into whole blocks (the last,
    shorter block is left out: fairseq pads it into its batch)."""
    blocks = stream.numel() // block_length
    targets = stream[: blocks * block_length].view(blocks, block_length)
    inputs = shifted_inputs(stream)[: blocks * block_length].view(blocks, block_length)
    return inputs, targets


def epoch_batches(blocks: int, batch_size: int, seed: int, epoch: int) -> Iterator[Tensor]:
    """The block indices of every batch of one epoch: a permutation seeded by ``(seed, epoch)``, cut into
    batches of ``batch_size`` (the last one smaller), as fairseq shuffles a language-modeling epoch."""
    generator = torch.Generator().manual_seed(seed * 100_003 + epoch)
    order = torch.randperm(blocks, generator=generator)
    yield from order.split(batch_size)
