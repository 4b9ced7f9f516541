"""Examples to tensors: tokens padded on the right (a causal model's real positions never read the padding) and
the answers as targets, ``IGNORE`` elsewhere."""

from typing import List, Sequence, Tuple

import torch
from torch import Tensor

from posattn_tasks.tasks.base import IGNORE, Example


def batch_tensors(examples: Sequence[Example], device: torch.device) -> Tuple[Tensor, Tensor]:
    """``tokens`` and ``targets``, both ``(batch, longest)``."""
    longest = max(len(example.tokens) for example in examples)
    tokens = torch.zeros(len(examples), longest, dtype=torch.long)
    targets = torch.full((len(examples), longest), IGNORE, dtype=torch.long)
    for row, example in enumerate(examples):
        tokens[row, : len(example.tokens)] = torch.tensor(example.tokens)
        for position, answer in example.answers.items():
            targets[row, position] = answer
    return tokens.to(device), targets.to(device)


def chunks(examples: Sequence[Example], token_budget: int) -> List[Sequence[Example]]:
    """``examples`` in consecutive batches of at most ``token_budget`` tokens (at least one example each)."""
    longest = max(len(example.tokens) for example in examples)
    per_batch = max(1, token_budget // longest)
    return [examples[start : start + per_batch] for start in range(0, len(examples), per_batch)]
