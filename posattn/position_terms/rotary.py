"""Rotary position embedding, RoPE (Su et al. 2021, RoFormer, section 3.4), a baseline.

Queries and keys are rotated by their token position before the dot product: dimensions
``(2k, 2k + 1)`` of a head form a pair that turns by the angle ``p * theta_k``, with
``theta_k = 10000^(-2k / d_h)`` (the paper's eq. 15 and 34, pairs of neighbouring dimensions).
``q_i . k_j`` then depends on the positions only through ``i - j``. The position is the *token*
position (a left-padded sentence turns exactly as when it is alone); in incremental decoding each
key is rotated once, at its own step, before it enters the cache. The angles and the rotation are
computed in fp32 and cast back to the model's dtype. No parameters; applied in every layer.
"""

from dataclasses import dataclass
from typing import Any, List, Optional, Tuple

import torch
from torch import Tensor, nn

from posattn.position_context import PositionContext, Preparation
from posattn.position_terms.base import QueryKeyTransform, at_least_fp32, same_dtype
from posattn.position_terms.quantities import CURVE, Quantity
from posattn.position_terms.registry import (
    LayerSpec,
    MethodOption,
    PositionMethod,
    PositionOptionError,
    register,
)

ROTARY_BASE = 10000.0


def rotary_frequencies(head_dim: int, dtype: torch.dtype, device: Optional[torch.device] = None) -> Tensor:
    """``theta_k = 10000^(-2k / d_h)`` of the ``d_h / 2`` pairs of dimensions."""
    pairs = torch.arange(0, head_dim, 2, device=device, dtype=dtype)
    return ROTARY_BASE ** (-pairs / head_dim)


def rotation_tables(angles: Tensor) -> Tuple[Tensor, Tensor]:
    """``cos`` and signed ``sin`` of ``angles[..., k]`` per dimension: ``(cos_k, cos_k)`` and
    ``(-sin_k, sin_k)`` at dimensions ``(2k, 2k + 1)``, for :func:`rotate_pairs`."""
    sin = angles.sin()
    return angles.cos().repeat_interleave(2, dim=-1), torch.stack([-sin, sin], dim=-1).flatten(-2)


def rotate_pairs(x: Tensor, cos: Tensor, signed_sin: Tensor) -> Tensor:
    """Turn each pair ``(x[..., 2k], x[..., 2k + 1])`` by the angle of :func:`rotation_tables`:
    ``(a, b) -> (a cos - b sin, b cos + a sin)`` (eq. 34), as ``x cos + swap(x) signed_sin``."""
    turned = same_dtype(x, cos.dtype)
    swapped = turned.unflatten(-1, (-1, 2)).flip(-1).flatten(-2)
    return same_dtype(turned * cos + swapped * signed_sin, x.dtype)


@dataclass(frozen=True)
class RotationTables(Preparation):
    """:func:`rotation_tables` of the current tokens' positions, ``(2, batch or 1, 1, tgt_len,
    head_dim)``, in ``dtype``: fp32 (fp64 for a double model; a buffer would be cast to fp16 by --fp16)."""

    head_dim: int
    tgt_len: int
    dtype: torch.dtype

    def build(self, ctx: PositionContext) -> Tensor:
        positions, _ = ctx.query_key_positions(self.tgt_len, ctx.length)  # the current tokens'
        frequencies = rotary_frequencies(self.head_dim, self.dtype, positions.device)
        return torch.stack(rotation_tables(positions.to(self.dtype)[:, None, :, None] * frequencies))


class RotaryEmbedding(QueryKeyTransform):
    """RoPE on queries and keys of shape ``(batch, heads, tgt_len, head_dim)``."""

    def __init__(self, head_dim: int):
        super().__init__()
        self.head_dim = head_dim

    def forward(self, q: Tensor, k: Tensor, ctx: PositionContext) -> Tuple[Tensor, Tensor]:
        tgt_len, dtype, length = q.size(2), at_least_fp32(q.dtype), ctx.length
        table = ctx.sequence_table(  # incremental decoding: the sequence's angles, sliced per step
            (RotationTables, self.head_dim, dtype), length,
            lambda n: self.tables(PositionContext.unpadded(n, q.device), n, dtype, q.device), length_dim=-2)
        if table is None:
            table = ctx.prepared(RotationTables(self.head_dim, tgt_len, dtype))
        else:
            table = table[..., length - tgt_len : length, :]
        cos, signed_sin = table
        return rotate_pairs(q, cos, signed_sin), rotate_pairs(k, cos, signed_sin)

    def tables(self, ctx: PositionContext, tgt_len: int, dtype: torch.dtype, device: torch.device) -> Tensor:
        """:class:`RotationTables` of ``tgt_len`` current tokens."""
        return RotationTables(self.head_dim, tgt_len, dtype).build(ctx)

    def inspect(self, positions: int) -> List[Quantity]:
        """Nothing is learned; shown is what the rotation alone does to a logit: ``q_i . k_j`` of a
        query and a key equal to the same vector of ones, over ``|q| |k|``, i.e. the mean over the
        pairs k of ``cos((i - j) theta_k)``, for the first ``positions`` positions (every head alike)."""
        distance = torch.arange(-(positions - 1), positions, dtype=torch.float64)
        pattern = torch.cos(distance[:, None] * rotary_frequencies(self.head_dim, torch.float64)).mean(dim=1)
        return [Quantity("angle-pattern", pattern[None].float(), CURVE,
                         "rotation's effect on q_i . k_j of equal contents (every head)",
                         axes=("i - j (query position minus key position)", "mean cos((i - j) theta_k)"),
                         ticks=(distance.long().tolist(),))]


class RotaryMethod(PositionMethod):
    name = "rotary"
    citation = "Su et al. 2021, section 3.4"
    options = (
        MethodOption("rotary", False,
                     "rotary position embedding (RoPE, Su et al. 2021) of queries and keys in every "
                     "layer of the {what}: pairs of dimensions turned by the token position times "
                     "theta_k = 10000^(-2k/d_h); the incremental cache holds rotated keys"),
    )
    benchmark_target = "additive"
    variants = {"rotary": {"rotary": True}}
    labels = {"rotary": "RoPE"}
    combined = {"rotary": True}

    def is_on(self, options: Any) -> bool:
        return options.rotary

    def terms(self, options: Any, layer: LayerSpec) -> List[nn.Module]:
        if layer.head_dim % 2:
            raise PositionOptionError(
                f"{options.flag('rotary')} turns pairs of dimensions: the head size "
                f"{layer.head_dim} (embedding dimension / attention heads) must be even")
        return [RotaryEmbedding(layer.head_dim)]


register(RotaryMethod())
