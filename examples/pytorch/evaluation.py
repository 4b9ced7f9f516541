"""The two evaluations of the fairseq recipe, each scoring every token of a split once (fairseq-eval-lm):

- ``nonoverlapping`` (``--context-window 0``): the split cut into windows of L targets, each read from the
  token before its first target;
- ``sliding`` (``--context-window L - S``, S = L/2): windows of S targets, each read after up to L - S earlier
  tokens (the first window after none), so that the model reads at most L tokens.

Perplexity is exp of the mean token negative log-likelihood (fairseq-eval-lm's base-2 loss and 2^loss are the
same number). :func:`windows` lists what is read and what is scored, :func:`evaluate` runs the model on them.
"""

import math
import time
from dataclasses import dataclass
from typing import Dict, Iterator, List

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from data import shifted_inputs

MODES = ("nonoverlapping", "sliding")


@dataclass(frozen=True)
class Window:
    """The model reads input positions ``[start, end)`` and scores the targets of ``[scored_from, end)``."""

    start: int
    scored_from: int
    end: int


def stride(mode: str, length: int) -> int:
    """Targets scored per window: L for non-overlapping windows, L/2 for the sliding window."""
    return length if mode == "nonoverlapping" else max(length // 2, 1)


def windows(tokens: int, mode: str, length: int) -> Iterator[Window]:
    """Every window of a stream of ``tokens`` targets at evaluation length ``length``; each target once."""
    scored = stride(mode, length)
    context = length - scored
    for first in range(0, tokens, scored):
        yield Window(max(0, first - context), first, min(first + scored, tokens))


def batches_of_equal_length(all_windows: List[Window], max_tokens: int) -> Iterator[List[Window]]:
    """Consecutive windows of one read length, at most ``max_tokens`` read tokens (at least one window) a batch."""
    batch: List[Window] = []
    for window in all_windows:
        size = window.end - window.start
        if batch and (size != batch[0].end - batch[0].start or (len(batch) + 1) * size > max_tokens):
            yield batch
            batch = []
        batch.append(window)
    if batch:
        yield batch


@torch.no_grad()
def evaluate(model: nn.Module, targets: Tensor, mode: str, length: int, max_tokens: int = 8192) -> Dict[str, float]:
    """Perplexity of ``model`` (tokens ``(batch, length)`` to next-token logits ``(batch, length, vocab)``) on the
    stream ``targets`` in ``mode`` at evaluation length ``length``:
    ``{"ppl", "loss" (base 2, fairseq's), "nll" (nats), "tokens", "seconds"}``."""
    model.eval()
    inputs = shifted_inputs(targets)
    start, total_nll, total_tokens = time.perf_counter(), 0.0, 0
    for batch in batches_of_equal_length(list(windows(targets.numel(), mode, length)), max_tokens):
        read = torch.stack([inputs[w.start:w.end] for w in batch])
        logits = model(read)
        for row, window in enumerate(batch):
            scored = slice(window.scored_from - window.start, window.end - window.start)
            total_nll += F.cross_entropy(logits[row, scored], targets[window.scored_from:window.end],
                                         reduction="sum").item()
            total_tokens += window.end - window.scored_from
    nll = total_nll / total_tokens
    return {"ppl": math.exp(nll), "loss": nll / math.log(2), "nll": nll, "tokens": total_tokens,
            "seconds": time.perf_counter() - start}
