"""A Llama with the T5 bias trained by ``transformers.Trainer`` with DDP on CPU processes (gloo), as a user launches
it: ``python -m torch.distributed.run --nproc_per_node 2 tests/huggingface_ddp_train.py OUTPUT``
(tests/test_huggingface_training.py does, and trains the same model in one process with :func:`train`).

Each rank writes its parameters to ``OUTPUT/rank<r>.pt``; rank 0 writes the logged losses to ``OUTPUT/losses.json``
and saves the model (``trainer.save_model``) to ``OUTPUT/model``.
"""

import json
import os
import sys
from typing import Any

import torch

import posattn_huggingface as hf
from huggingface_helpers import METHODS, cpu_trainer, llama, ptb_blocks, training_losses

STEPS = 20
#: the blocks of 32 characters of one update, over every process
BATCH = 8
METHOD = METHODS["t5-bias"]


def train(output_dir: str, processes: int = 1, **arguments: Any) -> Any:
    """A Llama with the T5 bias, in fp64, without dropout, trained for :data:`STEPS` updates of :data:`BATCH`
    blocks of the PTB sample in their order (rank r of ``processes`` takes its share of each update's blocks);
    ``arguments``: other ``TrainingArguments``. Returns the trainer, done."""
    torch.manual_seed(0)
    model = hf.apply_position_method(llama().double(), **METHOD)
    trainer = cpu_trainer(model, output_dir, ptb_blocks("train", STEPS * BATCH, 32), max_steps=STEPS,
                          per_device_train_batch_size=BATCH // processes, train_sampling_strategy="sequential",
                          **arguments)
    trainer.train()
    return trainer


def main(output_dir: str) -> None:
    trainer = train(output_dir, processes=int(os.environ["WORLD_SIZE"]), ddp_backend="gloo")
    parameters = {name: parameter.detach() for name, parameter in trainer.model.named_parameters()}
    torch.save(parameters, os.path.join(output_dir, f"rank{trainer.args.process_index}.pt"))
    if trainer.is_world_process_zero():
        with open(os.path.join(output_dir, "losses.json"), "w", encoding="utf-8") as f:
            json.dump(training_losses(trainer), f)
    trainer.save_model(os.path.join(output_dir, "model"))


if __name__ == "__main__":
    main(sys.argv[1])
