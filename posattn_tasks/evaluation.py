"""Scoring a trained model on a task's test splits.

Every answer is predicted as the most likely of the task's answer tokens at its position (so that chance is
one over their number), under teacher forcing: an example counts as solved when every one of its answers is
right, which is what greedy decoding of its answers would give. Each split's examples come from a stream of
their own (the task, the split and the seed), the same for every method, so that methods are compared on the
same examples.
"""

from dataclasses import asdict, dataclass
from typing import Any, Dict, Optional, Sequence

import torch
from torch import nn

from posattn.errors import UserError
from posattn_tasks.batches import batch_tensors, chunks
from posattn_tasks.tasks.base import IGNORE, Example, Split, Task, examples

#: tokens per evaluation batch
EVALUATION_TOKENS = 16384


@dataclass
class SplitScore:
    """One split's scores: the fraction of answers right and of examples with every answer right, or the
    one-line reason the model refused the split (a length past its positions)."""

    split: str
    tokens: int
    answer_accuracy: Optional[float] = None
    example_accuracy: Optional[float] = None
    answers: int = 0
    refused: Optional[str] = None


def split_examples(task: Task, split: Split, size: int, seed: int, count: int) -> Sequence[Example]:
    return examples(task, f"{task.name}/{split.name}/{seed}", count, size * split.multiple, **split.settings)


@torch.no_grad()
def score(model: nn.Module, task: Task, test: Sequence[Example], device: torch.device) -> Dict[str, float]:
    """The answer and example accuracies of ``model`` (a callable from tokens to logits) on ``test``."""
    allowed = torch.tensor(list(task.answer_tokens()), device=device)
    right = total = solved = 0
    for chunk in chunks(test, EVALUATION_TOKENS):
        tokens, targets = batch_tensors(chunk, device)
        logits = model(tokens)[..., allowed]
        predicted = allowed[logits.argmax(-1)]
        scored = targets != IGNORE
        correct = (predicted == targets) & scored
        right += int(correct.sum())
        total += int(scored.sum())
        solved += int((correct.sum(-1) == scored.sum(-1)).sum())
    return {"answer_accuracy": right / total, "example_accuracy": solved / len(test), "answers": total}


def evaluate_splits(model: nn.Module, task: Task, size: int, seed: int, count: int,
                    device: torch.device) -> Dict[str, Dict[str, Any]]:
    """Every split of ``task``, ``count`` examples each: each split's :class:`SplitScore` as a dict."""
    model.eval()
    scores = {}
    for split in task.splits():
        test = split_examples(task, split, size, seed, count)
        longest = max(len(example.tokens) for example in test)
        try:
            model.check_length(longest)
        except UserError as refusal:
            scores[split.name] = asdict(SplitScore(split.name, longest, refused=str(refusal)))
            continue
        scores[split.name] = asdict(SplitScore(split.name, longest, **score(model, task, test, device)))
    return scores
