"""Shims for fairseq 0.12 on Python 3.11, torch >= 2.6 and numpy 2 (see docs/fairseq_compat.md).

Each shim names the fairseq behaviour it works around. All are applied once, at plugin import, and
are no-ops where the behaviour is absent (official fairseq 0.12.2 on an older stack included).
"""

import argparse
import importlib.util
import sys
import types

import numpy as np
import torch
from torch import nn

from posattn.errors import UserError


def allow_fairseq_checkpoints_in_torch_load() -> None:
    """fairseq's ``checkpoint_utils.load_checkpoint_to_cpu`` calls ``torch.load`` without
    ``weights_only``; torch >= 2.6 defaults it to True and then refuses the ``argparse.Namespace``
    that legacy (argparse) models store under ``"args"``. Allow that one class (and omegaconf's
    containers, which distributed resume unpickles), instead of turning the safety check off."""
    add_safe_globals = getattr(torch.serialization, "add_safe_globals", None)
    if add_safe_globals is None:  # torch < 2.4: weights_only is off by default
        return
    safe = [argparse.Namespace]
    try:
        from omegaconf import DictConfig, ListConfig
        from omegaconf.base import ContainerMetadata, Metadata
        from omegaconf.nodes import AnyNode

        safe += [DictConfig, ListConfig, ContainerMetadata, Metadata, AnyNode]
    except ImportError:
        pass
    add_safe_globals(safe)


def restore_numpy_compat() -> None:
    """numpy 2 removed ``np.compat``; fairseq reads ``np.compat.long`` in
    ``TokenBlockDataset`` (``--sample-break-mode eos``) and ``LanguagePairDataset``
    (``--num-batch-buckets``)."""
    if not hasattr(np, "compat"):
        np.compat = types.SimpleNamespace(long=np.int64, unicode=str)


def never_use_fused_encoder_layer(layer: nn.Module) -> None:
    """Some fairseq releases route an eval-mode, freshly loaded post-norm encoder layer through
    ``torch._transformer_encoder_layer_fwd`` ("BetterTransformer"), gated on ``BT_version``,
    ``load_to_BT`` and ``can_use_fastpath``; that kernel would skip our self-attention. Close the
    gate on a layer whose attention carries position terms."""
    layer.BT_version = False
    layer.can_use_fastpath = False
    layer.load_to_BT = False


def show_model_options_in_help() -> None:
    """fairseq's ``options.parse_args_and_arch`` lets argparse answer ``-h`` *before* it adds the
    options of ``--arch`` (fairseq's own ``fairseq-train --arch transformer -h`` lists none).
    Wrap it so that, for the plugin's architectures, ``-h`` lists their options too."""
    from fairseq import options

    original = options.parse_args_and_arch
    if getattr(original, "shows_model_options", False):
        return

    def parse_args_and_arch(parser, input_args=None, *args, **kwargs):
        argv = sys.argv[1:] if input_args is None else list(input_args)
        if {"-h", "--help"} & set(argv):
            _add_plugin_model_options(parser, argv)
        return original(parser, input_args, *args, **kwargs)

    parse_args_and_arch.shows_model_options = True
    options.parse_args_and_arch = parse_args_and_arch


def _add_plugin_model_options(parser: argparse.ArgumentParser, argv: list) -> None:
    arch_parser = argparse.ArgumentParser(add_help=False)
    arch_parser.add_argument("--arch", "-a")
    arch = arch_parser.parse_known_args(argv)[0].arch
    from fairseq.models import ARCH_MODEL_REGISTRY

    model = ARCH_MODEL_REGISTRY.get(arch)
    if model is not None and model.__module__.startswith(__name__.split(".")[0]):
        model.add_args(parser.add_argument_group("Model-specific configuration"))


def train_bf16_without_torch_xla() -> None:
    """fairseq's ``options.parse_args_and_arch`` turns on ``--tpu`` whenever ``--bf16`` (or
    ``--memory-efficient-bf16``) is given (the option's help: "use bfloat16; implies --tpu"). The
    trainer then asks torch_xla for its device, and without torch_xla ``fairseq-train --bf16``
    fails at start-up, on a CPU and on a GPU alike, with "'NoneType' object has no attribute
    'xla_device'". Where torch_xla is not installed and ``--tpu`` was not given, keep it off, so
    that ``--bf16`` trains in bfloat16 on the device fairseq would use otherwise (``--cpu`` or CUDA),
    through the same ``FP16Optimizer`` / ``MemoryEfficientFP16Optimizer`` without loss scaling."""
    from fairseq import options

    original = options.parse_args_and_arch
    if getattr(original, "keeps_bf16_off_tpu", False) or importlib.util.find_spec("torch_xla") is not None:
        return

    def parse_args_and_arch(parser, input_args=None, *args, **kwargs):
        parsed = original(parser, input_args, *args, **kwargs)
        namespace = parsed[0] if isinstance(parsed, tuple) else parsed
        argv = sys.argv[1:] if input_args is None else list(input_args)
        if getattr(namespace, "bf16", False) and "--tpu" not in argv:
            namespace.tpu = False
        return parsed

    parse_args_and_arch.keeps_bf16_off_tpu = True
    options.parse_args_and_arch = parse_args_and_arch


class NeedsCudaError(UserError, ValueError):
    """A precision option of fairseq-train that only CUDA gives."""


def refuse_cuda_precision_on_a_cpu() -> None:
    """fairseq's fp16 training reaches for CUDA whatever the device: ``FP16Optimizer.build_fp32_params``
    flattens the fp32 master weights onto ``torch.cuda.current_device()``, so ``fairseq-train --fp16``
    fails at start-up on a CPU with "Torch not compiled with CUDA enabled" (or "No CUDA GPUs are
    available"), and when the loss scaler finds an overflow ``Trainer.train_step`` resets the
    gradient norm with ``torch.tensor(0.0).cuda()``, so ``--fp16-no-flatten-grads`` and
    ``--memory-efficient-fp16`` run until the first overflow and crash there. ``--amp`` is CUDA's autocast
    and gradient scaler, which torch disables without CUDA: it trains in fp32, and its checkpoint says
    ``amp=True``. Refuse both on a CPU when the trainer is built, in one line, saying what to use instead."""
    from fairseq.trainer import Trainer

    original = Trainer.__init__
    if getattr(original, "refuses_cuda_precision_on_a_cpu", False):
        return

    def __init__(self, cfg, *args, **kwargs):
        original(self, cfg, *args, **kwargs)
        if self.cuda or self.tpu:
            return
        if self.cfg.common.fp16:
            raise NeedsCudaError(
                "--fp16 / --memory-efficient-fp16 need a CUDA GPU: fairseq's fp16 training moves its "
                "master weights and its loss-scaling overflow handling to CUDA. On a CPU use --bf16 or "
                "--memory-efficient-bf16 (bfloat16, no loss scaling)")
        if self.cfg.common.amp:
            raise NeedsCudaError(
                "--amp needs a CUDA GPU: it is CUDA's autocast and gradient scaler, which torch turns off on a "
                "CPU, so the model would train in fp32 while its checkpoint says amp. On a CPU drop --amp (fp32) "
                "or use --bf16 (bfloat16)")

    __init__.refuses_cuda_precision_on_a_cpu = True
    Trainer.__init__ = __init__


def apply_all() -> None:
    allow_fairseq_checkpoints_in_torch_load()
    restore_numpy_compat()
    train_bf16_without_torch_xla()
    refuse_cuda_precision_on_a_cpu()
