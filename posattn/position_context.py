"""Per-batch token geometry, handed explicitly to every position-aware attention call of one side.

A side (encoder, decoder, language model, tagger) builds one :class:`PositionContext` per forward
pass from its tokens and passes it *with every layer call* (see
:mod:`posattn.attention`): nothing is stored on a module, so a re-entrant call
(activation checkpointing's recomputation, ``torch.compile``, FSDP, hooks) sees exactly what the
first call saw. Every index tensor a position term needs (token positions, query-minus-key
distances) is computed here once per batch, without a host-device synchronisation, and shared by every
layer and head (the (length x length) distances at their first use: a batch whose layers read none, as a
layer without a method on SDPA's causal kernel, never holds them). Per-token side data that a batch carries for
a method (declared by the method as a ``BatchSideData`` and unpacked by the side) is held as given, by name
(:attr:`PositionContext.side_data`); the method that reads it derives what it needs from it with its own
:class:`Preparation`.

Positions are *token* positions: with fairseq's left-padded source, position 0 is the first real
token, never a pad.

Derived tensors are built once where they cannot change:

- :class:`Preparation` (:meth:`PositionContext.prepared`): a term *declares* each parameter-free
  tensor it derives from the batch's geometry (the fused kernel's masks, a query/key transform's angles, a
  bias's buckets or values, the blocked entries, flex_attention's block mask) as a frozen dataclass whose fields
  are everything the tensor depends on besides the context, and whose ``build(ctx)`` makes it. The
  dataclass itself is the key: the first layer that asks builds it, every other layer of the side
  with the same configuration gets it, and a key can never miss an input. Parameter-free only:
  activation checkpointing runs the first forward without a graph, so a prepared tensor that depended
  on a parameter would lose its gradient in the recomputation.
- :class:`SequenceTables` (:meth:`PositionContext.sequence_table`): in incremental decoding, the
  decoder keeps one per sequence in fairseq's incremental state and hands it to the context of every
  step. Terms whose per-step work depends on positions only (a bias row, a logit scaling's coefficients, a
  post-softmax transform's filters, a query/key transform's angles) build it once for a length bucket (a
  power of two) and slice it at each step, instead of rebuilding it per step and layer. A table is keyed by what it is
  built from: the term itself (its parameters, :meth:`PositionTerm.table_key`) and the dtype it is
  built in, or, for a parameter-free table, its preparation's configuration without the length.
  Used only without gradients and on a side whose token positions are the indices (right padding),
  where a table is a function of the length.
"""

from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Hashable, Mapping, Optional, Sequence, Tuple

import torch
from torch import Tensor

#: the smallest length bucket of the sequence tables (steps of incremental decoding)
SMALLEST_TABLE = 64


class SequenceTables:
    """Per-sequence tables of incremental decoding (see the module docstring).

    ``capacity`` is the side's maximum number of positions: no table is built beyond it.
    ``tables`` holds them by key (a tuple of what the table is built from); the decoder keeps that
    dictionary in fairseq's incremental state, so it lives exactly as long as the sequence's cached
    keys and values.
    """

    def __init__(self, capacity: int, tables: Dict[Hashable, Tensor]):
        self.capacity = capacity
        self.tables = tables

    def bucket(self, length: int) -> int:
        """The table length for ``length`` tokens: the next power of two (at least
        :data:`SMALLEST_TABLE`), at most the capacity, never below ``length``."""
        bucket = max(SMALLEST_TABLE, 1 << max(length - 1, 0).bit_length())
        return max(length, min(bucket, self.capacity))

    def get(self, key: Hashable, length: int, build: Callable[[int], Tensor], length_dim: int = -1) -> Tensor:
        """The table of ``key``, built by ``build(n)`` for a bucket ``n >= length`` once, and again
        only when a longer sequence outgrows it (its dimension ``length_dim`` counts positions)."""
        table = self.tables.get(key)
        if table is None or table.size(length_dim) < length:
            table = self.tables[key] = build(self.bucket(length))
        return table


class Preparation:
    """A parameter-free tensor (or tuple of tensors) of one batch's geometry, declared by a term.

    Subclasses are frozen dataclasses: their fields (sizes, dtypes, a term's configuration) and the
    context are all that :meth:`build` may read, so the dataclass is the complete key of what it
    builds (see the module docstring)."""

    def build(self, ctx: "PositionContext") -> Any:
        raise NotImplementedError


@dataclass(frozen=True)
class LeadingPadsSeePads(Preparation):
    """``(batch, 1, tgt_len, src_len)`` bool, True at a padded key, except in the rows of the pads before a
    sequence's first token (see :meth:`PositionContext.key_padding_4d`)."""

    tgt_len: int

    def build(self, ctx: "PositionContext") -> Tensor:
        tokens_so_far = (~ctx.padding_mask).cumsum(dim=1)[:, ctx.length - self.tgt_len:]  # (batch, tgt_len)
        return ctx.padding_mask[:, None, None, :] & (tokens_so_far > 0)[:, None, :, None]


@dataclass(frozen=True)
class CausalMask(Preparation):
    """``(tgt_len, src_len)``: ``-inf`` where the key comes after the query (the last ``tgt_len`` of ``src_len``
    tokens), 0 elsewhere, in ``dtype`` (a causal side's ``attn_mask``)."""

    tgt_len: int
    src_len: int
    dtype: torch.dtype

    def build(self, ctx: "PositionContext") -> Tensor:
        mask = torch.zeros(self.tgt_len, self.src_len, dtype=self.dtype, device=ctx.padding_mask.device)
        return mask.masked_fill_(ctx.future(self.tgt_len, self.src_len), float("-inf"))


@dataclass(frozen=True)
class IndexDifferences(Preparation):
    """:attr:`PositionContext.distances` of a context built without them: ``(length, length)`` long ``i - j``."""

    def build(self, ctx: "PositionContext") -> Tensor:
        return index_differences(ctx.length, ctx.padding_mask.device)


@dataclass(frozen=True)
class AbsoluteDistances(Preparation):
    """``(tgt_len, src_len)`` long ``|i - j|`` of the last ``tgt_len`` queries and the first ``src_len`` keys (the
    index of a table of distances, read by every layer)."""

    tgt_len: int
    src_len: int

    def build(self, ctx: "PositionContext") -> Tensor:
        return ctx.relative_distances(self.tgt_len, self.src_len).abs()


@dataclass(frozen=True)
class VisibleEntries(Preparation):
    """Where each of the last ``tgt_len`` queries may see each of the ``src_len`` keys, for SDPA's boolean mask
    (True: seen): ``(batch, 1, tgt_len, src_len)`` of :meth:`PositionContext.key_padding_4d` and, on a causal side,
    the keys not after the query; on a batch without pads (:attr:`PositionContext.pad_free`) ``(tgt_len,
    src_len)``, the causal part alone (bottom-right aligned); None where every key is seen (a pad-free batch's
    bidirectional or one-query call: no mask at all)."""

    tgt_len: int
    src_len: int

    def build(self, ctx: "PositionContext") -> Optional[Tensor]:
        causal = ctx.causal and self.tgt_len > 1
        future = ctx.future(self.tgt_len, self.src_len) if causal else None
        if ctx.pad_free:
            return None if future is None else ~future
        blocked = ctx.key_padding_4d(self.tgt_len)
        return ~blocked if future is None else ~(blocked | future)


@dataclass(frozen=True)
class BlockedBias(Preparation):
    """:class:`VisibleEntries` as SDPA's float mask in ``dtype``: 0 where seen, -inf where not (None where every
    key is seen); the float mask that a layer's biases are added to, built once per batch."""

    dtype: torch.dtype
    tgt_len: int
    src_len: int

    def build(self, ctx: "PositionContext") -> Optional[Tensor]:
        visible = ctx.prepared(VisibleEntries(self.tgt_len, self.src_len))
        if visible is None:
            return None
        return torch.zeros(visible.shape, dtype=self.dtype, device=visible.device).masked_fill_(~visible, float("-inf"))


@dataclass(frozen=True)
class BlockedEntries(Preparation):
    """``(batch, 1, tgt_len, src_len)`` bool, True where a query may not see a key (a padded key, a
    later key on a causal side) or the query row is a pad."""

    tgt_len: int
    src_len: int

    def build(self, ctx: "PositionContext") -> Tensor:
        blocked = ctx.padding_mask[:, None, None, : self.src_len] | ctx.query_padding_mask(self.tgt_len)[:, None, :, None]
        if ctx.causal:
            blocked = blocked | ctx.future(self.tgt_len, self.src_len)
        return blocked


@dataclass(frozen=True)
class PositionContext:
    """Token positions and pairwise distances of one batch (immutable).

    Attributes:
        padding_mask: ``(batch, length)`` bool, True at pads, over *all* tokens of the side so far
            (in incremental decoding: every generated token, not only the current step's).
        distances: ``(length, length)`` long, ``i - j`` of query index i and key index j (None: built at the
            first use, once per batch: :meth:`relative_distances`). Padding
            shifts query and key of one sequence alike, so this is the token distance of every
            real pair (pads are masked anyway).
        positions: ``(batch, length)`` long token positions (pads clamped to 0), or None when the
            side's padding is on the right, where a real token's position is its index.
        left_pads: ``(batch,)`` number of pads before each sequence's first token, or None (right
            padding).
        side_data: per-token side data of the batch by name, each ``(batch, length)`` (the rows of the
            ``BatchSideData`` its side's methods read, collated by the task); empty without.
        tables: the sequence's :class:`SequenceTables` in incremental decoding without gradients on
            a right-padded side, else None.
        causal: the side is causal (a decoder): query i sees the keys up to its own position only.
        pad_free: the batch is known to hold no pad (it was built without a padding mask): the fused kernel then
            needs no padding mask (SDPA's causal kernel, or no mask at all). False says nothing: a padding mask
            of no True is masked as one with pads (knowing more would take a host-device synchronisation).
        memo: the prepared tensors of this batch (:meth:`prepared`).
    """

    padding_mask: Tensor
    distances: Optional[Tensor] = None
    positions: Optional[Tensor] = None
    left_pads: Optional[Tensor] = None
    side_data: Mapping[str, Tensor] = field(default_factory=dict)
    tables: Optional[SequenceTables] = None
    causal: bool = False
    pad_free: bool = False
    memo: Dict[Preparation, Any] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def from_padding(
        cls,
        padding_mask: Tensor,
        right_padded: bool,
        side_data: Optional[Mapping[str, Tensor]] = None,
        tables: Optional[SequenceTables] = None,
        causal: bool = False,
        pad_free: bool = False,
    ) -> "PositionContext":
        """Build the context of a batch from its ``(batch, length)`` padding mask.

        Args:
            right_padded: True where the side's batches are padded on the right only (fairseq's
                target and language-model batches): token positions are then the indices. False
                computes token positions from the mask, which is right for any padding.
            side_data: per-token side data by name, each ``(batch, length)`` (None: none).
            tables: the sequence tables of incremental decoding (kept only on a right-padded side
                and without gradients, where they are valid).
            causal: the side is causal (a decoder, a language model).
            pad_free: ``padding_mask`` is known to hold no True (:attr:`pad_free`; then right-padded too).
        """
        length, device = padding_mask.size(1), padding_mask.device
        positions = left_pads = None
        if not right_padded:
            positions = ((~padding_mask).long().cumsum(dim=1) - 1).clamp(min=0)
            left_pads = padding_mask.long().cumprod(dim=1).sum(dim=1)
        if not right_padded or torch.is_grad_enabled():
            tables = None
        distances = None  # built at the first use
        if tables is not None:  # a decoding step: a slice of the sequence's table
            distances = tables.get((index_differences,), length, lambda n: index_differences(n, device), 0)
            distances = distances[:length, :length]
        return cls(padding_mask, distances, positions, left_pads, dict(side_data or {}), tables, causal, pad_free)

    @classmethod
    def from_tokens(
        cls,
        tokens: Tensor,
        padding_idx: int,
        right_padded: bool = False,
        side_data: Optional[Mapping[str, Tensor]] = None,
        tables: Optional[SequenceTables] = None,
        causal: bool = False,
    ) -> "PositionContext":
        """:meth:`from_padding` of ``tokens.eq(padding_idx)``."""
        return cls.from_padding(tokens.eq(padding_idx), right_padded, side_data, tables, causal)

    @classmethod
    def unpadded(cls, length: int, device: torch.device, causal: bool = False) -> "PositionContext":
        """The context of one sequence of ``length`` tokens without padding."""
        return cls.from_padding(torch.zeros(1, length, dtype=torch.bool, device=device), True, causal=causal,
                                pad_free=True)

    @classmethod
    def example(cls, lengths: Sequence[int], right_padded: bool, causal: bool, device: torch.device,
                terms: Sequence[Any] = (), pad_free: bool = False) -> "PositionContext":
        """A padded batch of sentences of ``lengths`` tokens shaped as a side's batches are: padded on its
        side, causal or not, with the per-token side data that ``terms`` need for it (each term's
        ``example_side_data(padding_mask)``); ``pad_free``: as many sentences of the longest length, without a
        pad and known to hold none (:attr:`pad_free`). The kernel self-check's and the GPU verification's batch
        (no tokens needed)."""
        longest = max(lengths)
        padding = torch.ones(len(lengths), longest, dtype=torch.bool)
        for row, length in enumerate(longest if pad_free else length for length in lengths):
            padding[row, slice(0, length) if right_padded else slice(longest - length, longest)] = False
        padding = padding.to(device)
        side_data = {name: values for term in terms for name, values in term.example_side_data(padding).items()}
        return cls.from_padding(padding, right_padded or pad_free, side_data, causal=causal, pad_free=pad_free)

    def prepared(self, preparation: Preparation) -> Any:
        """``preparation.build(self)``, built once per batch and shared by every layer that declares
        an equal preparation (built anew under ``torch.compile``, which shares it itself)."""
        if torch.compiler.is_compiling():
            return preparation.build(self)
        if preparation not in self.memo:
            self.memo[preparation] = preparation.build(self)
        return self.memo[preparation]

    def future(self, tgt_len: int, src_len: int) -> Tensor:
        """``(tgt_len, src_len)`` bool, True where the key comes after the query (the last
        ``tgt_len`` of ``src_len`` tokens)."""
        return self.relative_distances(tgt_len, src_len) < 0

    def sequence_table(self, key: Hashable, length: int, build: Callable[[int], Tensor],
                       length_dim: int = -1) -> Optional[Tensor]:
        """In incremental decoding, the sequence's table ``key`` for at least ``length`` tokens
        (``build(n)`` makes it for ``n`` tokens, once per sequence; its dimension ``length_dim``
        counts them); None otherwise, where the caller computes what the step needs itself."""
        if self.tables is None:
            return None
        return self.tables.get(key, length, build, length_dim)

    def pair_table(self, key: Hashable, tgt_len: int, src_len: int,
                   compute: Callable[["PositionContext", int, int], Tensor]) -> Tensor:
        """``compute(ctx, tgt_len, src_len)``, a ``(..., tgt_len, src_len)`` quantity of query and key
        positions alone; in incremental decoding the last ``tgt_len`` of ``src_len`` rows of the
        sequence's table, ``compute`` of an unpadded sequence of the bucket's length."""
        device = self.padding_mask.device
        table = self.sequence_table(key, src_len, lambda n: compute(PositionContext.unpadded(n, device), n, n))
        if table is None:
            return compute(self, tgt_len, src_len)
        return table[..., src_len - tgt_len : src_len, :src_len]

    def key_padding_4d(self, tgt_len: int) -> Tensor:
        """``(batch, 1, 1, length)`` bool, True at pads (the explicit kernel's mask; a view). On a causal side
        whose token positions come from the mask (left padding possible), ``(batch, 1, tgt_len, length)``: the
        query row of a pad before a sequence's first token is not kept from the pads, since it sees nothing else,
        and a row of -inf alone would give NaN values and gradients; every other row, a later pad's too, sees the
        tokens alone (as transformers' masks do)."""
        if self.causal and self.positions is not None:
            return self.prepared(LeadingPadsSeePads(tgt_len))
        return self.padding_mask[:, None, None, :]

    @property
    def length(self) -> int:
        """Number of tokens of the side so far (the key length of self-attention)."""
        return self.padding_mask.size(1)

    def query_key_positions(self, tgt_len: int, src_len: int) -> Tuple[Tensor, Tensor]:
        """Token positions of the ``tgt_len`` queries (the last ones) and the ``src_len`` keys.

        Shapes ``(batch or 1, tgt_len)`` and ``(batch or 1, src_len)``. In incremental decoding the
        query rows are the last ``tgt_len`` of ``src_len`` tokens.
        """
        if self.positions is None:
            keys = torch.arange(src_len, device=self.padding_mask.device).unsqueeze(0)
        else:
            keys = self.positions[:, :src_len]
        return keys[:, src_len - tgt_len :], keys

    def relative_distances(self, tgt_len: int, src_len: int) -> Tensor:
        """``(tgt_len, src_len)`` long ``i - j`` of the last ``tgt_len`` queries and first keys."""
        distances = self.prepared(IndexDifferences()) if self.distances is None else self.distances
        return distances[src_len - tgt_len : src_len, :src_len]

    def query_padding_mask(self, tgt_len: int) -> Tensor:
        """``(batch, tgt_len)`` bool, True at padded query rows."""
        return self.padding_mask[:, self.length - tgt_len :]


def index_differences(length: int, device: torch.device) -> Tensor:
    """``(length, length)`` long ``i - j`` of query index i and key index j."""
    index = torch.arange(length, device=device)
    return index[:, None] - index[None, :]
