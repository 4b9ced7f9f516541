"""Relative structural position representations (Wang et al. 2019, 3.2; see docs/methods.md).

Shaw-style key and value embeddings indexed by the clipped relative structural position of each
(query, key) pair, a table of their own; with sequential Shaw embeddings also on, both tables add.
"""

from dataclasses import dataclass, replace
from typing import Any, Callable, List

from torch import Tensor, nn

from fairseq_posattn.modules.position_context import PositionContext
from fairseq_posattn.modules.position_terms.registry import (
    LayerSpec,
    MethodOption,
    PositionMethod,
    PositionOptionError,
    Quantity,
    register,
)
from fairseq_posattn.modules.position_terms.relative_embeddings import RelativeBuckets, RelativePositionEmbeddings


@dataclass(frozen=True)
class StructuralBuckets(RelativeBuckets):
    """``(batch, tgt_len, src_len)``: ``rel_stru(i, j) + r`` (the context clips to ``[-r, r]``)."""

    clip: int
    tgt_len: int
    src_len: int

    def build(self, ctx: PositionContext) -> Tensor:
        return ctx.structural_buckets(self.tgt_len, self.src_len) + self.clip


class StructuralRelativeEmbeddings(RelativePositionEmbeddings):
    """Bucket ``rel_stru(i, j) + r`` with ``rel_stru`` clipped to ``[-r, r]``."""

    positions_only = False  # the bucket comes from the parse

    def buckets(self, tgt_len: int, src_len: int) -> RelativeBuckets:
        return StructuralBuckets(self.clip, tgt_len, src_len)

    def bucket_of(self, ctx: PositionContext, tgt_len: int, src_len: int) -> Callable[[Tensor, Tensor, Tensor], Tensor]:
        """``rel_stru(i, j) + r`` read from the batch's prepared buckets."""
        buckets = ctx.prepared(self.buckets(tgt_len, src_len))
        return lambda b, q_idx, kv_idx: buckets[b, q_idx, kv_idx]

    def inspect(self, positions: int) -> List[Quantity]:
        """The key and value tables, a row per clipped relative structural position."""
        return [replace(q, axes=("relative structural position", "dimension"))
                for q in super().inspect(positions)]


def embeds_tree_depth(options: Any) -> bool:
    """The encoder's input gets the absolute structural embedding of each token's tree depth."""
    return options.structural_positions in ("absolute", "both")


def relates_tree_positions(options: Any) -> bool:
    """Every encoder layer gets the relative structural key/value embeddings."""
    return options.structural_positions in ("relative", "both")


class StructuralPositionsMethod(PositionMethod):
    name = "structural-positions"
    citation = "Wang et al. 2019, section 3"
    sides = ("encoder",)
    options = (
        MethodOption("structural_positions", "none",
                     "structural positions of the source words from their dependency parse (Wang et "
                     "al. 2019; needs --task translation_structural): absolute = sinusoidal "
                     "embedding of the tree depth, relative = Shaw-style key/value embeddings of the "
                     "relative tree position in every encoder layer, or both",
                     choices=("none", "absolute", "relative", "both")),
        MethodOption("structural_fusion", "add",
                     "how the absolute structural embedding joins the sequential one: add (sum) or "
                     "nonlinear (tanh of a learned linear map of both)", choices=("add", "nonlinear")),
        MethodOption("structural_clip", 16, "clip r of the relative structural positions (Wang et al.: 16)"),
        MethodOption("structural_keys_only", False,
                     "relative structural positions with key embeddings only, no value term (as Shaw et "
                     "al.'s Table 3 ablation); runs on flex_attention on a GPU"),
    )
    benchmark_target = "key_value"
    #: structural variants need parses: the tests and the benchmark build them with side data
    variants = {}

    def is_on(self, options: Any) -> bool:
        return options.structural_positions != "none"

    def validate(self, options: Any) -> None:
        if options.structural_clip < 1:
            raise PositionOptionError(
                f"{options.flag('structural_clip')} must be >= 1, got {options.structural_clip}")
        positions = options.flag("structural_positions")
        unused = [(name, "absolute|both") for name, default in (("structural_fusion", "add"),)
                  if getattr(options, name) != default and not embeds_tree_depth(options)]
        unused += [(name, "relative|both") for name, default in (("structural_clip", 16), ("structural_keys_only", False))
                   if getattr(options, name) != default and not relates_tree_positions(options)]
        if unused:
            name, needed = unused[0]
            raise PositionOptionError(
                f"{options.flag(name)} {getattr(options, name)} has no effect without {positions} {needed}; "
                f"add it or drop {options.flag(name)}")

    def needs_max_positions(self, options: Any) -> bool:
        return embeds_tree_depth(options)  # a sinusoid table of t depths

    def terms(self, options: Any, layer: LayerSpec) -> List[nn.Module]:
        if not relates_tree_positions(options):
            return []
        return [StructuralRelativeEmbeddings(layer.head_dim, options.structural_clip,
                                             values=not options.structural_keys_only)]


register(StructuralPositionsMethod())
