"""Shims for fairseq 0.12's distributed training on CPU processes and under ``torchrun``.

fairseq 0.12 was written for one CUDA device per process. Three of its start-up paths fail or
surprise without one, and it never releases its process group at the end; each shim below names the
behaviour it works around, changes nothing where that behaviour is absent (CUDA processes keep
fairseq's own code path), and is applied once, at plugin import, by :func:`apply_all`.
"""

import os
from typing import Any, Callable

import torch
from torch.nn.parallel import DistributedDataParallel

TORCHRUN_VARIABLES = ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK")
CPU_DDP_BACKENDS = "--ddp-backend pytorch_ddp (fairseq's default), legacy_ddp or no_c10d"


class DeviceAgnosticDistributedDataParallel(DistributedDataParallel):
    """torch's ``DistributedDataParallel`` as fairseq's ``--ddp-backend pytorch_ddp`` builds it.

    fairseq's ``DistributedFairseqModel`` always passes ``device_ids=[device_id]`` and
    ``output_device=device_id``; torch refuses both for a module whose parameters live on the CPU
    ("device_ids and output_device arguments only work with ... GPU modules"). For a CPU module
    they are dropped, as torch asks; a CUDA module gets them unchanged."""

    def __init__(self, module: torch.nn.Module, *args: Any, **kwargs: Any) -> None:
        if all(p.device.type == "cpu" for p in module.parameters()):
            kwargs["device_ids"] = None
            kwargs["output_device"] = None
        super().__init__(module, *args, **kwargs)


def allow_pytorch_ddp_on_cpu() -> None:
    """Make ``--ddp-backend pytorch_ddp`` / ``c10d`` build on CPU processes (gloo)."""
    from fairseq.models import distributed_fairseq_model

    distributed_fairseq_model.DistributedDataParallel = DeviceAgnosticDistributedDataParallel


def adopt_torchrun_environment(distributed_cfg: Any) -> None:
    """Take the world size and rank from ``torchrun`` (or ``torch.distributed.launch``).

    fairseq's ``infer_init_method`` reads ``WORLD_SIZE`` / ``RANK`` only when
    ``--distributed-world-size`` is not 1, but its default is the number of visible GPUs, at least
    1: 1 on a one-GPU node and on a CPU machine, where every process would then train alone on the
    whole data. It also sets ``device_id = rank % torch.cuda.device_count()``, a division by zero
    without GPUs. Here a launcher's ``WORLD_SIZE`` > 1 wins over a world size of 1, and without GPUs
    the rendezvous is filled in as fairseq would (``env://``, no spawn) with device 0."""
    if distributed_cfg.distributed_init_method is not None or distributed_cfg.tpu:
        return
    if not all(name in os.environ for name in TORCHRUN_VARIABLES):
        return
    world_size = int(os.environ["WORLD_SIZE"])
    if world_size <= 1:
        return
    distributed_cfg.distributed_world_size = world_size
    if torch.cuda.device_count() == 0:
        distributed_cfg.distributed_init_method = "env://"
        distributed_cfg.distributed_rank = int(os.environ["RANK"])
        distributed_cfg.device_id = 0
        distributed_cfg.distributed_no_spawn = True


def check_ddp_backend(cfg: Any) -> None:
    """Refuse, before anything is built, a ``--ddp-backend`` that cannot run here.

    ``fully_sharded`` is fairscale's ``FullyShardedDataParallel`` (fairscale 0.4.13, the last
    release, installs from PyPI and imports with this torch), which puts the model on a CUDA device
    and reduces gradients on CUDA streams: on a CPU process it stops while wrapping the model, with
    "Torch not compiled with CUDA enabled"."""
    distributed = cfg.distributed_training
    if distributed.ddp_backend != "fully_sharded":
        return
    if cfg.common.cpu or not torch.cuda.is_available():
        raise ValueError(
            "--ddp-backend fully_sharded (fairscale's FullyShardedDataParallel) runs on CUDA GPUs "
            f"only; on CPU processes use {CPU_DDP_BACKENDS}")
    try:
        import fairscale  # noqa: F401
    except ImportError:
        raise ImportError(
            "--ddp-backend fully_sharded needs fairscale: pip install fairscale==0.4.13 "
            f"(or use {CPU_DDP_BACKENDS})") from None


def release_process_group() -> None:
    """Destroy the default process group this process joined, if any.

    fairseq 0.12 never calls ``torch.distributed.destroy_process_group``: a rank that ran its
    ``main`` in this process (``--distributed-no-spawn``, ``torchrun``) exits with gloo's threads
    still running, and their teardown at interpreter exit can abort the finished rank ("terminate
    called without an active exception", exit status -6) after its checkpoint is written."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


def check_before_launch(call_main: Callable) -> Callable:
    """Wrap fairseq's ``distributed_utils.call_main`` (what ``fairseq-train`` and the other tools
    start with) so that the two functions above run on the full config before any process starts,
    and the process group is released once ``main`` has returned here."""
    if getattr(call_main, "checks_distributed_config", False):
        return call_main

    def checked_call_main(cfg: Any, main: Callable, **kwargs: Any) -> Any:
        check_ddp_backend(cfg)
        adopt_torchrun_environment(cfg.distributed_training)
        result = call_main(cfg, main, **kwargs)
        release_process_group()
        return result

    checked_call_main.checks_distributed_config = True
    return checked_call_main


def apply_all() -> None:
    """Install the shims; idempotent."""
    from fairseq.distributed import utils as distributed_utils

    allow_pytorch_ddp_on_cpu()
    distributed_utils.call_main = check_before_launch(distributed_utils.call_main)
