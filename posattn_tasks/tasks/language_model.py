"""Language modelling past the training length: the loss of every token against its position (Press et al. 2022,
"Train Short, Test Long", section 4; Lin et al. 2025, the Forgetting Transformer, figure 3), on the Penn
Treebank.

The corpus is read as one stream of words (each line's end a token of its own); the vocabulary is the
training split's ``VOCABULARY`` most frequent words and ``<unk>`` (a smaller output layer than PTB's 10,000
words, so that the CPU tier trains in minutes). Training reads random windows of ``size`` tokens. The test
reads the validation split in windows of 1 to 32 times ``size`` two ways: non-overlapping windows (every token
scored with the context its window gives it; the loss at each position of the longest windows is the curve
the report draws) and sliding windows of stride half the window (each token after the first half-window scored
with at least half a window of context).
"""

import gzip
import math
import random
from collections import Counter
from pathlib import Path
from typing import Dict, List, Optional, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from posattn.errors import UserError
from posattn_tasks.tasks.base import Example, Sizes, Split, Task

VOCABULARY = 2000
UNKNOWN, END_OF_LINE = 0, 1
MULTIPLES = (1, 2, 4, 8, 16, 32)
#: the longest windows the test reads (more where the validation split has them)
LONGEST_WINDOWS = 8
#: bins of the per-position curve a record keeps (log-spaced positions)
CURVE_BINS = 48


class CorpusMissing(UserError, FileNotFoundError):
    """The corpus folder lacks a split."""


def read_split(folder: Path, split: str) -> List[List[str]]:
    for name in (f"{split}.txt", f"ptb.{split}.txt", f"{split}.txt.gz", f"ptb.{split}.txt.gz"):
        path = folder / name
        if path.is_file():
            opener = gzip.open if path.suffix == ".gz" else open
            with opener(path, "rt", encoding="utf-8") as f:
                return [line.split() for line in f]
    raise CorpusMissing(f"no {split} split in {folder} (looked for {split}.txt, ptb.{split}.txt and .gz); "
                        f"--corpus takes a folder of PTB's language-modelling files")


class LanguageModelling(Task):
    name = "language-model"
    citation = "Press et al. 2022, arXiv 2108.12409, section 4 (per-token loss: Lin et al. 2025, figure 3)"
    unit = "tokens"
    about = "predict every next word of PTB; the loss against position up to 32 times the training length"
    tiers = {"quick": Sizes(size=32, steps=60, batch_size=16), "cpu": Sizes(size=64, steps=1000),
             "gpu": Sizes(size=512, steps=10000, batch_size=64, learning_rate=1e-3)}

    def __init__(self, corpus: Path):
        self.corpus = Path(corpus)
        train = read_split(self.corpus, "train")
        counts = Counter(word for line in train for word in line)
        words = sorted(counts, key=lambda word: (-counts[word], word))[:VOCABULARY]
        self.index = {word: i + 2 for i, word in enumerate(words)}
        self.train = self.encode(train)
        self.valid = self.encode(read_split(self.corpus, "valid"))

    def encode(self, lines: List[List[str]]) -> Tensor:
        ids = [i for line in lines for i in [self.index.get(word, UNKNOWN) for word in line] + [END_OF_LINE]]
        return torch.tensor(ids, dtype=torch.long)

    def vocabulary_size(self) -> int:
        return len(self.index) + 2

    def answer_tokens(self) -> Sequence[int]:
        return range(self.vocabulary_size())

    def tokens_at(self, size: int) -> int:
        return size

    def example(self, rng: random.Random, size: int) -> Example:
        start = rng.randrange(self.train.numel() - size - 1)
        window = self.train[start : start + size + 1].tolist()
        return Example.of(window[:-1], {i: window[i + 1] for i in range(size)})

    def solve(self, tokens: Sequence[int]) -> Dict[int, int]:
        raise TypeError("language modelling has no reference solver: its answers are the corpus's next words")

    def splits(self) -> List[Split]:
        return [Split(f"{m}x", m, about=f"windows of {m} times the training length") for m in MULTIPLES]

    def settings(self) -> Dict[str, object]:
        """What a record must agree on besides the tier's sizes: the corpus, by its token counts."""
        return {"corpus_tokens": [self.train.numel(), self.valid.numel()], "vocabulary": self.vocabulary_size()}

    @torch.no_grad()
    def evaluate(self, model: nn.Module, size: int, seed: int, count: int,  # type: ignore[override]
                 device: torch.device) -> Dict[str, object]:
        """Perplexity of non-overlapping and sliding windows at every multiple, and the loss per position of the
        longest non-overlapping windows (``seed`` and ``count`` are unused: the test is the validation split)."""
        model.eval()
        stream = self.valid[: LONGEST_WINDOWS * size * MULTIPLES[-1] + 1].to(device)
        result: Dict[str, object] = {"perplexity": {}, "refused": {}}
        for multiple in MULTIPLES:
            window = size * multiple
            try:
                model.check_length(window)
            except UserError as refusal:
                result["refused"][f"{multiple}x"] = str(refusal)  # type: ignore[index]
                continue
            losses = window_losses(model, stream, window, window)
            sliding = window_losses(model, stream, window, window // 2)
            result["perplexity"][f"{multiple}x"] = {  # type: ignore[index]
                "nonoverlapping": math.exp(losses.mean().item()),
                "sliding": math.exp(sliding_mean(sliding, window)),
            }
            if multiple == MULTIPLES[-1]:
                result["curve"] = binned_curve(losses.mean(0))
        return result


def window_losses(model: nn.Module, stream: Tensor, window: int, stride: int) -> Tensor:
    """The loss of every target in windows of ``window`` tokens starting every ``stride`` tokens: ``(windows,
    window)``."""
    starts = range(0, stream.numel() - window, stride)
    if not starts:
        raise CorpusMissing(f"the validation split has {stream.numel()} tokens, fewer than one test window of "
                            f"{window + 1}: give --corpus a larger corpus or test shorter windows")
    rows = []
    for start in starts:
        tokens = stream[start : start + window + 1]
        logits = model(tokens[None, :-1])[0].float()
        rows.append(F.cross_entropy(logits, tokens[1:], reduction="none"))
    return torch.stack(rows)


def sliding_mean(losses: Tensor, window: int) -> float:
    """The mean loss of sliding windows: the first window's every token, then each window's second half (the
    tokens it adds)."""
    scored = torch.cat([losses[0], losses[1:, window // 2 :].flatten()])
    return scored.mean().item()


def binned_curve(per_position: Tensor, bins: int = CURVE_BINS) -> Dict[str, List[float]]:
    """The mean loss over log-spaced bins of positions: ``{"positions": [bin's last position + 1],
    "loss": [...]}``."""
    length = per_position.numel()
    edges = sorted({min(length, max(1, round(length ** (k / bins)))) for k in range(bins + 1)} | {0})
    positions, loss = [], []
    for low, high in zip(edges, edges[1:]):
        positions.append(high)
        loss.append(per_position[low:high].mean().item())
    return {"positions": positions, "loss": loss}


def default_corpus(repository: Optional[Path] = None) -> Path:
    """The full PTB beside a clone (``../shared/data/ptb_lm``) where it is, else the clone's sample."""
    root = repository or Path(__file__).resolve().parents[2]
    shared = root.parent / "shared" / "data" / "ptb_lm"
    return shared if shared.is_dir() else root / "data" / "ptb_sample"
