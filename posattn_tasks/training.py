"""Training a model on a task: fresh examples at every step, drawn from the run's seed; AdamW with a linear
warm-up over the first tenth of the steps and a cosine decay to zero; gradients clipped to norm 1; the loss is
the cross-entropy of the answers alone."""

import math
import random
import time
from dataclasses import dataclass, field
from typing import Callable, List, Optional

import torch
import torch.nn.functional as F
from torch import nn

from posattn_tasks.batches import batch_tensors
from posattn_tasks.tasks.base import IGNORE, Sizes, Task

#: how many points of the training loss a record keeps
LOSS_POINTS = 20


@dataclass
class TrainingLog:
    """The loss at evenly spaced steps (each the mean over the steps since the previous point) and the time."""

    steps: List[int] = field(default_factory=list)
    losses: List[float] = field(default_factory=list)
    seconds: float = 0.0


def learning_rate_at(step: int, sizes: Sizes) -> float:
    warmup = max(1, sizes.steps // 10)
    if step < warmup:
        return sizes.learning_rate * (step + 1) / warmup
    progress = (step - warmup) / max(1, sizes.steps - warmup)
    return sizes.learning_rate * 0.5 * (1 + math.cos(math.pi * progress))


def train(model: nn.Module, task: Task, sizes: Sizes, seed: int, device: torch.device,
          on_step: Optional[Callable[[int, float], None]] = None) -> TrainingLog:
    """Train ``model`` for ``sizes.steps`` steps on examples of ``sizes.size`` from ``seed``'s training stream."""
    rng = random.Random(f"{task.name}/train/{seed}")
    optimizer = torch.optim.AdamW(model.parameters(), lr=sizes.learning_rate, betas=(0.9, 0.98), weight_decay=0.01)
    log, every = TrainingLog(), max(1, sizes.steps // LOSS_POINTS)
    running, counted = torch.zeros((), device=device), 0  # summed on the device: no sync per step
    start = time.perf_counter()
    model.train()
    for step in range(sizes.steps):
        for group in optimizer.param_groups:
            group["lr"] = learning_rate_at(step, sizes)
        tokens, targets = batch_tensors([task.example(rng, sizes.size) for _ in range(sizes.batch_size)], device)
        logits = model(tokens)
        loss = F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(), ignore_index=IGNORE)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        running, counted = running + loss.detach(), counted + 1
        if (step + 1) % every == 0 or step + 1 == sizes.steps:
            log.steps.append(step + 1)
            log.losses.append(running.item() / counted)
            running, counted = torch.zeros((), device=device), 0
        if on_step is not None:
            on_step(step + 1, log.losses[-1] if log.losses else math.nan)
    log.seconds = time.perf_counter() - start
    return log
