"""A layer's position method applied to queries, keys and values, in the manner of
``torch.nn.functional.scaled_dot_product_attention``."""

from typing import Mapping, Optional, Tuple, Union

import torch
from torch import Tensor

from posattn.attention import PositionKernel
from posattn.decoding import DecodingCache
from posattn.position_context import CausalMask, PositionContext


def batch_context(padding_mask: Optional[Tensor], causal: bool, length: Optional[int] = None,
                  device: Optional[torch.device] = None,
                  side_data: Optional[Mapping[str, Tensor]] = None) -> PositionContext:
    """The position context of one batch, to build once and pass to every layer (``context=``).

    Args:
        padding_mask: ``(batch, length)`` bool, True at pads, over every token so far (in decoding: the cached
            ones too); any padding, left or right. None: no pads (give ``length`` and ``device``).
        causal: the layers are causal (a decoder, a language model).
        side_data: per-token side data by name, each ``(batch, length)``, for the methods that read it.
    """
    if padding_mask is None:
        if length is None:
            raise ValueError("batch_context without a padding mask needs the length (and device)")
        padding_mask = torch.zeros(1, length, dtype=torch.bool, device=device)
        return PositionContext.from_padding(padding_mask, True, side_data, causal=causal)
    return PositionContext.from_padding(padding_mask.bool(), False, side_data, causal=causal)


def position_attention(
    q: Tensor, k: Tensor, v: Tensor, method: PositionKernel, *,
    padding_mask: Optional[Tensor] = None, causal: Optional[bool] = None, cache: Optional[DecodingCache] = None,
    x: Optional[Tensor] = None, side_data: Optional[Mapping[str, Tensor]] = None,
    context: Optional[PositionContext] = None, kernel: Optional[str] = None, need_weights: bool = False,
) -> Union[Tensor, Tuple[Tensor, Tensor]]:
    """Attention of ``q`` over ``k, v`` with the position method ``method`` (dropout as ``method`` is in
    training mode).

    Args:
        q, k, v: ``(batch, heads, length, head_dim)`` of the current tokens, ``q`` not scaled (scaled by
            ``head_dim ** -0.5`` here, as ``scaled_dot_product_attention`` does).
        method: the layer's method (a :class:`~posattn.attention.PositionKernel`:
            ``posattn.position_method(...)``, or a :class:`~posattn.SelfAttention`).
        padding_mask: ``(batch, length)`` bool, True at pads of the current tokens (any padding); None: none.
        causal: the layer is causal; must be the side the method was built for (None: that side).
        cache: the layer's :class:`~posattn.decoding.DecodingCache` in decoding: the keys and values so far, to
            which this call's are added; the current tokens' positions continue from ``cache.length``.
        x: ``(batch, length, embed_dim)``, the layer input, for a method that computes values from the tokens
            (a token-difference term); None otherwise.
        side_data: per-token side data by name, each ``(batch, length)``, for a method that reads it.
        context: the batch's :func:`batch_context`, built once for every layer (instead of ``padding_mask``,
            ``causal`` and ``side_data``; in decoding its padding mask covers the cached tokens too).
        kernel: ``auto``, ``explicit`` or ``flex`` for this call (None: the method's).
        need_weights: also return the attention weights (the explicit path).

    Returns:
        the output ``(batch, heads, length, head_dim)``; with ``need_weights`` also the weights
        ``(batch, heads, length, keys)`` that multiply the values.
    """
    causal = method.causal if causal is None else causal
    if method.causal is not None and causal != method.causal:
        raise ValueError(f"{method.where}: built for a {'causal' if method.causal else 'bidirectional'} side, "
                         f"called with causal={causal}")
    tgt_len = q.size(2)
    if context is None:
        context = _context_of_call(q, padding_mask, causal, cache, side_data)
    state = None
    if cache is not None:
        cache.padding_mask = context.padding_mask if context.padding_mask.size(0) == q.size(0) else \
            context.padding_mask.expand(q.size(0), -1)
        state = cache.state
    attn_mask = context.prepared(CausalMask(tgt_len, context.length, q.dtype)) if causal and tgt_len > 1 else None
    x_time_first = None if x is None else x.transpose(0, 1)
    out, _, probs = method.attend(q * q.size(-1) ** -0.5, k, v, context, attn_mask, state, x_time_first,
                                  need_weights, kernel)
    return (out, probs) if need_weights else out


def _context_of_call(q: Tensor, padding_mask: Optional[Tensor], causal: bool, cache: Optional[DecodingCache],
                     side_data: Optional[Mapping[str, Tensor]]) -> PositionContext:
    """The context of one call's tokens, after the cache's."""
    batch, length = q.size(0), q.size(2)
    if cache is None or cache.padding_mask is None:
        if padding_mask is None:
            return batch_context(None, causal, length, q.device, side_data)
        return batch_context(padding_mask, causal, side_data=side_data)
    current = torch.zeros(batch, length, dtype=torch.bool, device=q.device) if padding_mask is None else padding_mask
    return batch_context(torch.cat([cache.padding_mask, current.bool()], dim=1), causal, side_data=side_data)
