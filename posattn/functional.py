"""A layer's position method applied to queries, keys and values, in the manner of
``torch.nn.functional.scaled_dot_product_attention``."""

import itertools
from typing import Mapping, Optional, Tuple, Union

import torch
from torch import Tensor

from posattn.attention import KERNEL_CHOICES, PositionKernel
from posattn.decoding import DecodingCache
from posattn.errors import ArgumentError, MisuseError, described
from posattn.position_context import PositionContext
from posattn.position_options import check_count, check_flag


def batch_context(padding_mask: Optional[Tensor], causal: bool, length: Optional[int] = None,
                  device: Optional[torch.device] = None,
                  side_data: Optional[Mapping[str, Tensor]] = None) -> PositionContext:
    """The position context of one batch, to build once and pass to every layer (``context=``).

    Args:
        padding_mask: ``(batch, length)`` bool, True at pads, over every token so far (in decoding: the cached
            ones too); any padding, left or right. None: no pads (give ``length`` and ``device``). Another dtype
            is refused: Hugging Face's ``attention_mask`` is 1 at tokens (pass ``attention_mask == 0``).
        causal: the layers are causal (a decoder, a language model): the layers' side (it is refused by another).
        side_data: per-token side data by name, each ``(batch, length)``, for the methods that read it.
    """
    check_flag("causal", causal)
    if padding_mask is None:
        if length is None:
            raise ArgumentError("batch_context without a padding mask needs the length (and device): "
                                "batch_context(None, causal, length, device)")
        check_count("length", length)
        padding_mask = torch.zeros(1, length, dtype=torch.bool, device=device)
        return PositionContext.from_padding(padding_mask, True, side_data, causal=causal, pad_free=True)
    check_padding_mask(padding_mask, None, None)
    return PositionContext.from_padding(padding_mask, False, side_data, causal=causal)


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

    Every argument is checked first: a shape, dtype or value other than these, or an object used where it does
    not belong (a cache of another layer or batch, or on a bidirectional layer; a context of another batch or
    side) is refused in one line (:class:`~posattn.errors.ArgumentError`, :class:`~posattn.errors.MisuseError`).

    Returns:
        the output ``(batch, heads, length, head_dim)``; with ``need_weights`` also the weights
        ``(batch, heads, length, keys)`` that multiply the values.
    """
    causal = _checked_call(q, k, v, method, causal, kernel, x)
    if cache is not None:
        if not isinstance(cache, DecodingCache):
            raise ArgumentError(f"cache must be a posattn.DecodingCache, got {described(cache)}")
        cache.check_use(method, causal, q.size(0))
    past = 0 if cache is None else cache.length
    if context is None:
        check_padding_mask(padding_mask, q.size(0), q.size(2))
        context = _context_of_call(q, padding_mask, causal, cache, side_data)
    else:
        _check_context(context, method, causal, q.size(0), past + q.size(2), padding_mask)
    state = None
    if cache is not None:
        cache.padding_mask = context.padding_mask if context.padding_mask.size(0) == q.size(0) else \
            context.padding_mask.expand(q.size(0), -1)
        cache.pad_free = context.pad_free
        state = cache.state
    x_time_first = None if x is None else x.transpose(0, 1)
    # no attn_mask: the kernel takes causality from the context (the explicit path's mask, SDPA's causal kernel)
    out, _, probs = method.attend(q * q.size(-1) ** -0.5, k, v, context, None, state, x_time_first,
                                  need_weights, kernel)
    return (out, probs) if need_weights else out


def _context_of_call(q: Tensor, padding_mask: Optional[Tensor], causal: bool, cache: Optional[DecodingCache],
                     side_data: Optional[Mapping[str, Tensor]]) -> PositionContext:
    """The context of one call's tokens, after the cache's; known to hold no pad where no call gave a padding
    mask."""
    batch, length = q.size(0), q.size(2)
    if padding_mask is None and (cache is None or cache.pad_free):
        return batch_context(None, causal, (0 if cache is None else cache.length) + length, q.device, side_data)
    if cache is None or cache.padding_mask is None:
        return batch_context(padding_mask, causal, side_data=side_data)
    current = torch.zeros(batch, length, dtype=torch.bool, device=q.device) if padding_mask is None else padding_mask
    return batch_context(torch.cat([cache.padding_mask, current.bool()], dim=1), causal, side_data=side_data)


def check_padding_mask(padding_mask: Optional[Tensor], batch: Optional[int], length: Optional[int]) -> None:
    """Refuse a ``padding_mask`` that is not ``(batch, length)`` bool (None: any size of that dimension)."""
    if padding_mask is None:
        return
    expected = f"({'batch' if batch is None else batch}, {'length' if length is None else length})"
    if not isinstance(padding_mask, Tensor):
        raise ArgumentError(f"padding_mask must be a {expected} bool tensor, True at pads, got "
                            f"{described(padding_mask)}")
    if padding_mask.dtype != torch.bool:
        raise ArgumentError(f"padding_mask must be bool, True at pads, got dtype {padding_mask.dtype}: a mask of "
                            "another dtype is ambiguous (Hugging Face's attention_mask is 1 at tokens: pass "
                            "attention_mask == 0)")
    if padding_mask.dim() != 2 or (batch is not None and padding_mask.size(0) != batch) or (
            length is not None and padding_mask.size(1) != length):
        raise ArgumentError(f"padding_mask must be {expected} (batch, length of the current tokens), True at pads, "
                            f"got shape {tuple(padding_mask.shape)}")


def _checked_call(q: Tensor, k: Tensor, v: Tensor, method: PositionKernel, causal: Optional[bool],
                  kernel: Optional[str], x: Optional[Tensor]) -> bool:
    """The side of the call (``causal``, else the method's), after refusing what does not fit the method:
    ``q, k, v`` of other shapes than ``(batch, method's heads, length, method's head_dim)``, ``causal`` of the
    other side, an unknown ``kernel``, an ``x`` of another shape than ``(batch, length, embed_dim)``, float64
    ``q`` with a method of narrower tensors (its tables would hold float32's values)."""
    if not isinstance(method, PositionKernel):
        raise ArgumentError(f"method must be a layer's position method (posattn.position_method(...) or a "
                            f"posattn.SelfAttention), got {described(method)}")
    expected = f"(batch, {method.num_heads}, length, {method.head_dim})"
    for name, tensor in (("q", q), ("k", k), ("v", v)):
        if not isinstance(tensor, Tensor) or tensor.dim() != 4 or not tensor.is_floating_point():
            raise ArgumentError(f"{name} must be a floating tensor {expected} (batch, heads, length, head_dim), got "
                                f"{described(tensor)}")
        if tensor.shape != q.shape or tensor.dtype != q.dtype or tensor.device != q.device:
            raise ArgumentError(f"q, k and v must have one shape, dtype and device (self-attention of the current "
                                f"tokens: the cache holds the earlier ones), got q {described(q)} on {q.device}, "
                                f"{name} {described(tensor)} on {tensor.device}")
    if q.size(1) != method.num_heads or q.size(3) != method.head_dim:
        raise MisuseError(f"{method.where}: the method was built for {method.num_heads} heads of size "
                          f"{method.head_dim}, called with q, k, v of {q.size(1)} heads of size {q.size(3)}: build "
                          f"it with position_method({q.size(1)}, {q.size(3)}, ...), or give {expected}")
    if q.dtype == torch.float64:
        narrower = next((tensor.dtype for tensor in itertools.chain(method.parameters(), method.buffers())
                         if tensor.is_floating_point() and tensor.dtype != torch.float64), None)
        if narrower is not None:
            raise MisuseError(f"{method.where}: q, k, v are float64, the method's parameters and tables {narrower}: "
                              "cast the method with the model (method.double(); a submodule is cast with it)")
    if kernel is not None and kernel not in KERNEL_CHOICES:
        raise ArgumentError(f"kernel must be one of {list(KERNEL_CHOICES)} or None (the method's), got {kernel!r}")
    if x is not None and (not isinstance(x, Tensor) or x.shape != (q.size(0), q.size(2), method.embed_dim)):
        raise ArgumentError(f"x must be the layer input ({q.size(0)}, {q.size(2)}, {method.embed_dim}) (batch, "
                            f"length, embed_dim) of the current tokens, got {described(x)}")
    if causal is None:
        return bool(method.causal)
    check_flag("causal", causal)
    if method.causal is not None and causal != method.causal:
        raise MisuseError(f"{method.where}: the method was built for a {'causal' if method.causal else 'bidirectional'}"
                          f" side, called with causal={causal}: leave causal out (the method's side), or build the "
                          f"method with causal={causal}")
    return causal


def _check_context(context: PositionContext, method: PositionKernel, causal: bool, batch: int, length: int,
                   padding_mask: Optional[Tensor]) -> None:
    """Refuse a ``context`` that is not the batch's of this call: of another side, another number of sequences
    (1 is any), or another number of tokens (the cached ones and the current ones), or given with a padding
    mask (the context holds it)."""
    if not isinstance(context, PositionContext):
        raise ArgumentError(f"context must be the batch's posattn.batch_context(...), got {described(context)}")
    if padding_mask is not None:
        raise ArgumentError("give the padding mask in the context (batch_context(padding_mask, causal)) or as "
                            "padding_mask, not both")
    shape = tuple(context.padding_mask.shape)
    if context.causal != causal or shape[0] not in (1, batch) or shape[1] != length:
        raise MisuseError(
            f"{method.where}: the context was built for {shape[0]} sequences of {shape[1]} tokens on a "
            f"{'causal' if context.causal else 'bidirectional'} side, the call is of {batch} sequences of {length} "
            f"tokens (the cached ones too) on a {'causal' if causal else 'bidirectional'} side: build the batch's "
            "context once per forward pass with batch_context(padding_mask, causal) over every token so far")
