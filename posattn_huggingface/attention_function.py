"""The attention function registered with ``AttentionInterface``: each layer's attention computed with its method,
and the forward pre-hook that hands it what q, k and v do not carry."""

from typing import Any, Dict, Optional, Tuple, Union

from torch import Tensor, nn
from transformers.cache_utils import Cache, StaticLayer

from posattn.attention import PositionKernel
from posattn.position_context import PositionContext
from posattn_huggingface.compatibility import cache_argument
from posattn_huggingface.decoding_state import DecodingStateLayer, attend_with_cache, decoding_state_layer, \
    keeps_decoding_state, reads_layer_input
from posattn_huggingface.layer_features import check_soft_cap, full_cache_layer, windowed
from posattn_huggingface.mask_function import BatchPositions
from posattn_huggingface.names import DECODING_STATE, LAYER_INPUT, METHOD_ATTRIBUTE, NEED_WEIGHTS, \
    HuggingFaceRefusal
from posattn_huggingface.static_cache import StaticDecodingStateLayer, attend_static_prompt, attend_static_step, \
    static_state_layer


def pass_input_and_state(module: nn.Module, args: Tuple[Any, ...],
                         kwargs: Dict[str, Any]) -> Tuple[Tuple[Any, ...], Dict[str, Any]]:
    """The forward pre-hook of every switched self-attention module: its keyword arguments, which the module hands
    on to the attention function, say whether the call returns the attention weights (:data:`NEED_WEIGHTS`: GPT-2's
    module keeps ``output_attentions`` to itself) and, where the method needs them, get the layer input ``(batch,
    length, hidden)`` (:data:`LAYER_INPUT`) and, with a cache, the cache's layer that keeps the method's decoding
    state (:data:`DECODING_STATE`), which the module's cache update then fills."""
    method = getattr(module, METHOD_ATTRIBUTE)
    kwargs[NEED_WEIGHTS] = bool(kwargs.get("output_attentions"))
    if reads_layer_input(method):
        kwargs[LAYER_INPUT] = args[0] if args else kwargs["hidden_states"]
    cache = cache_argument(kwargs)
    if cache is not None:
        full_cache_layer(cache, module.layer_idx)  # a sliding window's layer keeps every key (layer_features)
    if cache is not None and keeps_decoding_state(method):
        kwargs[DECODING_STATE] = _state_layer(method, cache, module.layer_idx)
    return args, kwargs


def _state_layer(method: PositionKernel, cache: Cache,
                 layer_idx: int) -> Union[DecodingStateLayer, StaticDecodingStateLayer]:
    """The cache's layer ``layer_idx``, made one that keeps ``method``'s decoding state: a static cache's
    (:func:`~posattn_huggingface.static_cache.static_state_layer`), else a dynamic one's
    (:func:`~posattn_huggingface.decoding_state.decoding_state_layer`)."""
    layers = getattr(cache, "layers", None)
    if layers is not None and layer_idx < len(layers) and isinstance(layers[layer_idx], StaticLayer):
        layers[layer_idx] = static_state_layer(method, layers[layer_idx])
        return layers[layer_idx]
    return decoding_state_layer(cache, layer_idx)


def method_attention(module: nn.Module, query: Tensor, key: Tensor, value: Tensor, attention_mask: Any,
                     scaling: Optional[float] = None, dropout: float = 0.0,
                     **kwargs: Any) -> Tuple[Tensor, Optional[Tensor]]:
    """The attention function: the layer's method on ``query`` over every key.

    Args:
        module: the self-attention module, holding its method (:data:`METHOD_ATTRIBUTE`).
        query: ``(batch, heads, q_len, head_dim)`` of the current tokens, not scaled.
        key, value: ``(batch, kv_heads, kv_len, head_dim)`` of every key, the cache's first (grouped heads are
            repeated); the current tokens' alone where the cache's layer keeps the method's decoding state (a
            :class:`~posattn_huggingface.decoding_state.DecodingStateLayer`, which the kernel's state joins them to).
        attention_mask: the batch's context (:func:`~posattn_huggingface.mask_function.batch_positions`; with a
            static cache, made before the forward pass).
        scaling: the logits' scale (``head_dim ** -0.5``; GPT-2's may divide it by the layer's number), applied to
            ``query`` before the kernel, which takes ``q`` scaled.
        dropout: transformers' attention dropout; the method's own (the configuration's, in training) applies.
        kwargs: from :func:`pass_input_and_state`: whether to return the weights (:data:`NEED_WEIGHTS`), the layer
            input ``(batch, q_len, hidden)`` (:data:`LAYER_INPUT`) and the cache's layer that keeps the method's
            decoding state (:data:`DECODING_STATE`), read and updated; from the module: its sliding window
            (``sliding_window``, composed: the kernel's explicit path on a windowed context) and its logit
            soft-capping (``softcap``, its method's: :mod:`~posattn_huggingface.layer_features`).

    Returns:
        the output ``(batch, q_len, heads, head_dim)`` and, where ``output_attentions`` asks for them, the weights
        that multiply V ``(batch, heads, q_len, kv_len)`` (after a post-softmax transform; the explicit path);
        else None.
    """
    method = getattr(module, METHOD_ATTRIBUTE, None)
    if method is None:
        raise HuggingFaceRefusal(f"{type(module).__name__} has no position method: a folder saved with one loads "
                                 "with posattn_huggingface.from_pretrained(model_class, path), a model is switched "
                                 "with posattn_huggingface.apply_position_method")
    layer = kwargs.get(DECODING_STATE)
    ctx = _checked_context(method, attention_mask, key.size(2), layer)
    check_soft_cap(method, kwargs.get("softcap"))
    window = kwargs.get("sliding_window")
    if window is not None:
        ctx = windowed(ctx, window, method.where)
    groups = query.size(1) // key.size(1)
    if groups > 1:
        key, value = key.repeat_interleave(groups, dim=1), value.repeat_interleave(groups, dim=1)
    layer_input = kwargs.get(LAYER_INPUT)
    x = None if layer_input is None else layer_input.transpose(0, 1)
    if scaling is not None and scaling != query.size(-1) ** -0.5:
        check_unscaled_query(method, scaling, query.size(-1))
    q = query * (query.size(-1) ** -0.5 if scaling is None else scaling)
    need_weights = bool(kwargs.get(NEED_WEIGHTS))
    if not isinstance(ctx, BatchPositions):
        out, weights = attend_with_cache(method, q, key, value, ctx, layer, x, need_weights,
                                         kernel="explicit" if window is not None else None)
    elif ctx.step_index is not None:  # a decoding step over a static cache's buffers
        out, weights = attend_static_step(method, q, key, value, ctx, layer, x, need_weights)
    elif layer is not None:
        out, weights = attend_static_prompt(method, q, key, value, ctx, layer, x, need_weights)
    else:  # the buffers' filled part
        out, weights = attend_with_cache(method, q, key[:, :, :ctx.length], value[:, :, :ctx.length], ctx, None, x,
                                         need_weights)
    return out.transpose(1, 2).contiguous(), weights if need_weights else None


def check_unscaled_query(method: PositionKernel, scaling: float, head_dim: int) -> None:
    """Refuse a transform that reads the projected query (undoing ``1/sqrt(head_dim)``) in a model that scales its
    logits by another ``scaling`` (GPT-2's per-layer scale, Gemma's ``query_pre_attn_scalar``): it would read a
    query of another size."""
    for term in method.query_key_terms:
        if term.reads_unscaled_query:
            raise HuggingFaceRefusal(
                f"{method.where}: {type(term).__name__} reads the projected query, undoing the scale "
                f"1/sqrt({head_dim}), but this model scales its logits by {scaling:.6g}: use a configuration with "
                "the standard 1/sqrt(head_dim) scale (GPT-2 without scale_attn_by_inverse_layer_idx, Gemma with "
                "query_pre_attn_scalar = head_dim)")


def _checked_context(method: PositionKernel, attention_mask: Any, keys: int,
                     layer: Optional[Union[DecodingStateLayer, StaticDecodingStateLayer]]) -> PositionContext:
    """The batch's context as the mask function made it, for the call's ``keys``, within the method's length."""
    ctx = attention_mask
    if not isinstance(ctx, PositionContext) or keys != _keys_of(ctx, layer):
        raise HuggingFaceRefusal(f"{method.where}: the attention mask is not the batch's position context of "
                                 f"{keys} keys (a 4D mask given to the model is not taken)")
    method.side_options.check_length(ctx.length)
    return ctx


def _keys_of(ctx: PositionContext, layer: Optional[Union[DecodingStateLayer, StaticDecodingStateLayer]]) -> int:
    """How many keys the attention function receives with ``ctx``: a static cache's buffers; the current tokens'
    where a :class:`DecodingStateLayer` keeps the cached ones; else every key."""
    if isinstance(ctx, BatchPositions):
        return ctx.static_length
    if isinstance(layer, DecodingStateLayer):
        return ctx.length - layer.get_seq_length()
    return ctx.length
