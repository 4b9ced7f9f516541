"""A position-aware side's protocol, in one object that the encoder, the decoder (and language model) and the
tagger share.

A side (encoder, decoder, tagger) whose options ask for position terms does the same things with them: it
checks each batch's length against the positions its terms were built for, unpacks the side data its methods
read from the batch (:class:`~posattn.position_terms.side_inputs.BatchSideData`, collated by
the task under their ``net_input`` keys), builds the batch's
:class:`~posattn.position_context.PositionContext` (the only place a model builds one),
records the options that make its function in its weights (:class:`PositionOptionsRecord`), owns the modules
its layers' terms share and the input position embedding a method gives it, upgrades older weights of them,
and wraps its layers for activation checkpointing and FSDP exactly as fairseq wraps its own.
:class:`PositionSide` does them; the sides only call it.

**A side owns what its layers share.** A module that the terms of several layers read (T5's table,
``LayerSpec.shared``) is registered once, on the side, in ``position_shared``, and the terms read it without
registering it: the state dict holds it once, as ``{side}.position_shared.{name}``. Weights saved when every
layer registered it are upgraded when they load (:func:`upgrade_shared`).
"""

import logging
from typing import Any, Callable, Dict, List, Mapping, Optional

import torch
from fairseq.distributed import fsdp_wrap
from fairseq.modules.checkpoint_activations import checkpoint_wrapper
from torch import Tensor, nn

from posattn.position_options import SidePositionOptions
from fairseq_posattn.models.position_record import PositionOptionsRecord, optimizer_state_loads
from posattn.position_options import PositionOptionError
from posattn.position_context import PositionContext, SequenceTables
from posattn.position_terms.base import PositionTerm
from posattn.position_terms.side_inputs import InputPositionEmbedding
from posattn.errors import UserError

#: what a side's tokens are, as side data errors name them
BATCH_NAMES = {"encoder": "source batch", "decoder": "target batch"}
#: the remedy of a batch longer than the side's t in fairseq's commands (``SidePositionOptions.check_length``)
TOO_LONG_IN_FAIRSEQ = ("retrain with a larger {option} (at least {length}) or drop longer inputs (fairseq's "
                       "--skip-invalid-size-inputs-valid-test)")
#: the modules that hold a side's position method (its layers' terms by kind, the side's shared modules, its input
#: position embeddings), by their names in the state dict: what ``--{side}-reset-position-options`` may reshape
METHOD_MODULES = frozenset({"query_key_terms", "additive_terms", "scaling_term", "key_value_terms",
                            "post_softmax_term", "projection_term", "token_difference_terms", "row_term",
                            "logit_matrix_terms",
                            "content_term", "position_shared", "position_input", "embed_positions"})

logger = logging.getLogger(__name__)


class PositionSide:
    """The position protocol of one side of a model (module docstring).

    Args:
        options: the side's position options.
        right_padded: the side's batches are padded on the right only (fairseq's target and language-model
            batches), so token positions are indices; False computes them from the padding.
        causal: the side is causal (a decoder, a language model).
    """

    def __init__(self, options: SidePositionOptions, right_padded: bool, causal: bool):
        self.options, self.right_padded, self.causal = options, right_padded, causal
        self.side_data = options.side_data()
        self.layers_built = 0

    def wrap(self, layer: nn.Module, cfg: Any) -> nn.Module:
        """``layer`` wrapped for activation checkpointing and FSDP as fairseq's ``build_*_layer`` do."""
        return wrap_layer(layer, cfg)

    def next_layer(self, build: Callable[[int], nn.Module], cfg: Any) -> nn.Module:
        """The side's next layer, ``build(index)`` with its 0-based index (fairseq builds a side's layers in
        order, one ``build_*_layer`` call each), wrapped (:meth:`wrap`)."""
        layer = build(self.layers_built)
        self.layers_built += 1
        return self.wrap(layer, cfg)

    def attach(self, owner: nn.Module) -> None:
        """Register on ``owner``, once its layers are built, the record of its options
        (``position_record``) and the modules its layers' terms share (``position_shared``); refuses
        ``--{side}-layer-methods`` that leave a method on in none of the layers built."""
        self.options.check_layer_count(self.layers_built)
        owner.position_record = PositionOptionsRecord.of_side(self.options)
        owner.position_shared = nn.ModuleDict(self.options.shared)

    def input_embedding(self, embed_dim: int, padding_idx: int, sequential: bool) -> Optional[InputPositionEmbedding]:
        """The position embedding a method gives the side's input (the side registers it as ``position_input``),
        or None; ``sequential``: the side has sequential position embeddings."""
        return self.options.input_embedding(embed_dim, padding_idx, sequential)

    def upgrade(self, owner: nn.Module, state_dict: Dict[str, Tensor], name: str) -> None:
        """Weights from before the side owned its layers' shared modules (:func:`upgrade_shared`) and its input
        position embedding (:func:`upgrade_input_embedding`); with ``--{side}-reset-position-options``, the
        weights of another method (:func:`adopt_method_weights`)."""
        upgrade_shared(owner, state_dict, name)
        upgrade_input_embedding(owner, state_dict, name)
        if self.options.values.get("reset_position_options", False):
            adopt_method_weights(owner, state_dict, name, self.options.flag("reset_position_options"))

    def context(self, tokens: Tensor, padding_idx: int, side_inputs: Optional[Mapping[str, Tensor]] = None,
                tables: Optional[SequenceTables] = None) -> PositionContext:
        """The batch's context, after checking its length (an error naming the option to raise).

        Args:
            tokens: ``(batch, length)`` token ids.
            side_inputs: the batch's collated side data by ``net_input`` key (each ``(batch, rows, length)``):
                what the side's methods read (:attr:`side_data`) must be there, the rest is ignored.
            tables: the sequence tables of incremental decoding.
        """
        self.options.check_length(tokens.size(1), TOO_LONG_IN_FAIRSEQ)
        side_inputs = side_inputs or {}
        rows: Dict[str, Tensor] = {}
        for asked_by, data in self.side_data:
            rows.update(data.unpack(side_inputs.get(data.key), tokens, asked_by, BATCH_NAMES[self.options.side]))
        return PositionContext.from_tokens(tokens, padding_idx, self.right_padded, rows, tables, self.causal)


class PositionSideOwner:
    """What a module that owns a :class:`PositionSide` (an encoder, a decoder, the tagger's encoder) gets from
    it: its options (``position_options``, the side's) and the upgrade of older weights on load. Mixed in before
    the fairseq class the module extends; the module sets ``position_side`` first thing in ``__init__``."""

    position_side: PositionSide

    @property
    def position_options(self) -> SidePositionOptions:
        return self.position_side.options

    def upgrade_state_dict_named(self, state_dict: Dict[str, Tensor], name: str) -> Dict[str, Tensor]:
        """Weights from before the side owned its shared modules and its input position embedding, then the
        fairseq class's own upgrades."""
        self.position_side.upgrade(self, state_dict, name)
        return super().upgrade_state_dict_named(state_dict, name)


def add_layer_wrapping_args(parser: Any) -> None:
    """fairseq's transformer options for checkpointing and FSDP-wrapping layers, for the models that
    build their own layer stacks (the tagger, the classifier)."""
    parser.add_argument("--checkpoint-activations", action="store_true",
                        help="checkpoint each layer's activations (recomputed in the backward pass)")
    parser.add_argument("--offload-activations", action="store_true",
                        help="checkpoint each layer's activations and keep its inputs on the CPU (sets "
                        "--checkpoint-activations)")
    parser.add_argument("--min-params-to-wrap", type=int, metavar="N",
                        help="with --ddp-backend fully_sharded: wrap layers of at least N parameters")


def set_layer_wrapping_defaults(args: Any) -> None:
    """fairseq's defaults of :func:`add_layer_wrapping_args`' options, where unset, and its rule that
    ``--offload-activations`` sets ``--checkpoint-activations`` (as fairseq's ``transformer`` and
    ``transformer_lm`` architectures do)."""
    for name, default in (("checkpoint_activations", False), ("offload_activations", False),
                          ("min_params_to_wrap", int(1e8))):
        if getattr(args, name, None) is None:
            setattr(args, name, default)
    if args.offload_activations:
        args.checkpoint_activations = True


def wrap_layer(layer: nn.Module, cfg: Any) -> nn.Module:
    """Activation checkpointing and FSDP wrapping exactly as fairseq's ``build_*_layer`` do."""
    checkpoint = cfg.checkpoint_activations
    if checkpoint:
        layer = checkpoint_wrapper(layer, offload_to_cpu=cfg.offload_activations)
    min_params_to_wrap = cfg.min_params_to_wrap if not checkpoint else 0
    return fsdp_wrap(layer, min_num_params=min_params_to_wrap)


class SharedCopiesDifferError(UserError, ValueError):
    """Weights from before the side owned a shared module, whose layers hold different copies of it."""


def upgrade_shared(side: nn.Module, state_dict: Dict[str, Tensor], name: str) -> None:
    """Weights saved when every layer registered the side's shared modules (e.g. T5's table under
    ``layers.{i}.self_attn.additive_terms.{j}.table``): keep the first layer's copy, under
    ``{name}.position_shared``, after checking that every layer's copy equals it, and drop the others.
    Each term that reads a side-wide module names its earlier keys (``legacy_keys()``)."""
    prefix = f"{name}." if name else ""
    for key, copies in legacy_copies(side, prefix).items():
        found = [copy for copy in copies if copy in state_dict]
        if not found:
            continue
        first = state_dict[found[0]]
        for copy in found[1:]:
            if not torch.equal(state_dict[copy], first):
                raise SharedCopiesDifferError(
                    f"the checkpoint's {copy} differs from {found[0]}: these weights were not saved from "
                    f"one table shared by the layers, so they cannot become the side's {key}")
        state_dict[key] = first
        for copy in found:
            del state_dict[copy]


def upgrade_input_embedding(side: nn.Module, state_dict: Dict[str, Tensor], name: str) -> None:
    """Weights saved when the side's input position embedding was registered under another name (its
    ``legacy_names``): their keys move under ``{name}.position_input``."""
    module = getattr(side, "position_input", None)
    if module is None:
        return
    prefix = f"{name}." if name else ""
    for legacy in module.legacy_names:
        old = f"{prefix}{legacy}."
        for key in [key for key in state_dict if key.startswith(old)]:
            state_dict[f"{prefix}position_input.{key[len(old):]}"] = state_dict.pop(key)


def is_method_key(key: str) -> bool:
    """Whether a state-dict key (relative to its side) belongs to the side's position method (:data:`METHOD_MODULES`)."""
    return not METHOD_MODULES.isdisjoint(key.split("."))


def adopt_method_weights(side: nn.Module, state_dict: Dict[str, Tensor], name: str, flag: str) -> None:
    """Fine-tuning one method into another (``--{side}-reset-position-options``): of the position method's tensors
    (:func:`is_method_key`), those the checkpoint and this side both hold with one shape load; this side's others
    keep the initialisation their method documents; the checkpoint's others are dropped. Each group is named in
    one log line. Every other tensor loads as fairseq loads it (a mismatch is still fairseq's error)."""
    prefix = f"{name}." if name else ""
    own = {prefix + key: tensor for key, tensor in side.state_dict().items() if is_method_key(key)}
    saved = [key for key in state_dict if key.startswith(prefix) and is_method_key(key[len(prefix):])]
    initialised = sorted(key for key, tensor in own.items()
                         if key not in state_dict or state_dict[key].shape != tensor.shape)
    dropped = sorted(key for key in saved if key not in own)
    parameters = {prefix + key for key, _ in side.named_parameters()}
    if optimizer_state_loads() and (parameters.intersection(initialised) or dropped):
        raise PositionOptionError(f"{flag}: the new method's parameters differ from the checkpoint's "
                                  f"({', '.join(initialised + dropped)}), so its optimizer state cannot be restored "
                                  "into them: add --reset-optimizer (--finetune-from-model resets it)")
    for key in initialised:
        state_dict[key] = own[key].detach().clone()
    for key in dropped:
        del state_dict[key]
    if initialised or dropped:
        logger.info("%s: %d of the position method's tensors loaded; initialised as the new method's: %s; dropped "
                    "from the checkpoint: %s", flag, len(own) - len(initialised), ", ".join(initialised) or "none",
                    ", ".join(dropped) or "none")


def legacy_copies(side: nn.Module, prefix: str) -> Dict[str, List[str]]:
    """Each shared module's key -> the keys its layers' copies had, in layer order (from the terms
    that read a shared module, by their ``legacy_keys()``)."""
    copies: Dict[str, List[str]] = {}
    for path, term in side.named_modules():
        if isinstance(term, PositionTerm):
            for old, new in term.legacy_keys().items():
                copies.setdefault(f"{prefix}position_shared.{new}", []).append(f"{prefix}{path}.{old}")
    return copies
