"""Structural positions (Wang et al. 2019, section 3; see docs/methods.md), from each source sentence's parse.

- **Absolute** (eq. 5 and 7): the tree depth of each token's word goes through the *same* sinusoidal function
  as fairseq's sequential positions (fairseq offsets positions by ``padding_idx + 1``; depth d uses the row that
  sequential position d uses), and joins the sequential embedding by ``add`` (the parameter-free sum, the
  paper's footnote 1) or ``nonlinear``: ``tanh(W [PE_seq ; PE_stru] + b)``, a learned fusion (the paper's
  f_abs, eq. 7, whose form the paper leaves open). Without sequential embeddings
  (``--encoder-no-token-positional-embeddings``) the structural one is used alone.
- **Relative** (3.2): Shaw-style key and value embeddings indexed by the clipped relative structural position
  of each (query, key) pair, a table of their own; with sequential Shaw embeddings also on, both tables add.

Both read the parse that ``--task translation_structural`` collates into every batch (:data:`PARSE`, in the
context's ``side_data``); the relative positions are derived once per batch by a :class:`StructuralBuckets`
preparation.
"""

import math
from dataclasses import dataclass, replace
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from posattn.position_context import PositionContext
from posattn.position_terms.base import check_length
from posattn.position_terms.quantities import Quantity, SideDataTrace
from posattn.position_terms.registry import (
    LayerSpec,
    MethodOption,
    PositionMethod,
    PositionOptionError,
    register,
)
from posattn.position_terms.relative_embeddings import RelativeBuckets, RelativePositionEmbeddings
from posattn.position_terms.side_inputs import BatchSideData, InputPositionEmbedding

#: the clip r of the relative structural positions in Wang et al. 2019's experiments (the option's default)
WANG_CLIP = 16

#: the rows of a parse's per-token side data: each token's word's tree depth and the entry and exit times of
#: that word in a depth-first walk of the parse (EOS and pads: depth 0, ``tin = tout = -1``)
PARSE_FIELDS = ("depth", "tin", "tout")


def structural_relative(depth: Tensor, tin: Tensor, tout: Tensor, clip: int) -> Tensor:
    """Relative structural positions of a batch (Wang et al. 2019, section 3.2), vectorised: ``(batch, length,
    length)`` from the ``(batch, length)`` side data of :data:`PARSE`.

    Word a is an ancestor of (or is) word b exactly when ``tin[a] <= tin[b]`` and ``tout[b] <= tout[a]``. EOS
    and pads have ``tin = -1``: on no path.

    ``rel[i, j] = depth_i - depth_j`` if the words of i and j lie on one path to the root (pieces of
    one word included), else ``sign(i - j) * (depth_i + depth_j)``; clipped to ``[-clip, clip]``.
    Query-minus-key index order equals token order under any padding, so ``sign(i - j)`` is taken
    from indices.
    """
    length = depth.size(1)
    special = tin < 0
    ancestor = (tin[:, :, None] <= tin[:, None, :]) & (tout[:, None, :] <= tout[:, :, None])
    on_path = (ancestor | ancestor.transpose(1, 2)) & ~special[:, :, None] & ~special[:, None, :]
    index = torch.arange(length, device=depth.device)
    sign = torch.sign(index[:, None] - index[None, :])
    rel = torch.where(
        on_path, depth[:, :, None] - depth[:, None, :], sign * (depth[:, :, None] + depth[:, None, :])
    )
    return rel.clamp(-clip, clip)


def parse_of(ctx: PositionContext) -> Tuple[Tensor, Tensor, Tensor]:
    """The batch's :data:`PARSE` side data, or a clear error where the batch carries none."""
    if not all(name in ctx.side_data for name in PARSE_FIELDS):
        raise ValueError("structural positions need the parse side data of each sentence: train and "
                         "translate with --task translation_structural")
    depth, tin, tout = (ctx.side_data[name] for name in PARSE_FIELDS)
    return depth, tin, tout


def binary_tree_side_data(length: int) -> Tuple[List[int], List[int], List[int]]:
    """``depth``, ``tin``, ``tout`` of ``length`` tokens: two BPE pieces per word, the words a complete
    binary tree in heap order (word w's head is word (w - 1) // 2), the last token EOS (``tin = -1``)."""
    words = [token // 2 for token in range(length - 1)]
    count = length // 2  # words of the length - 1 pieces
    tin, tout, clock, stack = [0] * count, [0] * count, 0, [(0, False)] if count else []
    while stack:  # a depth-first walk: entry and exit times of every word
        word, leaving = stack.pop()
        if leaving:
            tout[word], clock = clock, clock + 1
            continue
        tin[word], clock = clock, clock + 1
        stack.append((word, True))
        stack.extend((child, False) for child in (2 * word + 2, 2 * word + 1) if child < count)
    return ([(w + 1).bit_length() - 1 for w in words] + [0], [tin[w] for w in words] + [-1],
            [tout[w] for w in words] + [-1])


def example_parse(padding_mask: Tensor) -> Dict[str, Tensor]:
    """Parse side data (:data:`PARSE_FIELDS`) of a batch padded as ``padding_mask``: each sentence a complete
    binary tree of two-piece words, EOS last (:func:`binary_tree_side_data`), ``tin = tout = -1`` and depth 0
    at pads."""
    batch, longest = padding_mask.shape
    data = {name: torch.full((batch, longest), -1, dtype=torch.long) for name in PARSE_FIELDS}
    real = ~padding_mask.cpu()
    for row in range(batch):
        tokens = real[row].nonzero().flatten()
        for name, values in zip(PARSE_FIELDS, binary_tree_side_data(tokens.numel())):
            data[name][row, tokens] = torch.tensor(values)
    data["depth"].clamp_(min=0)
    return {name: values.to(padding_mask.device) for name, values in data.items()}


#: the parse of every source sentence, as ``--task translation_structural`` collates it: ``net_input
#: ["src_structure"]`` ``(batch, 3, src_len)``
PARSE = BatchSideData("src_structure", PARSE_FIELDS, "each source sentence's dependency parse",
                      "--task translation_structural", example_parse, shown_as="structure")


@dataclass(frozen=True)
class StructuralBuckets(RelativeBuckets):
    """``(batch, tgt_len, src_len)``: ``rel_stru(i, j) + r``, ``rel_stru`` clipped to ``[-r, r]``."""

    clip: int
    tgt_len: int
    src_len: int

    def build(self, ctx: PositionContext) -> Tensor:
        relative = structural_relative(*parse_of(ctx), self.clip)
        return relative[:, self.src_len - self.tgt_len : self.src_len, : self.src_len] + self.clip


class StructuralRelativeEmbeddings(RelativePositionEmbeddings):
    """Bucket ``rel_stru(i, j) + r`` with ``rel_stru`` clipped to ``[-r, r]``."""

    positions_only = False  # the bucket comes from the parse

    def buckets(self, tgt_len: int, src_len: int) -> RelativeBuckets:
        return StructuralBuckets(self.clip, tgt_len, src_len)

    def example_side_data(self, padding_mask: Tensor) -> Dict[str, Tensor]:
        """A parse of every sentence (:func:`example_parse`)."""
        return example_parse(padding_mask)

    def bucket_of(self, ctx: PositionContext, tgt_len: int, src_len: int) -> Callable[[Tensor, Tensor, Tensor], Tensor]:
        """``rel_stru(i, j) + r`` read from the batch's prepared buckets."""
        buckets = ctx.prepared(self.buckets(tgt_len, src_len))
        return lambda b, q_idx, kv_idx: buckets[b, q_idx, kv_idx]

    def inspect(self, positions: int) -> List[Quantity]:
        """The key and value tables, a row per clipped relative structural position."""
        return [replace(q, axes=("relative structural position", "dimension"))
                for q in super().inspect(positions)]


def sinusoid_table(rows: int, embed_dim: int, padding_idx: int) -> Tensor:
    """``(rows, embed_dim)``: row p is the sinusoid of position p that fairseq's sequential embeddings use (Vaswani
    et al. 2017, section 3.5, the sines in the first half of the dimensions, the cosines in the second; a zero
    column for an odd ``embed_dim``), row ``padding_idx`` zero."""
    half = embed_dim // 2
    frequencies = torch.exp(torch.arange(half, dtype=torch.float) * -(math.log(10000) / (half - 1)))
    angles = torch.arange(rows, dtype=torch.float)[:, None] * frequencies[None, :]
    table = torch.cat([torch.sin(angles), torch.cos(angles)], dim=1)
    if embed_dim % 2:
        table = torch.cat([table, torch.zeros(rows, 1)], dim=1)
    table[padding_idx] = 0
    return table


class StructuralPositionalEmbedding(InputPositionEmbedding):
    """The sinusoid of each token's tree depth, joined with the sequential embedding (module docstring)."""

    legacy_names = ("structural_embedding",)

    def __init__(self, embed_dim: int, padding_idx: int, max_depth: int, fusion: str):
        super().__init__()
        self.padding_idx = padding_idx
        self.max_depth = max_depth
        table = sinusoid_table(max_depth + padding_idx + 2, embed_dim, padding_idx)
        self.register_buffer("table", table, persistent=False)
        self.fusion = nn.Linear(2 * embed_dim, embed_dim) if fusion == "nonlinear" else None

    def forward(self, ctx: PositionContext, sequential: Optional[Tensor]) -> Tensor:
        """``(batch, length, dim)`` from the batch's depths ``(batch, length)`` and ``sequential``."""
        return self.embed(ctx.side_data["depth"], ctx.padding_mask, sequential)

    def embed(self, depth: Tensor, padding_mask: Tensor, sequential: Optional[Tensor]) -> Tensor:
        """``depth``, ``padding_mask``: ``(batch, length)``; ``sequential``: ``(batch, length, dim)`` or None."""
        # a word's depth is below the sentence's token count: checking the length needs no sync
        check_length(depth.size(1), self.max_depth, "the structural position embedding (tree depth)")
        index = (depth + self.padding_idx + 1).masked_fill(padding_mask, self.padding_idx)
        structural = F.embedding(index, self.table.to(sequential.dtype if sequential is not None else self.table.dtype))
        if sequential is None:
            return structural
        if self.fusion is None:
            return sequential + structural
        return torch.tanh(self.fusion(torch.cat([sequential, structural], dim=-1)))


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
        MethodOption("structural_clip", WANG_CLIP, "clip r of the relative structural positions (Wang et al.: 16)"),
        MethodOption("structural_keys_only", False,
                     "relative structural positions with key embeddings only, no value term (as Shaw et "
                     "al.'s Table 3 ablation); runs on flex_attention on a GPU", keys_only=True),
    )
    benchmark_target = "key_value"
    side_data = PARSE
    #: the relative positions (the attention terms; the absolute embedding joins the input, built by
    #: tests/test_structural_model.py and the benchmark's own structural rows); the tests' batches carry an
    #: example parse, the benchmark's the side data of real trees
    variants = {"struct-rel": {"structural_positions": "relative"},
                "struct-rel-keys-only": {"structural_positions": "relative", "structural_keys_only": True}}
    labels = {"struct-rel": "Structural rel (r=16)", "struct-rel-keys-only": "Structural rel (r=16), keys only"}

    def is_on(self, options: Any) -> bool:
        return options.structural_positions != "none"

    def validate(self, options: Any) -> None:
        if options.structural_clip < 1:
            raise PositionOptionError(
                f"{options.flag('structural_clip')} must be >= 1, got {options.structural_clip}")
        positions = options.flag("structural_positions")
        unused = [(name, "absolute|both") for name, default in (("structural_fusion", "add"),)
                  if getattr(options, name) != default and not embeds_tree_depth(options)]
        relative_defaults = (("structural_clip", WANG_CLIP), ("structural_keys_only", False))
        unused += [(name, "relative|both") for name, default in relative_defaults
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

    def input_embedding(self, options: Any, embed_dim: int, padding_idx: int,
                        sequential: bool) -> Optional[InputPositionEmbedding]:
        if not embeds_tree_depth(options):
            return None
        if options.structural_fusion == "nonlinear" and not sequential:
            raise PositionOptionError(
                f"{options.flag('structural_fusion')} nonlinear fuses the structural with the sequential "
                "position embeddings: drop --no-token-positional-embeddings and "
                f"{options.flag('no_token_positional_embeddings')}, or use {options.flag('structural_fusion')} add")
        return StructuralPositionalEmbedding(embed_dim, padding_idx, options.max_positions, options.structural_fusion)

    def trace_side_data(self, options: Optional[Any], rows: Dict[str, Tensor]) -> SideDataTrace:
        """The sentence's sequential positions and tree depths, and its sequential and structural relative
        positions (clipped as the model sees them), as Wang et al. 2019's Figure 1."""
        clip = options.structural_clip if options is not None else WANG_CLIP
        depth, tin, tout = (rows[name].long() for name in PARSE_FIELDS)
        structural = structural_relative(depth[None], tin[None], tout[None], clip)[0]
        index = torch.arange(len(depth))
        sequential = index[:, None] - index[None, :]
        return SideDataTrace(
            "source positions: sequential vs structural (dependency tree)",
            {"sequential": index, "tree depth": depth},
            {"sequential relative positions i - j": sequential,
             f"structural relative positions (clip {clip})": structural},
            {"depth": depth.tolist(), "clip": clip, "sequential_relative": sequential.tolist(),
             "structural_relative": structural.tolist()})


register(StructuralPositionsMethod())
