"""T5's bucketed relative position bias (Raffel et al. 2020, section 2.1), a baseline.

Each head learns one scalar per *bucket* of the key-minus-query distance ``j - i``; the scalar is
added to the logit of every (query, key) pair in that bucket. Half of the buckets hold the exact
small distances ``0 .. N/2 - 1``; the others cover ``N/2 .. max_distance`` in logarithmically
growing ranges, and every larger distance shares the last bucket. On a bidirectional side the
buckets are split in two halves, one for keys before the query and one for keys after it; on a
causal side keys are never after the query, so every bucket measures ``i - j >= 0``.

As in T5, the table (``N x heads``) is shared by every layer of a side, and initialised to zero
here (training starts from plain attention). Our kernel adds it to the 1/sqrt(d_h)-scaled logits
(T5 itself does not scale its logits): an additive bias like the others, so it stays on the fused
attention path.
"""

import math
from dataclasses import dataclass
from typing import Any, List

import torch
from torch import Tensor, nn

from fairseq_posattn.modules.position_context import PositionContext, Preparation
from fairseq_posattn.modules.position_terms.base import AdditiveLogitBias, ScoreMod, lookup
from fairseq_posattn.modules.position_terms.registry import (
    CURVE,
    TABLE,
    LayerSpec,
    MethodOption,
    PositionMethod,
    PositionOptionError,
    Quantity,
    register,
)


def relative_buckets(distance: Tensor, num_buckets: int, max_distance: int, bidirectional: bool) -> Tensor:
    """T5's bucket of each query-minus-key distance ``i - j`` (long tensor of any shape)."""
    buckets = torch.zeros_like(distance)
    if bidirectional:
        num_buckets //= 2
        buckets = buckets + (distance < 0).long() * num_buckets  # keys after the query
        distance = distance.abs()
    else:
        distance = distance.clamp(min=0)
    exact = num_buckets // 2
    scale = (num_buckets - exact) / math.log(max_distance / exact)
    logarithmic = exact + (torch.log(distance.clamp(min=1).float() / exact) * scale).long()
    logarithmic = logarithmic.clamp(max=num_buckets - 1)
    return buckets + torch.where(distance < exact, distance, logarithmic)


@dataclass(frozen=True)
class T5Buckets(Preparation):
    """``(tgt_len, src_len)``: the bucket of each query and key (:func:`relative_buckets`)."""

    num_buckets: int
    max_distance: int
    bidirectional: bool
    tgt_len: int
    src_len: int

    def build(self, ctx: PositionContext) -> Tensor:
        return relative_buckets(ctx.relative_distances(self.tgt_len, self.src_len), self.num_buckets,
                                self.max_distance, self.bidirectional)


@dataclass(frozen=True)
class T5DistanceBuckets(Preparation):
    """``(2 length - 1,)``: the bucket of each distance ``i - j = -(length - 1) .. length - 1``."""

    num_buckets: int
    max_distance: int
    bidirectional: bool
    length: int

    def build(self, ctx: PositionContext) -> Tensor:
        distance = torch.arange(-(self.length - 1), self.length, device=ctx.padding_mask.device)
        return relative_buckets(distance, self.num_buckets, self.max_distance, self.bidirectional)


class T5RelativeBias(AdditiveLogitBias):
    """``logits[h, i, j] += table[bucket(i - j), h]``, one table shared by a side's layers."""

    def __init__(self, num_heads: int, num_buckets: int, max_distance: int, bidirectional: bool):
        super().__init__()
        self.num_buckets = num_buckets
        self.max_distance = max_distance
        self.bidirectional = bidirectional
        self.table = nn.Parameter(torch.zeros(num_buckets, num_heads))

    def forward(self, ctx: PositionContext, tgt_len: int, src_len: int) -> Tensor:
        buckets = ctx.prepared(T5Buckets(self.num_buckets, self.max_distance, self.bidirectional, tgt_len, src_len))
        return lookup(self.table, 0, buckets).permute(2, 0, 1).unsqueeze(0)  # 1 x H x Tq x Tk

    def score_mod(self, ctx: PositionContext, q: Tensor, src_len: int) -> ScoreMod:
        """``score + table[bucket(i - j), h]``, the bucket of each distance prepared once per batch."""
        table = self.table
        buckets = ctx.prepared(T5DistanceBuckets(self.num_buckets, self.max_distance, self.bidirectional, src_len))
        zero = 2 * src_len - 1 - q.size(2)  # the entry of i - j = 0 for q_idx = kv_idx = 0, shifted to the query

        def t5(score: Tensor, b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
            return score + table[buckets[q_idx - kv_idx + zero], h]
        return t5

    def inspect(self, positions: int) -> List[Quantity]:
        """The table (bucket x head), and each head's bias over ``i - j`` for the first
        ``positions`` positions (``i - j >= 0`` only on a causal side)."""
        table = self.table.detach().cpu()
        distance = torch.arange(-(positions - 1) if self.bidirectional else 0, positions)
        buckets = relative_buckets(distance, self.num_buckets, self.max_distance, self.bidirectional)
        return [Quantity("table", table, TABLE, f"learned bias per bucket (max distance {self.max_distance})",
                         axes=("bucket", "head")),
                Quantity("bias", table[buckets].t(), CURVE, "learned bias over i - j",
                         axes=("i - j (query position minus key position)", "bias"),
                         ticks=(distance.tolist(),))]


class T5RelativeBiasMethod(PositionMethod):
    name = "t5-relative-bias"
    citation = "Raffel et al. 2020, section 2.1"
    options = (
        MethodOption("t5_relative_bias", 0,
                     "T5's bucketed relative position bias in every layer of the {what} (Raffel et al. "
                     "2020): N buckets of key-minus-query distances, a learned scalar per bucket and head, "
                     "one table shared by the side's layers; 0 = off"),
        MethodOption("t5_max_distance", 128,
                     "with --{side}-t5-relative-bias: distances from this one on share the last bucket"),
    )
    benchmark_target = "additive"
    variants = {"t5-bias": {"t5_relative_bias": 8, "t5_max_distance": 16}}

    def is_on(self, options: Any) -> bool:
        return options.t5_relative_bias > 0

    def validate(self, options: Any) -> None:
        buckets, distance = options.t5_relative_bias, options.t5_max_distance
        if buckets < 0 or buckets == 1 or (not options.causal and 0 < buckets < 4):
            least = 2 if options.causal else 4
            raise PositionOptionError(
                f"{options.flag('t5_relative_bias')} needs at least {least} buckets (0 = off), got {buckets}")
        exact = (buckets // 2 if options.causal else buckets // 4) if buckets else 1
        if self.is_on(options) and distance <= exact:
            raise PositionOptionError(
                f"{options.flag('t5_max_distance')} must exceed the {exact} exact buckets of "
                f"{options.flag('t5_relative_bias')} {buckets}, got {distance}")
        if not self.is_on(options) and distance != 128:
            raise PositionOptionError(
                f"{options.flag('t5_max_distance')} {distance} has no effect without "
                f"{options.flag('t5_relative_bias')} N; add it or drop the distance option")

    def terms(self, options: Any, layer: LayerSpec) -> List[nn.Module]:
        if self.name not in layer.shared:
            layer.shared[self.name] = T5RelativeBias(
                layer.num_heads, options.t5_relative_bias, options.t5_max_distance, not options.causal)
        return [layer.shared[self.name]]


register(T5RelativeBiasMethod())
