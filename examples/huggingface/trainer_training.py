"""The fairseq recipe's training with ``transformers.Trainer``: its budget as ``TrainingArguments``, the training
stream's blocks as a ``Dataset``, its log lines from a ``TrainerCallback``.

- The loss is the model's own (``ForCausalLMLoss``), given the targets already aligned with the inputs as
  ``shift_labels`` (what transformers' padding-free collators pass): every one of a block's 64 targets is scored,
  its input the stream's token before it (examples/pytorch/data.py), the mean token loss of the batch, as
  fairseq's. ``labels`` (the same targets) only tells the model to compute a loss.
- Adam: ``adamw_torch`` without weight decay (AdamW with decay 0 is Adam), betas (0.9, 0.98), ε 1e-8.
- ``lr_scheduler_type="inverse_sqrt"`` with ``warmup_steps`` 100 is fairseq's ``inverse_sqrt`` from the 100th
  update on (lr x sqrt(100 / update): transformers' time scale defaults to the warm-up), and during the warm-up
  rises linearly from 0 where fairseq's rises from ``--warmup-init-lr`` 1e-7: the first update has lr 0 (Adam's
  moments still take its gradient), update u < 100 lr x u / 100 instead of 1e-7 + u x (lr - 1e-7) / 100.
- Gradient-norm clipping at 1.0 (``max_grad_norm``); 500 updates (``max_steps``) of 32 blocks, each epoch in
  Trainer's seeded random order (its last batch smaller, as fairseq's); no checkpoint, no evaluation during
  training; on the CPU (``use_cpu``), no reporting service.
"""

import math
import time
from pathlib import Path
from typing import Callable, Dict

import transformers
from torch import Tensor
from torch.utils.data import Dataset

from training import Budget

#: transformers' warm-up starts from lr 0 (fairseq's from 1e-7); the budget records it
WARMUP_INIT_LR = 0.0


class BlockDataset(Dataset):
    """The training stream's blocks: ``input_ids`` and the targets aligned with them (``shift_labels``)."""

    def __init__(self, inputs: Tensor, targets: Tensor):
        self.inputs, self.targets = inputs, targets

    def __len__(self) -> int:
        return self.inputs.size(0)

    def __getitem__(self, index: int) -> Dict[str, Tensor]:
        return {"input_ids": self.inputs[index], "labels": self.targets[index], "shift_labels": self.targets[index]}


def training_arguments(budget: Budget, seed: int, output_dir: Path,
                       log_interval: int) -> transformers.TrainingArguments:
    """The budget as ``TrainingArguments`` (the module's docstring says what each one is in fairseq's terms)."""
    return transformers.TrainingArguments(
        output_dir=str(output_dir), max_steps=budget.updates, per_device_train_batch_size=budget.batch_size,
        learning_rate=budget.lr, lr_scheduler_type="inverse_sqrt", warmup_steps=budget.warmup_updates,
        optim="adamw_torch", weight_decay=0.0, adam_beta1=0.9, adam_beta2=0.98, adam_epsilon=1e-8,
        max_grad_norm=budget.clip_norm, logging_steps=log_interval, save_strategy="no", report_to="none",
        use_cpu=True, seed=seed, dataloader_num_workers=0, remove_unused_columns=False)


class RecipeLogLines(transformers.TrainerCallback):
    """Trainer's logged training loss as examples/pytorch's log lines (``update N | loss X | ...``, loss in base 2,
    the mean of the interval's updates), which the results page reads from ``train.log``."""

    def __init__(self, log: Callable[[str], None]):
        self.log = log
        self.start = time.perf_counter()

    def on_train_begin(self, args, state, control, **kwargs) -> None:
        self.start = time.perf_counter()

    def on_log(self, args, state, control, logs=None, **kwargs) -> None:
        if not logs or "loss" not in logs:
            return
        base2 = logs["loss"] / math.log(2)
        self.log(f"update {state.global_step} | loss {base2:.3f} | ppl {2 ** base2:.2f} | lr "
                 f"{logs.get('learning_rate', float('nan')):.6g} | gnorm {logs.get('grad_norm', float('nan')):.3f} "
                 f"| wall {time.perf_counter() - self.start:.0f}")


def train(model: transformers.PreTrainedModel, inputs: Tensor, targets: Tensor, budget: Budget, seed: int,
          log: Callable[[str], None], output_dir: Path, log_interval: int = 100) -> float:
    """Trains ``model`` on the blocks ``(inputs, targets)`` with ``Trainer`` for ``budget.updates`` updates, logging
    every ``log_interval`` updates (every update of a shorter budget); returns the seconds. ``output_dir``:
    Trainer's (nothing is saved in it)."""
    arguments = training_arguments(budget, seed, output_dir, min(log_interval, budget.updates))
    trainer = transformers.Trainer(model=model, args=arguments,
                                   train_dataset=BlockDataset(inputs, targets), callbacks=[RecipeLogLines(log)])
    start = time.perf_counter()
    trainer.train()
    return time.perf_counter() - start
