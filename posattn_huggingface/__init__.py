"""Position methods in Hugging Face transformers models: one call turns a Llama, GPT-2 or BERT model into the same
model with a position method, through transformers' own extension points (no patch of its functions).

:func:`apply_position_method` gives every self-attention module of the model its layer's method
(:func:`posattn.position_method`, all built from one :func:`posattn.position_options` of the model, so that
side-wide tables are shared), registered as the submodule ``position_method`` (saved, trained, moved with the
model), and switches the model to the attention implementation ``"posattn"``: a mask function registered with
``AttentionMaskInterface`` turns transformers' 2D padding mask into the batch's
:class:`~posattn.position_context.PositionContext` once per forward pass (every layer receives it as its
``attention_mask``), and an attention function registered with ``AttentionInterface`` computes each layer's
attention with its method. :func:`from_pretrained` loads a model that ``save_pretrained`` wrote with its method
(recorded in ``config.json``).

This package, beside the library and on top of it, imports transformers (the extra ``[hf]``); ``import posattn``
needs torch alone. docs/huggingface.md says what works and what is refused.
"""

import copy
import json
import logging
import os
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Tuple, Type

import torch
from torch import Tensor, nn

from posattn.attention import PositionKernel, token_values_key
from posattn.errors import UserError
from posattn.functional import batch_context
from posattn.position_context import CausalMask, PositionContext
from posattn.position_method import position_method
from posattn.position_options import SidePositionOptions, position_options, side_defaults

try:
    import transformers
    from transformers import AttentionInterface, PreTrainedModel
    from transformers.cache_utils import Cache, DynamicLayer
    from transformers.masking_utils import AttentionMaskInterface, bidirectional_mask_function, causal_mask_function
except ImportError as error:  # pragma: no cover - the extra is not installed
    raise ImportError("posattn_huggingface needs transformers 5: pip install 'fairseq-posattn[hf]'") from error

logger = logging.getLogger(__name__)

#: the name under which the attention and mask functions are registered (the model's ``attn_implementation``)
IMPLEMENTATION = "posattn"
#: the configuration's attribute (a key of ``config.json``) that records the model's method
CONFIG_RECORD = "posattn_position_method"
#: the submodule of each self-attention module that holds its layer's method
METHOD_ATTRIBUTE = "position_method"
#: the keyword arguments by which the forward pre-hook hands the attention function the layer input (for
#: token-difference terms), the layer's decoding state kept in the cache (:class:`DecodingStateLayer`) and whether
#: the call returns the attention weights (``output_attentions``)
LAYER_INPUT, DECODING_STATE, NEED_WEIGHTS = "posattn_layer_input", "posattn_decoding_state", "posattn_need_weights"


class HuggingFaceRefusal(UserError, ValueError):
    """A model, method or checkpoint that this front-end does not take; the message names what would work."""


@dataclass(frozen=True)
class Family:
    """What the front-end knows of one model family (a ``config.model_type``)."""

    name: str
    causal: bool
    #: the class name of its self-attention modules
    attention_class: str
    #: the configuration's attention dropout probability
    dropout_field: str
    #: turns the model's own positions off and says which they were
    turn_off_positions: Callable[[PreTrainedModel], str]


class UnrotatedPositions(nn.Module):
    """Llama's position embedding module made the identity: ``cos = 1``, ``sin = 0`` of the shape it returns
    (``(batch, length, head_dim)``), so that ``q * cos + rotate_half(q) * sin`` is ``q`` exactly."""

    def __init__(self, head_dim: int):
        super().__init__()
        self.head_dim = head_dim

    def forward(self, x: Tensor, position_ids: Tensor) -> Tuple[Tensor, Tensor]:
        shape = (*position_ids.shape, self.head_dim)
        return (torch.ones(shape, dtype=x.dtype, device=x.device),
                torch.zeros(shape, dtype=x.dtype, device=x.device))


def _unrotate_llama(model: PreTrainedModel) -> str:
    base = model.base_model
    base.rotary_emb = UnrotatedPositions(_head_dim(model.config))
    return "the query/key rotation (RoPE) made the identity"


def _zero_embedding(embedding: nn.Embedding) -> None:
    """An absolute position embedding that adds nothing: zero and frozen (its state-dict key stays)."""
    with torch.no_grad():
        embedding.weight.zero_()
    embedding.weight.requires_grad_(False)


def _zero_gpt2_positions(model: PreTrainedModel) -> str:
    _zero_embedding(model.base_model.wpe)
    return "the learned absolute position embedding (wpe) zeroed and frozen"


def _zero_bert_positions(model: PreTrainedModel) -> str:
    _zero_embedding(model.base_model.embeddings.position_embeddings)
    return "the absolute position embedding (embeddings.position_embeddings) zeroed and frozen"


FAMILIES: Dict[str, Family] = {
    "llama": Family("Llama", True, "LlamaAttention", "attention_dropout", _unrotate_llama),
    "gpt2": Family("GPT-2", True, "GPT2Attention", "attn_pdrop", _zero_gpt2_positions),
    "bert": Family("BERT", False, "BertSelfAttention", "attention_probs_dropout_prob", _zero_bert_positions),
}


# ----------------------------------------------------------------- the one call
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
            the model computes what the Hugging Face model computes.

    Returns:
        ``model``, switched to ``attn_implementation="posattn"``, its method recorded in ``model.config`` (so
        ``save_pretrained`` writes it to config.json; :func:`from_pretrained` loads it).

    Raises:
        HuggingFaceRefusal: an unsupported model or configuration, an option the model's side does not take, a
            method this front-end cannot run on it yet; :class:`posattn.PositionOptionError`: an option value
            that :func:`posattn.position_options` refuses (its message).
    """
    family = family_of(model)
    if getattr(model.config, CONFIG_RECORD, None) is not None:
        raise HuggingFaceRefusal(
            f"this model already has a position method ({_describe(getattr(model.config, CONFIG_RECORD))}); a "
            "saved one is loaded with posattn_huggingface.from_pretrained(model_class, path)")
    if max_positions is None:
        max_positions = model.config.max_position_embeddings
    record = {"options": dict(options), "max_positions": max_positions, "keep_model_positions": keep_model_positions}
    _attach(model, family, record)
    return model


def family_of(model: PreTrainedModel) -> Family:
    """The model's :class:`Family`; refuses another model type and configurations the front-end does not take."""
    config = model.config
    family = FAMILIES.get(getattr(config, "model_type", None))
    if family is None:
        raise HuggingFaceRefusal(f"posattn_huggingface takes Llama, GPT-2 and BERT models (model_type "
                                 f"{', '.join(FAMILIES)}), not {type(model).__name__} "
                                 f"(model_type {getattr(config, 'model_type', None)!r})")
    if getattr(config, "add_cross_attention", False) or (not family.causal and getattr(config, "is_decoder", False)):
        raise HuggingFaceRefusal(f"posattn_huggingface takes {family.name} as a "
                                 f"{'decoder' if family.causal else 'bidirectional encoder'} without "
                                 "cross-attention (is_decoder=False, add_cross_attention=False)")
    return family


def _attach(model: PreTrainedModel, family: Family, record: Dict[str, Any]) -> None:
    """Give every self-attention module its layer's method, register the functions, switch the model, turn off
    its positions where the method replaces them, and record the method in its configuration."""
    options = side_options(family, record["max_positions"], record["options"])
    _own_config(model)
    attention_modules = [module for module in model.modules() if type(module).__name__ == family.attention_class]
    dropout = float(getattr(model.config, family.dropout_field, 0.0) or 0.0)
    methods = [_layer_method(model.config, options, index, dropout) for index in range(len(attention_modules))]
    for module, method in zip(attention_modules, methods):
        parameter = next(module.parameters())
        method.to(device=parameter.device, dtype=parameter.dtype).train(module.training)
        setattr(module, METHOD_ATTRIBUTE, method)
        module.register_forward_pre_hook(pass_input_and_state, with_kwargs=True)
    register_functions()
    model.set_attn_implementation(IMPLEMENTATION)
    if options.needs_context() and not record["keep_model_positions"]:
        turned_off = family.turn_off_positions(model)
        logger.info("posattn: %s replaces the model's own positions: %s (keep them: keep_model_positions=True)",
                    _describe(record), turned_off)
    setattr(model.config, CONFIG_RECORD, record)


def _own_config(model: PreTrainedModel) -> None:
    """Give ``model`` (and its modules that hold it) a copy of its configuration: the switch changes it (the
    attention implementation, the record), and another model built from the same configuration object must not
    change with it."""
    shared = model.config
    own = copy.deepcopy(shared)
    for module in model.modules():
        if getattr(module, "config", None) is shared:
            module.config = own


def _head_dim(config: Any) -> int:
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


def _layer_method(config: Any, options: SidePositionOptions, index: int, dropout: float) -> PositionKernel:
    method = position_method(config.num_attention_heads, _head_dim(config), causal=options.causal,
                             dropout=dropout, options=options, layer_index=index)
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


def _describe(record: Dict[str, Any]) -> str:
    options = ", ".join(f"{name}={value!r}" for name, value in sorted(record["options"].items()))
    return f"position options ({options or 'none'})"


# ----------------------------------------------------------------- the layer input and the decoding state
def reads_layer_input(method: PositionKernel) -> bool:
    """Whether the layer's method reads the attention module's input (a token-difference term: FoX's gates)."""
    return len(method.token_difference_terms) > 0


def keeps_decoding_state(method: PositionKernel) -> bool:
    """Whether decoding with the method keeps more than the keys and values: the rows a post-softmax transform
    continues from, the token-difference terms' values, the keys a query/key transform transformed (the cache
    holds them untransformed)."""
    return method.post_softmax_term is not None or reads_layer_input(method) or len(method.query_key_terms) > 0


def pass_input_and_state(module: nn.Module, args: Tuple[Any, ...],
                         kwargs: Dict[str, Any]) -> Tuple[Tuple[Any, ...], Dict[str, Any]]:
    """The forward pre-hook of every switched self-attention module: its keyword arguments, which the module hands
    on to the attention function, say whether the call returns the attention weights (:data:`NEED_WEIGHTS`: GPT-2's
    module keeps ``output_attentions`` to itself) and, where the method needs them, get the layer input ``(batch,
    length, hidden)`` (:data:`LAYER_INPUT`) and, with a cache, the layer's decoding state (:data:`DECODING_STATE`)."""
    method = getattr(module, METHOD_ATTRIBUTE)
    kwargs[NEED_WEIGHTS] = bool(kwargs.get("output_attentions"))
    if reads_layer_input(method):
        kwargs[LAYER_INPUT] = args[0] if args else kwargs["hidden_states"]
    cache = kwargs.get("cache")
    if cache is not None and keeps_decoding_state(method):
        kwargs[DECODING_STATE] = decoding_state_layer(cache, module.layer_idx).state
    return args, kwargs


class DecodingStateLayer(DynamicLayer):
    """A :class:`~transformers.cache_utils.DynamicLayer` that also holds the layer's decoding state beyond its
    keys and values (``state``: the kernel's batch-first tensors, :mod:`posattn.attention`), reordered, repeated
    and selected with them (beam search, contrastive search)."""

    def __init__(self) -> None:
        super().__init__()
        self.state: Dict[str, Tensor] = {}

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        super().reorder_cache(beam_idx)
        self.state = {name: t.index_select(0, beam_idx.to(t.device)) for name, t in self.state.items()}

    def batch_repeat_interleave(self, repeats: int) -> None:
        super().batch_repeat_interleave(repeats)
        self.state = {name: t.repeat_interleave(repeats, dim=0) for name, t in self.state.items()}

    def batch_select_indices(self, indices: Tensor) -> None:
        super().batch_select_indices(indices)
        self.state = {name: t[indices, ...] for name, t in self.state.items()}

    def crop(self, tokens_to_remove: int) -> None:
        """Cut the last ``-tokens_to_remove`` tokens (assisted decoding): the transformed keys and the
        token-difference terms' values are cut with the keys; a convolution's rows cannot be (refused)."""
        if tokens_to_remove and "prev_attn_rows" in self.state:
            raise HuggingFaceRefusal("a convolution's decoding state (its last attention rows) cannot be cut back to "
                                     "fewer tokens: no assisted or speculative decoding with it (generate without "
                                     "an assistant model)")
        super().crop(tokens_to_remove)
        if tokens_to_remove:
            self.state = {name: t[:, :, :tokens_to_remove] if name == "prev_key" else t[..., :tokens_to_remove]
                          for name, t in self.state.items()}

    def reset(self) -> None:
        super().reset()
        self.state = {}


def decoding_state_layer(cache: Cache, layer_idx: int) -> DecodingStateLayer:
    """The cache's layer ``layer_idx`` as a :class:`DecodingStateLayer`: an empty ``DynamicLayer`` (the one
    ``DynamicCache`` made, or none yet) is replaced by one; a layer of another kind, or one filled without the
    method's state, is refused."""
    layers = getattr(cache, "layers", None)
    if layers is None or len(layers) < layer_idx:
        raise HuggingFaceRefusal(f"a {type(cache).__name__} without its layers: posattn_huggingface decodes with "
                                 "a DynamicCache (the default)")
    if len(layers) == layer_idx:
        layers.append(DecodingStateLayer())
    layer = layers[layer_idx]
    if isinstance(layer, DecodingStateLayer):
        return layer
    if type(layer) is not DynamicLayer or layer.get_seq_length():
        raise HuggingFaceRefusal(f"the cache's layer {layer_idx} ({type(layer).__name__}, "
                                 f"{layer.get_seq_length()} tokens) cannot hold the position method's decoding "
                                 "state: decode with a DynamicCache (the default) that the model filled")
    layers[layer_idx] = DecodingStateLayer()
    return layers[layer_idx]


# ----------------------------------------------------------------- the registered functions
def register_functions() -> None:
    """Register the attention and mask functions under :data:`IMPLEMENTATION` (once; registering again replaces
    them with the same functions)."""
    AttentionInterface.register(IMPLEMENTATION, method_attention)
    AttentionMaskInterface.register(IMPLEMENTATION, batch_positions)


def batch_positions(batch_size: int, q_length: int, kv_length: int, q_offset: Any = 0, kv_offset: int = 0,
                    mask_function: Optional[Callable[..., Any]] = None, attention_mask: Optional[Tensor] = None,
                    device: Optional[torch.device] = None, **_: Any) -> PositionContext:
    """The mask function: the batch's :class:`PositionContext`, built once per forward pass for every layer.

    Args:
        batch_size, q_length, kv_length: the batch, its current tokens and every key (the cached ones too).
        q_offset, kv_offset: where the queries and keys start (a dynamic cache: the past length, 0).
        mask_function: transformers' causal or bidirectional mask (any other one, a packed-sequence mask, is
            refused).
        attention_mask: ``(batch, kv_length)`` bool, True at tokens (transformers' padding mask), or None.
    """
    causal = _causality(mask_function)
    if not isinstance(q_offset, int) or kv_offset != 0 or q_offset + q_length != kv_length:
        raise HuggingFaceRefusal("posattn_huggingface takes a DynamicCache (the default) or no cache: the queries "
                                 "must be the last tokens of the keys")
    if attention_mask is None:
        return batch_context(None, causal, kv_length, device)
    if attention_mask.shape != (batch_size, kv_length):
        raise HuggingFaceRefusal(f"an attention_mask of shape {tuple(attention_mask.shape)} for {batch_size} "
                                 f"sequences of {kv_length} tokens: give the 2D padding mask (1 at tokens)")
    return batch_context(~attention_mask.bool(), causal)


def _causality(mask_function: Optional[Callable[..., Any]]) -> bool:
    if mask_function is causal_mask_function:
        return True
    if mask_function is bidirectional_mask_function:
        return False
    raise HuggingFaceRefusal("posattn_huggingface takes transformers' plain causal or bidirectional masks, not "
                             f"{getattr(mask_function, '__name__', mask_function)} (packed sequences: give an "
                             "attention_mask, one sequence per row)")


def method_attention(module: nn.Module, query: Tensor, key: Tensor, value: Tensor, attention_mask: Any,
                     scaling: Optional[float] = None, dropout: float = 0.0,
                     **kwargs: Any) -> Tuple[Tensor, Optional[Tensor]]:
    """The attention function: the layer's method on ``query`` over every key.

    Args:
        module: the self-attention module, holding its method (:data:`METHOD_ATTRIBUTE`).
        query: ``(batch, heads, q_len, head_dim)`` of the current tokens, not scaled.
        key, value: ``(batch, kv_heads, kv_len, head_dim)`` of every key, the cache's first (grouped heads are
            repeated).
        attention_mask: the batch's context (:func:`batch_positions`).
        scaling: the logits' scale (``head_dim ** -0.5``; GPT-2's may divide it by the layer's number), applied to
            ``query`` before the kernel, which takes ``q`` scaled.
        dropout: transformers' attention dropout; the method's own (the configuration's, in training) applies.
        kwargs: from :func:`pass_input_and_state`: whether to return the weights (:data:`NEED_WEIGHTS`), the layer
            input ``(batch, q_len, hidden)`` (:data:`LAYER_INPUT`) and the cache's decoding state of the layer
            (:data:`DECODING_STATE`), read and updated.

    Returns:
        the output ``(batch, q_len, heads, head_dim)`` and, where ``output_attentions`` asks for them, the weights
        that multiply V ``(batch, heads, q_len, kv_len)`` (after a post-softmax transform; the explicit path);
        else None.
    """
    method = getattr(module, METHOD_ATTRIBUTE, None)
    if method is None:
        raise HuggingFaceRefusal(f"{type(module).__name__} has no position method: switch the model with "
                                 "posattn_huggingface.apply_position_method")
    ctx = attention_mask
    if not isinstance(ctx, PositionContext) or ctx.length != key.size(2):
        raise HuggingFaceRefusal(f"{method.where}: the attention mask is not the batch's position context of "
                                 f"{key.size(2)} keys (a 4D mask given to the model is not taken)")
    method.side_options.check_length(ctx.length)
    groups = query.size(1) // key.size(1)
    if groups > 1:
        key, value = key.repeat_interleave(groups, dim=1), value.repeat_interleave(groups, dim=1)
    tgt_len = query.size(2)
    past = key.size(2) - tgt_len
    kept: Optional[Dict[str, Tensor]] = kwargs.get(DECODING_STATE)
    layer_input = kwargs.get(LAYER_INPUT)
    x = None if layer_input is None else layer_input.transpose(0, 1)
    attn_mask = ctx.prepared(CausalMask(tgt_len, ctx.length, query.dtype)) if ctx.causal and tgt_len > 1 else None
    scale = query.size(-1) ** -0.5 if scaling is None else scaling
    need_weights = bool(kwargs.get(NEED_WEIGHTS))
    if kept is None:  # nothing kept beside the keys and values: every key as the cache joined them, joined once
        state = {} if past else None
        out, _, weights = method.attend(query * scale, key, value, ctx, attn_mask, state, x, need_weights=need_weights)
        return out.transpose(1, 2).contiguous(), weights if need_weights else None
    state = _decoding_state(method, key[:, :, :past], value[:, :, :past], kept)
    out, _, weights = method.attend(query * scale, key[:, :, past:], value[:, :, past:], ctx, attn_mask, state, x,
                                    need_weights=need_weights)
    transformed_keys = len(method.query_key_terms) > 0
    kept.update((name, tensor) for name, tensor in state.items()
                if name != "prev_value" and (name != "prev_key" or transformed_keys))
    return out.transpose(1, 2).contiguous(), weights if need_weights else None


def _decoding_state(method: PositionKernel, keys: Tensor, values: Tensor,
                    kept: Dict[str, Tensor]) -> Dict[str, Tensor]:
    """The kernel's decoding state of this call: the state the cache keeps beside its keys and values (``kept``:
    a query/key transform's keys transformed when they were the current ones, once) and the cached tokens' values
    and (untransformed where no term transforms them) keys."""
    state = dict(kept)
    if keys.size(2):
        missing = [name for name in _kept_names(method) if name not in state]
        if missing:
            raise HuggingFaceRefusal(f"{method.where}: the cache lacks the decoding state {', '.join(missing)} of its "
                                     f"{keys.size(2)} tokens (filled without the position method)")
        state.setdefault("prev_key", keys)
        state["prev_value"] = values
    return state


def _kept_names(method: PositionKernel) -> List[str]:
    """The names of the decoding state a cache keeps for ``method`` beside its keys and values."""
    names = ["prev_attn_rows"] if method.post_softmax_term is not None else []
    names += ["prev_key"] if len(method.query_key_terms) else []
    return names + [token_values_key(i) for i in range(len(method.token_difference_terms))]


# ----------------------------------------------------------------- loading
def from_pretrained(model_class: Type[PreTrainedModel], path: str, *, expected_options: Optional[Dict[str, Any]] = None,
                    **load_kwargs: Any) -> PreTrainedModel:
    """Load a model that ``save_pretrained`` wrote after :func:`apply_position_method`, with its method.

    Args:
        model_class: the class to load (``LlamaForCausalLM``, ``BertModel``, ...).
        path: the folder ``save_pretrained`` wrote.
        expected_options: the method the caller expects (``position_options``' names); another recorded one is
            refused. None: the recorded one.
        load_kwargs: ``model_class.from_pretrained``'s other arguments (``dtype``, ...).

    Raises:
        HuggingFaceRefusal: the folder records no method, or another than ``expected_options``, or its weights
            lack some of the method's.
    """
    config = model_class.config_class.from_pretrained(path)
    record = getattr(config, CONFIG_RECORD, None)
    if record is None:
        raise HuggingFaceRefusal(f"{path} was saved without a position method: load it with "
                                 f"{model_class.__name__}.from_pretrained (apply_position_method to fine-tune it)")
    if expected_options is not None and dict(expected_options) != record["options"]:
        raise HuggingFaceRefusal(f"{path} was saved with {_describe(record)}, not "
                                 f"{_describe(dict(record, options=expected_options))}")
    delattr(config, CONFIG_RECORD)
    verbosity = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_error()  # the method's weights are loaded below, not by transformers
    try:
        model = model_class.from_pretrained(path, config=config, **load_kwargs)
    finally:
        transformers.logging.set_verbosity(verbosity)
    _attach(model, family_of(model), record)
    _load_method_weights(model, path)
    return model


def _load_method_weights(model: PreTrainedModel, path: str) -> None:
    """Load the methods' parameters and buffers from the folder's safetensors files; refuse if some are absent."""
    from safetensors.torch import load_file

    wanted = {name for name in model.state_dict() if f".{METHOD_ATTRIBUTE}." in name}
    found: Dict[str, Tensor] = {}
    for file in _weight_files(path):
        found.update({name: tensor for name, tensor in load_file(file).items() if name in wanted})
    missing = sorted(wanted - set(found))
    if missing:
        raise HuggingFaceRefusal(f"{path} lacks {len(missing)} of the method's tensors ({missing[0]}, ...): it "
                                 "was saved with another method or without one")
    model.load_state_dict(found, strict=False)


def _weight_files(path: str) -> List[str]:
    """The folder's safetensors files (one, or the shards its index names)."""
    index = os.path.join(path, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index, encoding="utf-8") as f:
            shards = sorted(set(json.load(f)["weight_map"].values()))
        return [os.path.join(path, shard) for shard in shards]
    return [os.path.join(path, "model.safetensors")]
