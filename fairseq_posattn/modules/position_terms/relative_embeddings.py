"""Relative position representations (Shaw et al. 2018, section 3; see docs/methods.md).

Key and value embeddings ``a^K, a^V`` of size d_h, indexed by a bucket per (query, key) pair and
shared across heads. The logit term is computed with the relative-to-absolute gather: ``q a^K^T``
once per bucket, then gathered into (query, key) cells, never a (T, T, d_h) tensor.
"""

from typing import Any, List

import torch
from torch import Tensor, nn

from fairseq_posattn.modules.position_context import PositionContext
from fairseq_posattn.modules.position_terms.base import KeyValueAugmentation
from fairseq_posattn.modules.position_terms.registry import (
    TABLE,
    LayerSpec,
    MethodOption,
    PositionMethod,
    PositionOptionError,
    Quantity,
    register,
)


class RelativePositionEmbeddings(KeyValueAugmentation):
    """Shaw et al.: bucket ``clip(j - i, -k, k) + k`` of the sequential distance."""

    def __init__(self, head_dim: int, clip: int):
        super().__init__()
        self.clip = clip
        self.key_table = nn.Parameter(torch.empty(2 * clip + 1, head_dim))
        self.value_table = nn.Parameter(torch.empty(2 * clip + 1, head_dim))
        nn.init.xavier_uniform_(self.key_table)
        nn.init.xavier_uniform_(self.value_table)

    def buckets(self, ctx: PositionContext, tgt_len: int, src_len: int) -> Tensor:
        """Bucket index per (query, key): ``(tgt_len, src_len)`` or ``(batch, tgt_len, src_len)``."""
        return (-ctx.relative_distances(tgt_len, src_len)).clamp(-self.clip, self.clip) + self.clip

    def _expanded_buckets(self, ctx: PositionContext, batch: int, heads: int, tgt_len: int, src_len: int) -> Tensor:
        """:meth:`buckets` as ``(batch, heads, tgt_len, src_len)``, once per batch for every layer."""
        def compute() -> Tensor:
            buckets = self.buckets(ctx, tgt_len, src_len)
            if buckets.dim() == 3:
                buckets = buckets.unsqueeze(1)
            return buckets.expand(batch, heads, tgt_len, src_len)

        return ctx.geometry((type(self).__name__, self.clip, batch, heads, tgt_len, src_len), compute)

    def key_logits(self, q: Tensor, ctx: PositionContext, tgt_len: int, src_len: int) -> Tensor:
        per_bucket = torch.matmul(q, self.key_table.to(q.dtype).t())  # B x H x Tq x buckets
        buckets = self._expanded_buckets(ctx, q.size(0), q.size(1), tgt_len, src_len)
        return per_bucket.gather(-1, buckets)

    def value_output(self, probs: Tensor, ctx: PositionContext) -> Tensor:
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
                                           ("value", "value embeddings a^V", self.value_table))]


class RelativePositionsMethod(PositionMethod):
    name = "relative-positions"
    citation = "Shaw et al. 2018, section 3"
    options = (
        MethodOption("relative_positions", 0,
                     "Shaw et al. (2018) relative position representations with clip distance k in every "
                     "layer of the {what} (Transformer-RPR); 0 = off"),
    )
    benchmark_target = "key_value"
    variants = {"shaw": {"relative_positions": 3}}

    def is_on(self, options: Any) -> bool:
        return options.relative_positions > 0

    def validate(self, options: Any) -> None:
        if options.relative_positions < 0:
            raise PositionOptionError(
                f"{options.flag('relative_positions')} is a clip distance k >= 1 (0 = off), "
                f"got {options.relative_positions}")

    def terms(self, options: Any, layer: LayerSpec) -> List[nn.Module]:
        return [RelativePositionEmbeddings(layer.head_dim, options.relative_positions)]


register(RelativePositionsMethod())
