"""Shims for fairseq 0.12 on Python 3.11, torch >= 2.6 and numpy 2 (see ../shared/FAIRSEQ_NOTES.md).

Each shim names the fairseq behaviour it works around. All are applied once, at plugin import, and
are no-ops where the behaviour is absent (official fairseq 0.12.2 on an older stack included).
"""

import argparse
import sys
import types

import numpy as np
import torch
from torch import nn


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


def apply_all() -> None:
    allow_fairseq_checkpoints_in_torch_load()
    restore_numpy_compat()
