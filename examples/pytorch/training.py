"""The fairseq recipe's training, in plain PyTorch: Adam (betas 0.9, 0.98), fairseq's ``inverse_sqrt`` schedule,
gradient-norm clipping, a fixed number of updates over shuffled blocks of the training stream.

fairseq's cross-entropy criterion sums the token losses and its trainer divides the gradients by the number of
target tokens before clipping: the mean token loss here. fairseq logs that loss in base 2 (``ppl = 2^loss``),
as the log lines of :func:`train` do.
"""

import math
import time
from dataclasses import dataclass
from typing import Callable, Iterator, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor

from data import epoch_batches
from model import PositionLM


@dataclass
class Budget:
    """fairseq-train's ``--max-update``, ``--batch-size``, ``--lr``, ``--warmup-updates``, ``--warmup-init-lr``,
    ``--clip-norm`` of the recipe."""

    updates: int = 500
    batch_size: int = 32
    lr: float = 1e-3
    warmup_updates: int = 100
    warmup_init_lr: float = 1e-7
    clip_norm: float = 1.0


def inverse_sqrt_lr(update: int, budget: Budget) -> float:
    """fairseq's ``inverse_sqrt`` learning rate after ``update`` updates: linear from ``warmup_init_lr`` to ``lr``
    over the warm-up, then ``lr * sqrt(warmup_updates / update)``."""
    if update < budget.warmup_updates:
        return budget.warmup_init_lr + update * (budget.lr - budget.warmup_init_lr) / budget.warmup_updates
    return budget.lr * math.sqrt(budget.warmup_updates / update)


def batches(inputs: Tensor, targets: Tensor, budget: Budget, seed: int) -> Iterator[Tuple[Tensor, Tensor]]:
    """``budget.updates`` batches of blocks, epoch after epoch, each epoch in a new seeded order."""
    update, epoch = 0, 1
    while True:
        for indices in epoch_batches(inputs.size(0), budget.batch_size, seed, epoch):
            if update == budget.updates:
                return
            yield inputs[indices], targets[indices]
            update += 1
        epoch += 1


def train(model: PositionLM, inputs: Tensor, targets: Tensor, budget: Budget, seed: int,
          log: Callable[[str], None], log_interval: int = 100) -> float:
    """Trains ``model`` on the blocks ``(inputs, targets)`` for ``budget.updates`` updates; returns the seconds."""
    optimiser = torch.optim.Adam(model.parameters(), lr=budget.warmup_init_lr, betas=(0.9, 0.98), eps=1e-8)
    model.train()
    start, interval_loss, interval_tokens = time.perf_counter(), 0.0, 0
    for update, (batch_inputs, batch_targets) in enumerate(batches(inputs, targets, budget, seed)):
        for group in optimiser.param_groups:
            group["lr"] = inverse_sqrt_lr(update, budget)
        logits = model(batch_inputs)
        loss = F.cross_entropy(logits.flatten(0, 1), batch_targets.flatten())
        optimiser.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), budget.clip_norm)
        optimiser.step()
        interval_loss += loss.item() * batch_targets.numel()
        interval_tokens += batch_targets.numel()
        if (update + 1) % log_interval == 0 or update + 1 == budget.updates:
            base2 = interval_loss / interval_tokens / math.log(2)
            lr = inverse_sqrt_lr(update, budget)
            log(f"update {update + 1} | loss {base2:.3f} | ppl {2 ** base2:.2f} | lr {lr:.6g} | gnorm "
                f"{grad_norm.item():.3f} | wall {time.perf_counter() - start:.0f}")
            interval_loss, interval_tokens = 0.0, 0
    return time.perf_counter() - start
