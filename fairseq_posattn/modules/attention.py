"""The attention kernel: fairseq's multi-head self-attention with pluggable position terms.

Order of operations for one head (docs/methods.md, Order of operations in one head):

1. ``q, k, v`` projections (weights scaled per head by the learnable temperature, if on);
   ``q`` scaled by 1/sqrt(d_h); query/key transforms (rotary) of the current tokens;
2. content logits ``q k^T`` plus the key/value augmentations' key term (Shaw, structural);
3. logit scaling (distance-aware: ``ReLU(.) * Rhat``);
4. additive biases (direct absolute / relative, T5's buckets, ALiBi);
5. masks: ``attn_mask`` (causal) and key padding, as -inf *after* the steps above;
6. softmax; post-softmax transform (convolution), which re-masks;
7. dropout; ``probs v`` plus the augmentations' value term; output projection.

When only query/key transforms, additive biases and temperature are on and no weights are asked
for, steps 2-7 run in ``F.scaled_dot_product_attention`` with the biases and masks folded into one
float mask.

The module subclasses fairseq's :class:`~fairseq.modules.MultiheadAttention`, so its projection
parameters have fairseq's names, and reuses fairseq's incremental-state buffer and reordering.

**The position context travels with the call.** fairseq's layers hand their self-attention padding
mask to ``self_attn(..., key_padding_mask=...)`` untouched. Our layers put the batch's whole
:class:`~fairseq_posattn.modules.position_context.PositionContext` (which holds that padding mask)
in that argument, so every call, including activation checkpointing's recomputation in the
backward pass and a compiled graph, receives exactly the geometry of its batch, without
re-implementing fairseq's layers and without any per-batch state on a module. Called without a
context, the module raises.

Precision: the softmax, and every term's sensitive part, run in fp32 and are cast back to the
model's dtype (``--fp16`` / ``--bf16``), as fairseq's own attention does for its softmax.
"""

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

import torch
import torch.nn.functional as F
from fairseq.modules import MultiheadAttention
from torch import Tensor, nn

from fairseq_posattn.modules.position_context import PositionContext
from fairseq_posattn.modules.position_terms.base import (
    AdditiveLogitBias,
    KeyValueAugmentation,
    LogitScaling,
    PostSoftmaxTransform,
    QueryKeyTransform,
    at_least_fp32,
    same_dtype,
)
from fairseq_posattn.modules.position_terms.temperature import LearnableTemperature


@dataclass
class PositionTerms:
    """The position terms of one attention module, grouped by kind."""

    query_key: List[QueryKeyTransform] = field(default_factory=list)
    additive: List[AdditiveLogitBias] = field(default_factory=list)
    scaling: Optional[LogitScaling] = None
    key_value: List[KeyValueAugmentation] = field(default_factory=list)
    post_softmax: Optional[PostSoftmaxTransform] = None
    temperature: Optional[LearnableTemperature] = None

    def add(self, term: nn.Module) -> None:
        """File ``term`` under its kind (at most one scaling, post-softmax and temperature term)."""
        for kind, listed in ((QueryKeyTransform, self.query_key), (AdditiveLogitBias, self.additive),
                             (KeyValueAugmentation, self.key_value)):
            if isinstance(term, kind):
                listed.append(term)
                return
        for kind, name in ((LogitScaling, "scaling"), (PostSoftmaxTransform, "post_softmax"),
                           (LearnableTemperature, "temperature")):
            if isinstance(term, kind):
                if getattr(self, name) is not None:
                    raise ValueError(f"two {name} terms in one layer: {getattr(self, name)} and {term}")
                setattr(self, name, term)
                return
        raise TypeError(f"{type(term).__name__} is of no kind of position term (see position_terms.base)")

    def is_empty(self) -> bool:
        return not (
            self.query_key or self.additive or self.key_value or self.scaling is not None
            or self.post_softmax is not None or self.temperature is not None
        )


class PositionAwareMultiheadAttention(MultiheadAttention):
    """Self-attention with position terms; see the module docstring for the computation."""

    def __init__(
        self,
        embed_dim: int,
        num_heads: int,
        terms: PositionTerms,
        dropout: float = 0.0,
        q_noise: float = 0.0,
        qn_block_size: int = 8,
    ):
        super().__init__(
            embed_dim, num_heads, dropout=dropout, self_attention=True,
            q_noise=q_noise, qn_block_size=qn_block_size,
        )
        self.query_key_terms = nn.ModuleList(terms.query_key)
        self.additive_terms = nn.ModuleList(terms.additive)
        self.scaling_term = terms.scaling
        self.key_value_terms = nn.ModuleList(terms.key_value)
        self.post_softmax_term = terms.post_softmax
        self.temperature = terms.temperature
        #: inspection (``posattn-inspect``): keep the last pass's softmax matrix S, before any
        #: post-softmax transform, in ``last_softmax`` (batch x heads x tgt x src)
        self.keep_attention_maps = False
        self.last_softmax: Optional[Tensor] = None

    # ----------------------------------------------------------------- projections
    def _project(self, x: Tensor) -> Tuple[Tensor, Tensor, Tensor]:
        """``(tgt_len, batch, E)`` -> q (scaled), k, v of shape ``(batch, heads, tgt_len, d_h)``."""
        q_w, k_w, v_w = self.q_proj.weight, self.k_proj.weight, self.v_proj.weight
        if self.temperature is not None:
            q_w, k_w, v_w = self.temperature.scale_weights(q_w, k_w, v_w)
        tgt_len, bsz, _ = x.shape

        def split(t: Tensor) -> Tensor:
            return t.view(tgt_len, bsz, self.num_heads, self.head_dim).permute(1, 2, 0, 3)

        q = F.linear(x, q_w, self.q_proj.bias) * self.scaling
        return split(q), split(F.linear(x, k_w, self.k_proj.bias)), split(F.linear(x, v_w, self.v_proj.bias))

    def _uses_probabilities(self, need_weights: bool) -> bool:
        return (
            need_weights or self.scaling_term is not None or len(self.key_value_terms) > 0
            or self.post_softmax_term is not None
        )

    # ----------------------------------------------------------------- forward
    def forward(
        self,
        query: Tensor,
        key: Optional[Tensor],
        value: Optional[Tensor],
        key_padding_mask: Optional[PositionContext] = None,
        incremental_state: Optional[Dict[str, Dict[str, Optional[Tensor]]]] = None,
        need_weights: bool = True,
        static_kv: bool = False,
        attn_mask: Optional[Tensor] = None,
        before_softmax: bool = False,
        need_head_weights: bool = False,
    ) -> Tuple[Tensor, Optional[Tensor]]:
        """fairseq's self-attention call; ``key_padding_mask`` is the batch's :class:`PositionContext`
        (its padding mask covers every key, the cached ones of incremental decoding included)."""
        if static_kv or before_softmax:
            raise ValueError("position-aware attention is self-attention only (no static_kv/before_softmax)")
        ctx = require_context(key_padding_mask)
        need_weights = need_weights or need_head_weights
        tgt_len, bsz, _ = query.shape
        q, k, v = self._project(query)
        for term in self.query_key_terms:  # the current tokens', before the cache
            q, k = term(q, k, ctx)

        saved_state = self._get_input_buffer(incremental_state) if incremental_state is not None else None
        history: Optional[Tensor] = None
        if saved_state is not None and "prev_key" in saved_state:
            k = torch.cat([saved_state["prev_key"], k], dim=2)
            v = torch.cat([saved_state["prev_value"], v], dim=2)
            history = saved_state.get("prev_attn_rows")

        if self._uses_probabilities(need_weights):
            out, probs, rows = self._attend_explicitly(q, k, v, ctx, attn_mask, history)
        else:
            out, probs, rows = self._attend_fused(q, k, v, ctx, attn_mask), None, None

        if saved_state is not None:
            saved_state["prev_key"] = k
            saved_state["prev_value"] = v
            if rows is not None:
                saved_state["prev_attn_rows"] = rows
            self._set_input_buffer(incremental_state, saved_state)

        out = out.permute(2, 0, 1, 3).reshape(tgt_len, bsz, self.embed_dim)
        out = self.out_proj(out)
        weights: Optional[Tensor] = None
        if need_weights and probs is not None:
            weights = probs.transpose(0, 1)  # heads x batch x tgt x src, as fairseq returns
            if not need_head_weights:
                weights = weights.mean(dim=0)
        return out, weights

    def _attend_fused(
        self, q: Tensor, k: Tensor, v: Tensor, ctx: PositionContext, attn_mask: Optional[Tensor],
    ) -> Tensor:
        tgt_len, src_len = q.size(2), k.size(2)
        mask = ctx.key_padding_bias(q.dtype)  # shared by the layers: never changed in place
        for term in self.additive_terms:
            mask = mask + same_dtype(term.bias(ctx, tgt_len, src_len), q.dtype)
        if attn_mask is not None:
            mask = mask + same_dtype(attn_mask, q.dtype)
        dropout_p = self.dropout_module.p if self.training else 0.0
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p, scale=1.0)

    def _attend_explicitly(
        self, q: Tensor, k: Tensor, v: Tensor, ctx: PositionContext,
        attn_mask: Optional[Tensor], history: Optional[Tensor],
    ) -> Tuple[Tensor, Tensor, Optional[Tensor]]:
        tgt_len, src_len = q.size(2), k.size(2)
        # the logits are a fresh tensor (as is the scaling term's result, in fp32) that no backward
        # pass needs: the terms and masks go in place, without another (tgt_len x src_len) tensor
        logits = torch.matmul(q, k.transpose(-1, -2))
        for term in self.key_value_terms:
            logits.add_(term.key_logits(q, ctx, tgt_len, src_len))
        if self.scaling_term is not None:
            logits = self.scaling_term(logits, ctx)
        for term in self.additive_terms:
            logits.add_(same_dtype(term.bias(ctx, tgt_len, src_len), logits.dtype))
        if attn_mask is not None:
            logits.add_(same_dtype(attn_mask, logits.dtype))
        logits.masked_fill_(ctx.key_padding_4d(), float("-inf"))
        probs = same_dtype(torch.softmax(logits, dim=-1, dtype=at_least_fp32(logits.dtype)), v.dtype)  # as fairseq

        rows: Optional[Tensor] = None
        if self.keep_attention_maps or self.last_softmax is not None:
            self.last_softmax = probs.detach() if self.keep_attention_maps else None
        if self.post_softmax_term is not None:
            # the softmax gave blocked keys zero weight already; padded query rows get zeros too
            probs = probs.masked_fill(ctx.geometry(
                ("query-padding-4d", tgt_len), lambda: ctx.query_padding_mask(tgt_len)[:, None, :, None]), 0.0)
            blocked = ctx.geometry(  # a side hands every layer the same causal mask (or none)
                ("blocked", tgt_len, src_len, attn_mask is None),
                lambda: blocked_entries(attn_mask, ctx.padding_mask, ctx.query_padding_mask(tgt_len)))
            probs, rows = self.post_softmax_term(probs, blocked, ctx, history)

        dropped = self.dropout_module(probs)
        out = torch.matmul(dropped, v)
        for term in self.key_value_terms:
            out.add_(term.value_output(dropped, ctx))
        return out, probs, rows


def require_context(key_padding_mask: Optional[PositionContext]) -> PositionContext:
    """The batch's :class:`PositionContext`, or a loud error for a call made without one."""
    if not isinstance(key_padding_mask, PositionContext):
        raise TypeError(
            "position-aware self-attention needs its batch's PositionContext in the key_padding_mask "
            f"argument, got {type(key_padding_mask).__name__}: call it through a position-aware "
            "layer and side (they build the context once per batch and pass it on every call)")
    return key_padding_mask


def blocked_entries(
    attn_mask: Optional[Tensor], key_padding_mask: Optional[Tensor], query_padding: Optional[Tensor]
) -> Optional[Tensor]:
    """True where a query may not see a key (``-inf`` in ``attn_mask``, a padded key) or the query
    row is a pad, broadcastable to ``(batch, heads, tgt_len, src_len)``; None when nothing is."""
    masks = []
    if attn_mask is not None:
        masks.append(torch.isneginf(attn_mask))
    if key_padding_mask is not None:
        masks.append(key_padding_mask[:, None, None, :])
    if query_padding is not None:
        masks.append(query_padding[:, None, :, None])
    if not masks:
        return None
    blocked = masks[0]
    for mask in masks[1:]:
        blocked = blocked | mask
    return blocked
