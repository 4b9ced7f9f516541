"""fairseq's multi-head self-attention with the library's position kernel (:mod:`posattn.attention`).

:class:`PositionAwareMultiheadAttention` subclasses the kernel and fairseq's
:class:`~fairseq.modules.MultiheadAttention`: its projection parameters have fairseq's names, it keeps the
kernel's decoding state in fairseq's incremental-state buffer (so fairseq's reordering for beam search reorders
it) and it returns weights in fairseq's layout. What it computes is the kernel's (the order of operations, the
paths, the self-check: :mod:`posattn.attention`).

**The position context travels with the call.** fairseq's layers hand their self-attention padding
mask to ``self_attn(..., key_padding_mask=...)`` untouched. Our layers put the batch's whole
:class:`~posattn.position_context.PositionContext` (which holds that padding mask)
in that argument, so every call, including activation checkpointing's recomputation in the
backward pass and a compiled graph, receives exactly the geometry of its batch, without
re-implementing fairseq's layers and without any per-batch state on a module. Called without a
context, the module raises.

**Intermediates are returned, not kept.** An inspection call (``posattn-inspect``) passes
``return_softmax_before_transform=True``: it takes the explicit path, and the weights it gets back
are an :class:`AttentionWeights`, the final weights together with the softmax S before the
post-softmax transform (``A' = transform(S)``).
"""

from typing import Dict, NamedTuple, Optional, Tuple, Union

import torch.nn.functional as F
from fairseq.modules import MultiheadAttention
from torch import Tensor

from posattn.attention import PositionKernel, PositionTerms
from posattn.position_context import PositionContext


class AttentionWeights(NamedTuple):
    """What an inspection call returns as its weights (``return_softmax_before_transform=True``), both
    in fairseq's layout (heads x batch x tgt x src, or averaged over the heads)."""

    #: the weights that multiply V: after the post-softmax transform, as fairseq's call returns them
    weights: Tensor
    #: the softmax S before the post-softmax transform (the same tensor as ``weights`` without one)
    softmax: Tensor


class PositionAwareMultiheadAttention(PositionKernel, MultiheadAttention):
    """fairseq's self-attention call on the position kernel; see the module docstring."""

    def __init__(
        self,
        embed_dim: int,
        num_heads: int,
        terms: PositionTerms,
        dropout: float = 0.0,
        q_noise: float = 0.0,
        qn_block_size: int = 8,
    ):
        MultiheadAttention.__init__(
            self, embed_dim, num_heads, dropout=dropout, self_attention=True,
            q_noise=q_noise, qn_block_size=qn_block_size,
        )
        self.hold_terms(terms)

    #: names of the term modules in checkpoints of earlier versions -> today's: each key is an old checkpoint's
    #: module name, as it was saved (0.2.0 saved the projection scaling under the name of its method)
    LEGACY_MODULE_NAMES = {"temperature": "projection_term"}

    def upgrade_state_dict_named(self, state_dict: Dict[str, Tensor], name: str) -> None:
        """Rename the keys of :data:`LEGACY_MODULE_NAMES`, then fairseq's own upgrade (fairseq's model
        loading calls it on every module)."""
        prefix = f"{name}." if name else ""
        for old, new in self.LEGACY_MODULE_NAMES.items():
            for key in [key for key in state_dict if key.startswith(f"{prefix}{old}.")]:
                state_dict[f"{prefix}{new}.{key[len(prefix) + len(old) + 1:]}"] = state_dict.pop(key)
        MultiheadAttention.upgrade_state_dict_named(self, state_dict, name)

    def _project(self, x: Tensor) -> Tuple[Tensor, Tensor, Tensor]:
        """``(tgt_len, batch, E)`` -> q (scaled), k, v of shape ``(batch, heads, tgt_len, d_h)``."""
        q_w, k_w, v_w = self.scale_projections(self.q_proj.weight, self.k_proj.weight, self.v_proj.weight)
        tgt_len, bsz, _ = x.shape

        def split(t: Tensor) -> Tensor:
            return t.view(tgt_len, bsz, self.num_heads, self.head_dim).permute(1, 2, 0, 3)

        q = F.linear(x, q_w, self.q_proj.bias) * self.scaling
        return split(q), split(F.linear(x, k_w, self.k_proj.bias)), split(F.linear(x, v_w, self.v_proj.bias))

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
        return_softmax_before_transform: bool = False,
    ) -> Tuple[Tensor, Optional[Union[Tensor, AttentionWeights]]]:
        """fairseq's self-attention call; ``key_padding_mask`` is the batch's :class:`PositionContext`
        (its padding mask covers every key, the cached ones of incremental decoding included).

        ``return_softmax_before_transform`` (inspection): the weights are asked for, and come back as
        :class:`AttentionWeights`, with the softmax before the post-softmax transform."""
        if static_kv or before_softmax:
            raise ValueError("position-aware attention is self-attention only (no static_kv/before_softmax)")
        ctx = require_context(key_padding_mask)
        need_weights = need_weights or need_head_weights or return_softmax_before_transform
        tgt_len, bsz, _ = query.shape
        saved_state = self._get_input_buffer(incremental_state) if incremental_state is not None else None
        q, k, v = self._project(query)
        out, softmax, probs = self.attend(q, k, v, ctx, attn_mask, saved_state, query, need_weights)
        if saved_state is not None:
            self._set_input_buffer(incremental_state, saved_state)

        out = self.out_proj(out.permute(2, 0, 1, 3).reshape(tgt_len, bsz, self.embed_dim))
        if not need_weights or probs is None:
            return out, None
        weights = fairseq_layout(probs, need_head_weights)
        if return_softmax_before_transform:
            return out, AttentionWeights(weights, fairseq_layout(softmax, need_head_weights))
        return out, weights


def fairseq_layout(probs: Tensor, per_head: bool) -> Tensor:
    """``(batch, heads, tgt, src)`` weights as fairseq returns them: heads x batch x tgt x src, or
    averaged over the heads."""
    weights = probs.transpose(0, 1)
    return weights if per_head else weights.mean(dim=0)


def require_context(key_padding_mask: Optional[PositionContext]) -> PositionContext:
    """The batch's :class:`PositionContext`, or a loud error for a call made without one."""
    if not isinstance(key_padding_mask, PositionContext):
        raise TypeError(
            "position-aware self-attention needs its batch's PositionContext in the key_padding_mask "
            f"argument, got {type(key_padding_mask).__name__}: call it through a position-aware "
            "layer and side (they build the context once per batch and pass it on every call)")
    return key_padding_mask
