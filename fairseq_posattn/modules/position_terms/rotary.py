"""Rotary position embedding, RoPE (Su et al. 2021, RoFormer, section 3.4), a baseline.

Queries and keys are rotated by their token position before the dot product: dimensions
``(2k, 2k + 1)`` of a head form a pair that turns by the angle ``p * theta_k``, with
``theta_k = 10000^(-2k / d_h)`` (the paper's eq. 15 and 34, pairs of neighbouring dimensions).
``q_i . k_j`` then depends on the positions only through ``i - j``. The position is the *token*
position (a left-padded sentence turns exactly as when it is alone); in incremental decoding each
key is rotated once, at its own step, before it enters the cache. The angles and the rotation are
computed in fp32 and cast back to the model's dtype. No parameters; applied in every layer.
"""

from typing import Any, List, Optional, Tuple

import torch
from torch import Tensor, nn

from fairseq_posattn.modules.position_context import PositionContext
from fairseq_posattn.modules.position_terms.base import QueryKeyTransform, at_least_fp32
from fairseq_posattn.modules.position_terms.registry import (
    CURVE,
    LayerSpec,
    MethodOption,
    PositionMethod,
    PositionOptionError,
    Quantity,
    register,
)

ROTARY_BASE = 10000.0


def rotary_frequencies(head_dim: int, dtype: torch.dtype, device: Optional[torch.device] = None) -> Tensor:
    """``theta_k = 10000^(-2k / d_h)`` of the ``d_h / 2`` pairs of dimensions."""
    pairs = torch.arange(0, head_dim, 2, device=device, dtype=dtype)
    return ROTARY_BASE ** (-pairs / head_dim)


def rotate_pairs(x: Tensor, angles: Tensor) -> Tensor:
    """Turn each pair ``(x[..., 2k], x[..., 2k + 1])`` by ``angles[..., k]`` (broadcast over x)."""
    dtype = at_least_fp32(x.dtype)
    pairs = x.to(dtype).unflatten(-1, (-1, 2))
    first, second = pairs[..., 0], pairs[..., 1]
    cos, sin = angles.cos().to(dtype), angles.sin().to(dtype)
    turned = torch.stack([first * cos - second * sin, first * sin + second * cos], dim=-1)
    return turned.flatten(-2).to(x.dtype)


class RotaryEmbedding(QueryKeyTransform):
    """RoPE on queries and keys of shape ``(batch, heads, tgt_len, head_dim)``."""

    def __init__(self, head_dim: int):
        super().__init__()
        self.head_dim = head_dim

    def forward(self, q: Tensor, k: Tensor, ctx: PositionContext) -> Tuple[Tensor, Tensor]:
        tgt_len = q.size(2)
        positions, _ = ctx.query_key_positions(tgt_len, ctx.length)  # the current tokens'
        # computed per call in fp32 (fp64 for a double model): a buffer would be cast to fp16 by --fp16
        dtype = at_least_fp32(q.dtype)
        frequencies = rotary_frequencies(self.head_dim, dtype, q.device)
        angles = positions.to(dtype)[:, None, :, None] * frequencies  # B|1 x 1 x T x d/2
        return rotate_pairs(q, angles), rotate_pairs(k, angles)

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
                     "layer of the {what}, by token position"),
    )
    benchmark_target = "additive"
    variants = {"rotary": {"rotary": True}}

    def is_on(self, options: Any) -> bool:
        return options.rotary

    def terms(self, options: Any, layer: LayerSpec) -> List[nn.Module]:
        if layer.head_dim % 2:
            raise PositionOptionError(
                f"{options.flag('rotary')} turns pairs of dimensions: the head size "
                f"{layer.head_dim} (embedding dimension / attention heads) must be even")
        return [RotaryEmbedding(layer.head_dim)]


register(RotaryMethod())
