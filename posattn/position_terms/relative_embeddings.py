"""Relative position representations (Shaw et al. 2018, section 3; see docs/methods.md).

Key and value embeddings ``a^K, a^V`` of size d_h, indexed by a bucket per (query, key) pair and
shared across heads. The logit term is computed with the relative-to-absolute gather: ``q a^K^T``
once per bucket, then gathered into (query, key) cells, never a (T, T, d_h) tensor.
"""

from dataclasses import dataclass
from typing import Any, Callable, List, Optional

import torch
from torch import Tensor, nn

from posattn.position_context import PositionContext, Preparation
from posattn.position_terms.base import KeyValueAugmentation, ScoreMod, captured
from posattn.position_terms.quantities import TABLE, Quantity
from posattn.position_terms.registry import (
    LayerSpec,
    MethodOption,
    PositionMethod,
    PositionOptionError,
    register,
)


class RelativeBuckets(Preparation):
    """``(tgt_len, src_len)`` or ``(batch, tgt_len, src_len)``: the bucket of each (query, key) pair
    (subclasses are frozen dataclasses with ``tgt_len`` and ``src_len`` fields)."""

    tgt_len: int
    src_len: int


@dataclass(frozen=True)
class SequentialBuckets(RelativeBuckets):
    """Shaw et al.'s bucket ``clip(j - i, -k, k) + k``."""

    clip: int
    tgt_len: int
    src_len: int

    def build(self, ctx: PositionContext) -> Tensor:
        return (-ctx.relative_distances(self.tgt_len, self.src_len)).clamp(-self.clip, self.clip) + self.clip


@dataclass(frozen=True)
class ExpandedBuckets(Preparation):
    """``buckets`` as ``(batch, heads, tgt_len, src_len)`` (an expanded view)."""

    buckets: RelativeBuckets
    batch: int
    heads: int

    def build(self, ctx: PositionContext) -> Tensor:
        buckets = ctx.prepared(self.buckets)
        if buckets.dim() == 3:
            buckets = buckets.unsqueeze(1)
        return buckets.expand(self.batch, self.heads, self.buckets.tgt_len, self.buckets.src_len)


class RelativePositionEmbeddings(KeyValueAugmentation):
    """Shaw et al.: bucket ``clip(j - i, -k, k) + k`` of the sequential distance."""

    #: the bucket is a function of the query and key positions alone (not of a parse): a decoding step
    #: reads its keys' embeddings from one table per sequence (:meth:`step_embeddings`)
    positions_only = True

    def __init__(self, head_dim: int, clip: int, values: bool = True):
        """``values``: the value term too (the paper's model); False: keys only (Shaw et al.'s
        Table 3 ablation), which has a pointwise form (:meth:`score_mod`) and fuses."""
        super().__init__()
        self.clip = clip
        self.values = values
        self.key_table = nn.Parameter(torch.empty(2 * clip + 1, head_dim))
        nn.init.xavier_uniform_(self.key_table)
        self.value_table = nn.Parameter(torch.empty(2 * clip + 1, head_dim)) if values else None
        if values:
            nn.init.xavier_uniform_(self.value_table)

    def buckets(self, tgt_len: int, src_len: int) -> "RelativeBuckets":
        """The prepared bucket index per (query, key)."""
        return SequentialBuckets(self.clip, tgt_len, src_len)

    def bucket_of(self, ctx: PositionContext, tgt_len: int, src_len: int) -> Callable[[Tensor, Tensor, Tensor], Tensor]:
        """``bucket(b, q_idx, kv_idx)`` of :meth:`buckets`, pointwise: ``clip(j - i, -k, k) + k``."""
        clip, offset = self.clip, src_len - tgt_len
        return lambda b, q_idx, kv_idx: (kv_idx - q_idx - offset).clamp(-clip, clip) + clip

    def score_mod(self, ctx: PositionContext, q: Tensor, src_len: int) -> Optional[ScoreMod]:
        """Keys only: ``score + q_i . a^K[bucket(i, j)]``, from ``q a^K^T`` per bucket (this call's);
        None with the value term, which needs the attention weights."""
        if self.values:
            return None
        per_bucket = captured(torch.matmul(q, self.key_table.to(q.dtype).t()))  # B x H x Tq x buckets
        bucket = self.bucket_of(ctx, q.size(2), src_len)
        return lambda score, b, h, q_idx, kv_idx: score + per_bucket[b, h, q_idx, bucket(b, q_idx, kv_idx)]

    def _expanded_buckets(self, ctx: PositionContext, batch: int, heads: int, tgt_len: int, src_len: int) -> Tensor:
        """:meth:`buckets` as ``(batch, heads, tgt_len, src_len)``, prepared once per batch for every layer."""
        return ctx.prepared(ExpandedBuckets(self.buckets(tgt_len, src_len), batch, heads))

    def step_embeddings(self, name: str, ctx: PositionContext, tgt_len: int, src_len: int,
                        dtype: torch.dtype) -> Optional[Tensor]:
        """In a decoding step of one query (the last of ``src_len`` tokens): ``(src_len, head_dim)``, the
        embedding ``table[clip(j - i, -k, k) + k]`` of every key j, where ``table`` is the parameter
        ``name``; a slice of a table built once per sequence. None outside such a step."""
        if tgt_len != 1 or not self.positions_only or ctx.tables is None:
            return None
        table, clip = getattr(self, name), self.clip

        def build(n: int) -> Tensor:  # row m: the key at m for the query at n - 1
            keys = torch.arange(n, device=table.device)
            return table.to(dtype)[(keys - (n - 1)).clamp(-clip, clip) + clip]
        rows = ctx.sequence_table(self.table_key(name, dtype), src_len, build, length_dim=0)
        return rows[rows.size(0) - src_len:]

    def key_logits(self, q: Tensor, ctx: PositionContext, tgt_len: int, src_len: int) -> Tensor:
        rows = self.step_embeddings("key_table", ctx, tgt_len, src_len, q.dtype)
        if rows is not None:
            return torch.matmul(q, rows.t())
        per_bucket = captured(torch.matmul(q, self.key_table.to(q.dtype).t()))  # B x H x Tq x buckets
        buckets = self._expanded_buckets(ctx, q.size(0), q.size(1), tgt_len, src_len)
        return per_bucket.gather(-1, buckets)

    def value_output(self, probs: Tensor, ctx: PositionContext) -> Tensor:
        rows = self.step_embeddings("value_table", ctx, probs.size(2), probs.size(3), probs.dtype)
        if rows is not None:
            return torch.matmul(probs, rows)
        buckets = self._expanded_buckets(ctx, *probs.shape)
        mass = probs.new_zeros(probs.shape[:-1] + (self.value_table.size(0),))
        mass.scatter_add_(-1, buckets, probs)  # attention mass per bucket
        return torch.matmul(mass, self.value_table.to(probs.dtype))

    def inspect(self, positions: int) -> List[Quantity]:
        """The key and value tables, a row per clipped distance ``j - i`` (no position axis:
        ``positions`` is unused)."""
        ticks = (list(range(-self.clip, self.clip + 1)), list(range(self.key_table.size(1))))
        return [Quantity(name, table.detach().cpu(), TABLE, f"{title} (clip {self.clip})",
                         axes=("j - i", "dimension"), ticks=ticks)
                for name, title, table in (("key", "key embeddings a^K", self.key_table),
                                           ("value", "value embeddings a^V", self.value_table))
                if table is not None]


class RelativePositionsMethod(PositionMethod):
    name = "relative-positions"
    citation = "Shaw et al. 2018, section 3"
    options = (
        MethodOption("relative_positions", 0,
                     "Shaw et al. (2018) relative position representations with clip distance k in every "
                     "layer of the {what} (Transformer-RPR); 0 = off"),
        MethodOption("relative_positions_keys_only", False,
                     "with --{side}-relative-positions: key embeddings only, no value term (Shaw et al.'s "
                     "Table 3 ablation); runs on flex_attention on a GPU", keys_only=True),
    )
    benchmark_target = "key_value"
    variants = {"shaw": {"relative_positions": 3},
                "shaw-keys-only": {"relative_positions": 3, "relative_positions_keys_only": True}}
    labels = {"shaw": "Transformer-RPR", "shaw-keys-only": "Transformer-RPR, keys only"}
    combined = {"relative_positions": 2}

    def is_on(self, options: Any) -> bool:
        return options.relative_positions > 0

    def validate(self, options: Any) -> None:
        if options.relative_positions < 0:
            raise PositionOptionError(
                f"{options.flag('relative_positions')} is a clip distance k >= 1 (0 = off), "
                f"got {options.relative_positions}")
        if options.relative_positions_keys_only and not self.is_on(options):
            raise PositionOptionError(
                f"{options.flag('relative_positions_keys_only')} has no effect without "
                f"{options.flag('relative_positions')} k; add it or drop the keys-only option")

    def terms(self, options: Any, layer: LayerSpec) -> List[nn.Module]:
        return [RelativePositionEmbeddings(layer.head_dim, options.relative_positions,
                                           values=not options.relative_positions_keys_only)]


register(RelativePositionsMethod())
