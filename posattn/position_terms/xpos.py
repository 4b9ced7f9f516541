"""xPos: the length-extrapolatable rotary embedding (Sun et al. 2022, "A Length-Extrapolatable Transformer",
section 3.2), a baseline.

xPos is RoPE (:mod:`rotary`) with an exponential decay: the pair ``(2k, 2k + 1)`` of the query at position
n is turned by ``n theta_k`` (``theta_k = 10000^(-2k/d_h)``, as RoPE) and scaled by ``zeta_k^(n/B)``, the key at
position m turned by ``m theta_k`` and scaled by ``zeta_k^(-m/B)``, with

    zeta_k = (2k/d_h + gamma) / (1 + gamma),  gamma = 0.4,   B = 512 (the scale base)

so that ``q_n . k_m`` depends on the positions through ``n - m`` only, each pair's rotation damped by
``zeta_k^((n - m)/B) <= 1`` for ``m <= n``: the fast-turning pairs (small k, small zeta_k) fade with distance,
the slow ones (zeta_k near 1) hardly. Like RoPE, the position is the *token* position and, in incremental
decoding, each key is transformed once, at its own step, before it enters the cache.

Choices:

- **no centre.** ``zeta_k^(n/B)`` shrinks and ``zeta_k^(-m/B)`` grows with the position; the authors' code
  (torchscale) counts positions from the middle of the current length to keep both near 1, which leaves
  ``q . k`` unchanged but not a query's product with anything else (Shaw's key embeddings on the same
  layer), and moves at every decoding step (it transforms every cached key again). We scale by the
  token position itself, as the paper writes it, and cache transformed keys. The price is range: at
  B = 512 the smallest zeta, 0.29, scales the key at position 4,096 by 2.2e4, past fp16's range for a key
  of norm 3. A sequence is refused, in one line, from the length on where the largest key scale passes a
  hundredth of the model dtype's largest value (:meth:`XPosEmbedding.longest`: at B = 512, 2,650 tokens in
  fp16, 34,300 in bf16 and fp32), where it would otherwise end in inf and NaN.
- **the scales and the rotation** are computed in fp32 (fp64 for a double model) and the result cast back to
  the model's dtype.
- **a bidirectional side (an encoder)**, which the paper does not consider, gets the same transform (its
  definition needs no causality): a key *after* the query is then weighted up, ``zeta_k^((n - m)/B) > 1``,
  mirroring the decay of the keys before it.
- with ``--{side}-rotary`` too, both transforms apply (RoPE first): the pairs turn twice as far, a
  combination no paper uses (the tests' all-at-once model uses it).
"""

import math
from dataclasses import dataclass
from typing import Any, List, Optional, Tuple

import torch
from torch import Tensor, nn

from posattn.position_context import PositionContext, Preparation
from posattn.position_terms.base import QueryKeyTransform, SequenceTooLongError, at_least_fp32
from posattn.position_terms.quantities import CURVE, Quantity
from posattn.position_terms.registry import (
    LayerSpec,
    MethodOption,
    PositionMethod,
    PositionOptionError,
    register,
)
from posattn.position_terms.rotary import rotary_frequencies, rotate_pairs, rotation_tables

#: the paper's gamma in zeta_k = (2k/d_h + gamma) / (1 + gamma)
XPOS_GAMMA = 0.4
#: the factor below a dtype's largest value that the largest key scale must stay (the key's own entries)
KEY_ROOM = 100.0


def xpos_zeta(head_dim: int, dtype: torch.dtype, device: Optional[torch.device] = None) -> Tensor:
    """``zeta_k = (2k/d_h + 0.4) / 1.4`` of the ``d_h / 2`` pairs of dimensions."""
    pairs = torch.arange(0, head_dim, 2, device=device, dtype=dtype)
    return (pairs / head_dim + XPOS_GAMMA) / (1 + XPOS_GAMMA)


def decays_nothing(scale_base: int, positions: int) -> bool:
    """The fastest decay over ``positions`` positions, ``zeta_0^((positions - 1)/B)``, rounds to 1 in float32 (at
    least one position apart): every scale of the tables is 1, the transform RoPE's."""
    decay = (XPOS_GAMMA / (1 + XPOS_GAMMA)) ** (max(positions - 1, 1) / scale_base)
    return torch.tensor(decay, dtype=torch.float32).item() == 1.0


@dataclass(frozen=True)
class XPosTables(Preparation):
    """The current tokens' rotation tables scaled for the queries and for the keys, ``(4, batch or 1, 1,
    tgt_len, head_dim)``: ``cos zeta^s``, ``signed sin zeta^s``, ``cos zeta^-s``, ``signed sin zeta^-s`` with
    ``s = p / scale_base``, each value per dimension, in ``dtype`` (fp32 at least)."""

    head_dim: int
    scale_base: int
    tgt_len: int
    dtype: torch.dtype

    def build(self, ctx: PositionContext) -> Tensor:
        positions, _ = ctx.query_key_positions(self.tgt_len, ctx.length)  # the current tokens'
        positions = positions.to(self.dtype)[:, None, :, None]
        cos, signed_sin = rotation_tables(positions * rotary_frequencies(self.head_dim, self.dtype, positions.device))
        zeta = xpos_zeta(self.head_dim, self.dtype, positions.device)
        scale = (zeta ** (positions / self.scale_base)).repeat_interleave(2, dim=-1)
        return torch.stack([cos * scale, signed_sin * scale, cos / scale, signed_sin / scale])


class XPosEmbedding(QueryKeyTransform):
    """xPos on queries and keys of shape ``(batch, heads, tgt_len, head_dim)``."""

    def __init__(self, head_dim: int, scale_base: int):
        super().__init__()
        self.head_dim, self.scale_base = head_dim, scale_base

    def extra_repr(self) -> str:
        return f"head_dim={self.head_dim}, scale_base={self.scale_base}"

    def longest(self, dtype: torch.dtype) -> int:
        """The longest sequence whose largest key scale ``zeta_0^(-m/B)`` stays below a hundredth of ``dtype``'s
        largest value (room for the key's own entries)."""
        smallest_zeta = XPOS_GAMMA / (1 + XPOS_GAMMA)  # zeta_0, of the pair k = 0 (no tensor: no graph break)
        return int(self.scale_base * math.log(torch.finfo(dtype).max / KEY_ROOM) / -math.log(smallest_zeta))

    def forward(self, q: Tensor, k: Tensor, ctx: PositionContext) -> Tuple[Tensor, Tensor]:
        tgt_len, dtype, length = q.size(2), at_least_fp32(q.dtype), ctx.length
        if length > self.longest(q.dtype):
            raise SequenceTooLongError(
                f"a sequence of {length} tokens is longer than xPos reaches in {str(q.dtype).split('.')[-1]}: its "
                f"key scales zeta^(-m/B) (scale base B = {self.scale_base}) pass the type's range from "
                f"{self.longest(q.dtype) + 1} tokens on; read shorter windows, a wider type or a larger scale base")
        table = ctx.sequence_table(  # incremental decoding: the sequence's tables, sliced per step
            (XPosTables, self.head_dim, self.scale_base, dtype), length,
            lambda n: self.tables(PositionContext.unpadded(n, q.device), n, dtype), length_dim=-2)
        if table is None:
            table = ctx.prepared(XPosTables(self.head_dim, self.scale_base, tgt_len, dtype))
        else:
            table = table[..., length - tgt_len : length, :]
        query_cos, query_sin, key_cos, key_sin = table
        return rotate_pairs(q, query_cos, query_sin), rotate_pairs(k, key_cos, key_sin)

    def tables(self, ctx: PositionContext, tgt_len: int, dtype: torch.dtype) -> Tensor:
        """:class:`XPosTables` of ``tgt_len`` current tokens."""
        return XPosTables(self.head_dim, self.scale_base, tgt_len, dtype).build(ctx)

    def inspect(self, positions: int) -> List[Quantity]:
        """Nothing is learned; shown is what the transform alone does to a logit: ``q_i . k_j`` of a query and
        a key equal to the same vector of ones, over ``|q| |k|``, i.e. the mean over the pairs k of
        ``cos((i - j) theta_k) zeta_k^((i - j)/B)``, for the first ``positions`` positions (every head alike)."""
        distance = torch.arange(-(positions - 1), positions, dtype=torch.float64)
        angles = distance[:, None] * rotary_frequencies(self.head_dim, torch.float64)
        decay = xpos_zeta(self.head_dim, torch.float64) ** (distance[:, None] / self.scale_base)
        pattern = (torch.cos(angles) * decay).mean(dim=1)
        return [Quantity("decay-pattern", pattern[None].float(), CURVE,
                         "rotation and decay's effect on q_i . k_j of equal contents (every head)",
                         axes=("i - j (query position minus key position)",
                               "mean cos((i - j) theta_k) zeta_k^((i - j)/B)"),
                         ticks=(distance.long().tolist(),))]


class XPosMethod(PositionMethod):
    name = "xpos"
    citation = "Sun et al. 2022, section 3.2"
    options = (
        MethodOption("xpos", False,
                     "xPos (Sun et al. 2022) on queries and keys in every layer of the {what}: RoPE's rotation "
                     "by the token position, the query scaled by zeta_k^(n/B) and the key by zeta_k^(-m/B), "
                     "zeta_k = (2k/d_h + 0.4) / 1.4, so that pairs decay with n - m; the incremental cache "
                     "holds transformed keys"),
        MethodOption("xpos_scale_base", 512, "with --{side}-xpos: the scale base B (the paper: 512)"),
    )
    benchmark_target = "additive"
    variants = {"xpos": {"xpos": True}}
    labels = {"xpos": "xPos"}
    combined = {"xpos": True}

    def is_on(self, options: Any) -> bool:
        return options.xpos

    def validate(self, options: Any) -> None:
        if options.xpos_scale_base < 1:
            raise PositionOptionError(
                f"{options.flag('xpos_scale_base')} must be positive, got {options.xpos_scale_base}")
        if not self.is_on(options) and options.xpos_scale_base != 512:
            raise PositionOptionError(
                f"{options.flag('xpos_scale_base')} {options.xpos_scale_base} has no effect without "
                f"{options.flag('xpos')}; add it or drop {options.flag('xpos_scale_base')}")
        if self.is_on(options) and decays_nothing(options.xpos_scale_base, options.max_positions):
            raise PositionOptionError(
                f"{options.flag('xpos_scale_base')} must leave some decay over the {options.max_positions} positions "
                f"of {options.max_positions_option}, got {options.xpos_scale_base} (zeta^(n/B) rounds to 1 in "
                f"float32: xPos would be RoPE, {options.flag('rotary')})")

    def terms(self, options: Any, layer: LayerSpec) -> List[nn.Module]:
        if layer.head_dim % 2:
            raise PositionOptionError(
                f"{options.flag('xpos')} turns pairs of dimensions: the head size "
                f"{layer.head_dim} (embedding dimension / attention heads) must be even")
        return [XPosEmbedding(layer.head_dim, options.xpos_scale_base)]


register(XPosMethod())
