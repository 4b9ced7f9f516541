"""Decoding with transformers' static cache (``generate(cache_implementation="static")``, and its fast path: the
forward compiled with ``torch.compile``, the cache's tensors of a fixed shape), on the attention function's side
(the contexts: :mod:`posattn_huggingface.mask_function`).

A ``StaticCache`` holds each layer's keys and values in buffers of ``max_cache_len`` tokens, written in place; the
attention function receives the whole buffers. Methods that keep nothing beside the keys and values read them as
they are (the prompt their filled part). A query/key transform (the posattn rotation, xPos) keeps the transformed
keys in a buffer of the same shape beside the cache's (:class:`StaticDecodingStateLayer`); a decoding step hands
the kernel that buffer without its last column, the kernel appends the current key, transformed, last, and the
step's context is the same with the current token moved to the last column (:class:`CurrentTokenLast`). A
post-softmax transform (the convolutions) and a token-difference term (FoX) continue from the last token's state,
which the kernel takes as the last column of what it is given: they are refused with a static cache, in one line.
"""

from dataclasses import dataclass, replace
from typing import Dict, Optional, Tuple

import torch
from torch import Tensor
from transformers.cache_utils import StaticLayer

from posattn.attention import PositionKernel
from posattn.kernel_self_check import query_key_size
from posattn.position_context import PositionContext, Preparation
from posattn_huggingface.mask_function import BatchPositions
from posattn_huggingface.names import HuggingFaceRefusal


@dataclass(frozen=True)
class CurrentTokenLast(Preparation):
    """A decoding step's context with the current token in the last column, where the kernel appends its
    transformed key: its column of the buffers padding, the last column a token (its position and distances are
    the query's already)."""

    def build(self, ctx: PositionContext) -> PositionContext:
        padding = ctx.padding_mask.index_fill(1, ctx.step_index, True)
        padding[:, -1] = False
        return replace(ctx, padding_mask=padding, memo={})


class StaticDecodingStateLayer(StaticLayer):
    """A :class:`~transformers.cache_utils.StaticLayer` that also holds the keys a query/key transform transformed
    (``state["prev_key"]``: ``(batch, heads, max_cache_len, head_dim)``, written at the tokens' indices as the
    keys are), reordered with them (beam search)."""

    def __init__(self, max_cache_len: int) -> None:
        super().__init__(max_cache_len)
        self.state: Dict[str, Tensor] = {}

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        super().reorder_cache(beam_idx)
        self.state = {name: t.index_select(0, beam_idx.to(t.device)) for name, t in self.state.items()}

    def reset(self) -> None:
        super().reset()
        for tensor in self.state.values():
            tensor.zero_()


def static_state_layer(method: PositionKernel, layer: StaticLayer) -> StaticDecodingStateLayer:
    """The static cache's layer as a :class:`StaticDecodingStateLayer` (an empty ``StaticLayer`` replaced by one),
    for a method whose decoding state fits one; refuses the others, and a layer filled without the state."""
    for term, kind, why in ((method.post_softmax_term, "a post-softmax transform", "its last attention rows"),
                            (next(iter(method.token_difference_terms), None), "a token-difference term",
                             "its cumulative values"),
                            (method.content_term, "a content-logits term", "keys carried to the last token"),
                            (next((term for term in method.logit_matrix_terms if term.keeps_rows), None),
                             "a logit-matrix transform", "its last rows of logits")):
        if term is not None:
            raise HuggingFaceRefusal(
                f"{method.where}: {type(term).__name__} ({kind}) continues from the last token's state ({why}), "
                "which a static cache does not hold: generate with the dynamic cache (no cache_implementation)")
    if isinstance(layer, StaticDecodingStateLayer):
        return layer
    if type(layer) is not StaticLayer or layer.is_initialized:
        raise HuggingFaceRefusal(f"{method.where}: the static cache's layer ({type(layer).__name__}) was filled "
                                 "without the position method's transformed keys: generate with a new cache")
    return StaticDecodingStateLayer(layer.max_cache_len)


def attend_static_step(method: PositionKernel, q: Tensor, key: Tensor, value: Tensor, ctx: BatchPositions,
                       layer: Optional[StaticDecodingStateLayer], x: Optional[Tensor],
                       need_weights: bool) -> Tuple[Tensor, Optional[Tensor]]:
    """A decoding step: the kernel on ``q`` (scaled) over the static cache's buffers ``key``, ``value`` (``(batch,
    heads, max_cache_len, head_dim)``, the current token's written), with the layer that keeps the method's
    transformed keys (None: a method that keeps nothing beside the keys and values)."""
    if layer is None:  # the whole buffers: their unfilled end is padding
        out, _, weights = method.attend(q, key, value, ctx, None, {}, x, need_weights=need_weights)
        return out, weights
    last, index = key.size(2) - 1, ctx.step_index
    transformed = _transformed_keys(method, layer, key)
    state = {"prev_key": transformed[:, :, :last], "prev_value": value[:, :, :last]}
    out, _, weights = method.attend(q, key.index_select(2, index), value.index_select(2, index),
                                    ctx.prepared(CurrentTokenLast()), None, state, x, need_weights=need_weights)
    transformed.index_copy_(2, index, state["prev_key"][:, :, last:])
    if weights is not None:  # the current token's weights back at its column of the buffers
        moved = torch.zeros_like(weights)
        moved[..., :last] = weights[..., :last]
        weights = moved.index_copy(-1, index, weights[..., last:])
    return out, weights


def attend_static_prompt(method: PositionKernel, q: Tensor, key: Tensor, value: Tensor, ctx: BatchPositions,
                         layer: StaticDecodingStateLayer, x: Optional[Tensor],
                         need_weights: bool) -> Tuple[Tensor, Optional[Tensor]]:
    """The prompt over the buffers' first ``ctx.length`` tokens, as with a dynamic cache, its keys, transformed,
    written into the layer's buffer of them (made here, at the buffers' shape)."""
    length, past = ctx.length, ctx.length - q.size(2)
    transformed = _transformed_keys(method, layer, key)
    state = {"prev_key": transformed[:, :, :past], "prev_value": value[:, :, :past]} if past else {}
    out, _, weights = method.attend(q, key[:, :, past:length], value[:, :, past:length], ctx, None, state, x,
                                    need_weights=need_weights)
    transformed[:, :, past:length] = state["prev_key"][:, :, past:]
    return out, weights


def _transformed_keys(method: PositionKernel, layer: StaticDecodingStateLayer, key: Tensor) -> Tensor:
    """The layer's buffer of transformed keys, of the shape of the cache's buffer ``key`` but for the size of a
    transformed key, which a transform may change (made at the first call: the prompt, or its one token)."""
    if "prev_key" not in layer.state:
        layer.state["prev_key"] = key.new_zeros(*key.shape[:-1], query_key_size(method, key.device, key.dtype))
        if not torch.compiler.is_compiling():  # as StaticLayer's own buffers: a fixed address for CUDA graphs
            torch._dynamo.mark_static_address(layer.state["prev_key"])
    return layer.state["prev_key"]
