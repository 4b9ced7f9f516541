"""T5's bucketed relative position bias (Raffel et al. 2020, section 2.1), a baseline.

Each head learns one scalar per *bucket* of the key-minus-query distance ``j - i``; the scalar is
added to the logit of every (query, key) pair in that bucket. Half of the buckets hold the exact
small distances ``0 .. N/2 - 1``; the others cover ``N/2 .. max_distance`` in logarithmically
growing ranges, and every larger distance shares the last bucket. On a bidirectional side the
buckets are split in two halves, one for keys before the query and one for keys after it; on a
causal side keys are never after the query, so every bucket measures ``i - j >= 0``.

As in T5, the table (``N x heads``) is shared by every layer of a side, and initialised to zero
here (training starts from plain attention). The side owns it: :class:`T5Table` is registered once,
as ``{side}.position_shared.t5_table`` (the side registers the modules of ``LayerSpec.shared``),
and each layer's :class:`T5RelativeBias` reads it without registering it. Our kernel adds the bias
to the 1/sqrt(d_h)-scaled logits (T5 itself does not scale its logits): an additive bias like the
others, so it stays on the fused attention path.
"""

import math
from dataclasses import dataclass
from typing import Any, Dict, Hashable, List, Tuple

import torch
from torch import Tensor, nn

from posattn.position_context import PositionContext, Preparation
from posattn.position_terms.base import AdditiveLogitBias, ScoreMod, captured, lookup
from posattn.position_terms.quantities import CURVE, TABLE, Quantity
from posattn.sharding import gathered
from posattn.position_terms.registry import (
    LayerSpec,
    MethodOption,
    PositionMethod,
    PositionOptionError,
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


#: the name of T5's table among a side's shared modules: ``{side}.position_shared.t5_table.weight``
SHARED_TABLE = "t5_table"


class T5Table(nn.Module):
    """A side's ``(buckets x heads)`` table, zero at the start; registered once, by the side."""

    def __init__(self, num_buckets: int, num_heads: int):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(num_buckets, num_heads))


class T5RelativeBias(AdditiveLogitBias):
    """``logits[h, i, j] += table[bucket(i - j), h]``, with the table of the layer's side.

    The term holds the side's :class:`T5Table` without registering it and has no state of its own:
    the table is in the state dict once, under the side, and every layer reads that one parameter.
    """

    def __init__(self, table: T5Table, max_distance: int, bidirectional: bool):
        super().__init__()
        self.num_buckets = table.weight.size(0)
        self.max_distance = max_distance
        self.bidirectional = bidirectional
        object.__setattr__(self, "side_table", table)  # held, not registered (nn.Module would register it)

    @property
    def table(self) -> Tensor:
        """The side's parameter, read at every call (FSDP swaps it for a view of its flat parameter; refused
        where FSDP2 left it sharded: :func:`~posattn.sharding.gathered`)."""
        return gathered(self.side_table.weight, "T5's table (position_shared.t5_table)")

    def side_modules(self) -> List[nn.Module]:
        """The side-wide modules the term reads (the kernel and posattn-inspect count them as the term's)."""
        return [self.side_table]

    def legacy_keys(self) -> Dict[str, str]:
        """Weights saved when every layer registered the table: its key under the layer's term -> its
        key under the side's ``position_shared`` (the side upgrades them when they load)."""
        return {"table": f"{SHARED_TABLE}.weight"}

    def table_key(self, *built_with: Hashable) -> Tuple[Hashable, ...]:
        """Keyed by the side's table: the side's layers add the same bias, built once per sequence."""
        return (self.side_table, *built_with)

    def forward(self, ctx: PositionContext, tgt_len: int, src_len: int) -> Tensor:
        buckets = ctx.prepared(T5Buckets(self.num_buckets, self.max_distance, self.bidirectional, tgt_len, src_len))
        return lookup(self.table, 0, buckets).permute(2, 0, 1).unsqueeze(0)  # 1 x H x Tq x Tk

    def score_mod(self, ctx: PositionContext, q: Tensor, src_len: int) -> ScoreMod:
        """``score + bias[h, i - j]``, where ``bias = table[bucket(i - j), h]`` per head and distance is
        read before the kernel (:func:`~posattn.position_terms.base.captured`), the
        bucket of each distance prepared once per batch."""
        buckets = ctx.prepared(T5DistanceBuckets(self.num_buckets, self.max_distance, self.bidirectional, src_len))
        bias = lookup(captured(self.table), 0, buckets).t()  # H x (2 src_len - 1)
        zero = 2 * src_len - 1 - q.size(2)  # the entry of i - j = 0 for q_idx = kv_idx = 0, shifted to the query

        def t5(score: Tensor, b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
            return score + bias[h, q_idx - kv_idx + zero]
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
                     "2020): N buckets of key-minus-query distances (half exact, half logarithmic; both "
                     "directions on a bidirectional side, one on a causal side), a learned scalar per bucket "
                     "and head, one table shared by the side's layers; 0 = off"),
        MethodOption("t5_max_distance", 128,
                     "with --{side}-t5-relative-bias: distances from this one on share the last bucket"),
    )
    benchmark_target = "additive"
    variants = {"t5-bias": {"t5_relative_bias": 8, "t5_max_distance": 16}}
    labels = {"t5-bias": "T5 relative bias"}
    combined = variants["t5-bias"]

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
        """The layer's term, reading the side's table (made by the first layer, in ``layer.shared``)."""
        if SHARED_TABLE not in layer.shared:
            layer.shared[SHARED_TABLE] = T5Table(options.t5_relative_bias, layer.num_heads)
        return [T5RelativeBias(layer.shared[SHARED_TABLE], options.t5_max_distance, not options.causal)]


register(T5RelativeBiasMethod())
