"""Switching a model: every self-attention module gets its layer's method, the model the attention implementation
:data:`~posattn_huggingface.names.IMPLEMENTATION`, its own positions turned off where the method replaces them, and
its configuration the record of the method."""

import copy
import logging
from typing import Any, Dict, Optional

from transformers import AttentionInterface, PreTrainedModel
from transformers.masking_utils import AttentionMaskInterface

from posattn.attention import PositionKernel
from posattn.position_method import position_method
from posattn.position_options import SidePositionOptions, position_options, side_defaults
from posattn_huggingface.attention_function import method_attention, pass_input_and_state
from posattn_huggingface.families import Family, family_of, head_dim
from posattn_huggingface.mask_function import batch_positions
from posattn_huggingface.names import CONFIG_RECORD, IMPLEMENTATION, IMPLEMENTATION_KEY, METHOD_ATTRIBUTE, \
    HuggingFaceRefusal

logger = logging.getLogger("posattn_huggingface")


def apply_position_method(model: PreTrainedModel, *, keep_model_positions: bool = False,
                          max_positions: Optional[int] = None, **options: Any) -> PreTrainedModel:
    """Turn ``model`` (Llama, GPT-2 or BERT, any head) into the same model with a position method, in place.

    Args:
        model: a ``transformers`` model of ``model_type`` ``llama``, ``gpt2`` or ``bert``.
        keep_model_positions: keep the model's own positions beside the method (by default a method turns them
            off: Llama's rotation made the identity, GPT-2's ``wpe`` and BERT's absolute embeddings zeroed and
            frozen; said in one log line).
        max_positions: t, the longest sequence that terms keeping parameters per position take (default: the
            configuration's ``max_position_embeddings``).
        options: the method's options, as :func:`posattn.position_options` takes them (docs/methods.md); none:
            the model computes what the Hugging Face model computes. With ``layer_methods``, the self-attention
            modules are layers 0, 1, ... in the model's order.

    Returns:
        ``model``, switched to ``attn_implementation="posattn_huggingface"``, its method and that implementation
        recorded in ``model.config`` (so ``save_pretrained`` writes them to config.json;
        :func:`~posattn_huggingface.loading.from_pretrained` loads it, transformers' own ``from_pretrained`` refuses
        it without this package).

    Raises:
        HuggingFaceRefusal: an unsupported model or configuration, an option the model's side does not take, a
            method this front-end cannot run on it yet; :class:`posattn.PositionOptionError`: an option value
            that :func:`posattn.position_options` refuses (its message).
    """
    family = family_of(model)
    if getattr(model.config, CONFIG_RECORD, None) is not None:
        raise HuggingFaceRefusal(
            f"this model already has a position method ({describe(getattr(model.config, CONFIG_RECORD))}); a "
            "saved one is loaded with posattn_huggingface.from_pretrained(model_class, path)")
    if max_positions is None:
        max_positions = model.config.max_position_embeddings
    record = {"options": dict(options), "max_positions": max_positions, "keep_model_positions": keep_model_positions}
    attach(model, family, record)
    return model


def attach(model: PreTrainedModel, family: Family, record: Dict[str, Any]) -> None:
    """Give every self-attention module its layer's method, register the functions, switch the model, turn off
    its positions where the method replaces them, and record the method in its configuration."""
    options = side_options(family, record["max_positions"], record["options"])
    _own_config(model)
    attention_modules = [module for module in model.modules() if type(module).__name__ == family.attention_class]
    options.check_layer_count(len(attention_modules))  # layer_methods: a method named past the model's layers
    dropout = float(getattr(model.config, family.dropout_field, 0.0) or 0.0)
    methods = [_layer_method(model.config, options, index, dropout) for index in range(len(attention_modules))]
    for module, method in zip(attention_modules, methods):
        family.adapt_layer(module, method)  # what the module brings beside q, k, v (Gemma's soft-capping)
        parameter = next(module.parameters())
        method.to(device=parameter.device, dtype=parameter.dtype).train(module.training)
        setattr(module, METHOD_ATTRIBUTE, method)
        module.register_forward_pre_hook(pass_input_and_state, with_kwargs=True)
    register_functions()
    model.set_attn_implementation(IMPLEMENTATION)
    if options.needs_context() and not record["keep_model_positions"]:
        turned_off = family.turn_off_positions(model)
        logger.info("posattn: %s replaces the model's own positions: %s (keep them: keep_model_positions=True)",
                    describe(record), turned_off)
    setattr(model.config, CONFIG_RECORD, record)
    # written to config.json: transformers' own from_pretrained asks for the implementation, which is refused
    # where this package has not registered it, and a module without its method refuses the call where it has
    setattr(model.config, IMPLEMENTATION_KEY, IMPLEMENTATION)


def register_functions() -> None:
    """Register the attention and mask functions under :data:`IMPLEMENTATION` (once; registering again replaces
    them with the same functions)."""
    AttentionInterface.register(IMPLEMENTATION, method_attention)
    AttentionMaskInterface.register(IMPLEMENTATION, batch_positions)


def _own_config(model: PreTrainedModel) -> None:
    """Give ``model`` (and its modules that hold it) a copy of its configuration: the switch changes it (the
    attention implementation, the record), and another model built from the same configuration object must not
    change with it."""
    shared = model.config
    own = copy.deepcopy(shared)
    for module in model.modules():
        if getattr(module, "config", None) is shared:
            module.config = own


def _layer_method(config: Any, options: SidePositionOptions, index: int, dropout: float) -> PositionKernel:
    method = position_method(config.num_attention_heads, head_dim(config), causal=options.causal,
                             dropout=dropout, options=options, layer_index=index)
    if method.projection_term is not None:
        raise HuggingFaceRefusal(
            f"{type(method.projection_term).__name__} rescales the projection weights W_q, W_k, W_v, which "
            "transformers applies before the attention function this package switches: it would have no effect; "
            "use it in fairseq (fairseq_posattn) or plain PyTorch (posattn.SelfAttention)")
    method.side_options = options  # the side's options, for the length check of each forward pass
    return method


def side_options(family: Family, max_positions: int, options: Dict[str, Any]) -> SidePositionOptions:
    """The model's one :class:`~posattn.position_options.SidePositionOptions` (its layers share its side-wide
    modules); refuses options of the other side only, and methods that need what Hugging Face batches lack."""
    side, other = ("decoder", "encoder") if family.causal else ("encoder", "decoder")
    unknown = sorted(set(options) - set(side_defaults(side)))
    other_side_only = [name for name in unknown if name in side_defaults(other)]
    if other_side_only:
        kind, taker = ("encoders", "an encoder (BERT)") if family.causal else ("causal models",
                                                                              "a causal model (Llama, GPT-2)")
        raise HuggingFaceRefusal(f"{', '.join(other_side_only)}: an option of {kind} only, which {family.name} is "
                                 f"not; {taker} takes it")
    if unknown:
        raise HuggingFaceRefusal(f"no position option {', '.join(unknown)}; the options are position_options' "
                                 "(docs/methods.md)")
    built = position_options(family.causal, max_positions, **options)
    for asked_by, data in built.side_data():
        raise HuggingFaceRefusal(f"{asked_by} needs {data.what} with every batch, which Hugging Face batches do not "
                                 "carry; use the fairseq front-end (fairseq_posattn) for it")
    if built.input_embedding(1, 0, True) is not None:
        raise HuggingFaceRefusal("the options replace the input's position embedding, which posattn_huggingface "
                                 "does not do yet; use the fairseq front-end (fairseq_posattn) for them")
    return built


def describe(record: Dict[str, Any]) -> str:
    """The recorded method in words: its options."""
    options = ", ".join(f"{name}={value!r}" for name, value in sorted(record["options"].items()))
    return f"position options ({options or 'none'})"
