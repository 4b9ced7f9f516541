"""Per-batch token geometry, handed explicitly to every position-aware attention call of one side.

A side (encoder, decoder, language model, tagger) builds one :class:`PositionContext` per forward
pass from its tokens and passes it *with every layer call* (see
:mod:`fairseq_posattn.modules.attention`): nothing is stored on a module, so a re-entrant call
(activation checkpointing's recomputation, ``torch.compile``, FSDP, hooks) sees exactly what the
first call saw. Every index tensor a position term needs (token positions, query-minus-key
distances, relative structural positions) is computed here once per batch, eagerly and without a
host-device synchronisation, and shared by every layer and head.

Positions are *token* positions: with fairseq's left-padded source, position 0 is the first real
token, never a pad.
"""

from dataclasses import dataclass
from typing import Dict, Optional, Tuple

import torch
from torch import Tensor


@dataclass(frozen=True)
class PositionContext:
    """Token positions and pairwise distances of one batch (immutable).

    Attributes:
        padding_mask: ``(batch, length)`` bool, True at pads, over *all* tokens of the side so far
            (in incremental decoding: every generated token, not only the current step's).
        distances: ``(length, length)`` long, ``i - j`` of query index i and key index j. Padding
            shifts query and key of one sequence alike, so this is the token distance of every
            real pair (pads are masked anyway).
        positions: ``(batch, length)`` long token positions (pads clamped to 0), or None when the
            side's padding is on the right, where a real token's position is its index.
        left_pads: ``(batch,)`` number of pads before each sequence's first token, or None (right
            padding).
        depth: ``(batch, length)`` tree depth of each token's word (structural side data), or None.
        structural_relative: ``(batch, length, length)`` clipped relative structural positions
            (:func:`structural_relative`), or None without structural side data.
    """

    padding_mask: Tensor
    distances: Tensor
    positions: Optional[Tensor] = None
    left_pads: Optional[Tensor] = None
    depth: Optional[Tensor] = None
    structural_relative: Optional[Tensor] = None

    @classmethod
    def from_padding(
        cls,
        padding_mask: Tensor,
        right_padded: bool,
        structural: Optional[Dict[str, Tensor]] = None,
        structural_clip: Optional[int] = None,
    ) -> "PositionContext":
        """Build the context of a batch from its ``(batch, length)`` padding mask.

        Args:
            right_padded: True where the side's batches are padded on the right only (fairseq's
                target and language-model batches): token positions are then the indices. False
                computes token positions from the mask, which is right for any padding.
            structural: ``depth``, ``tin``, ``tout`` of every token, each ``(batch, length)`` long
                (collated by ``--task translation_structural``).
            structural_clip: clip of the relative structural positions; None when no term needs them.
        """
        length = padding_mask.size(1)
        index = torch.arange(length, device=padding_mask.device)
        positions = left_pads = None
        if not right_padded:
            positions = ((~padding_mask).long().cumsum(dim=1) - 1).clamp(min=0)
            left_pads = padding_mask.long().cumprod(dim=1).sum(dim=1)
        depth = relative = None
        if structural is not None:
            depth = structural["depth"]
            if structural_clip is not None:
                relative = structural_relative(
                    structural["depth"], structural["tin"], structural["tout"], structural_clip)
        return cls(padding_mask, index[:, None] - index[None, :], positions, left_pads, depth, relative)

    @classmethod
    def from_tokens(
        cls,
        tokens: Tensor,
        padding_idx: int,
        right_padded: bool = False,
        structural: Optional[Dict[str, Tensor]] = None,
        structural_clip: Optional[int] = None,
    ) -> "PositionContext":
        """:meth:`from_padding` of ``tokens.eq(padding_idx)``."""
        return cls.from_padding(tokens.eq(padding_idx), right_padded, structural, structural_clip)

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
        return self.distances[src_len - tgt_len : src_len, :src_len]

    def query_padding_mask(self, tgt_len: int) -> Tensor:
        """``(batch, tgt_len)`` bool, True at padded query rows."""
        return self.padding_mask[:, self.length - tgt_len :]

    def structural_buckets(self, tgt_len: int, src_len: int) -> Tensor:
        """``(batch, tgt_len, src_len)`` clipped relative structural positions of the queries and keys."""
        if self.structural_relative is None:
            raise ValueError(
                "structural positions need the parse side data of each sentence: train and "
                "translate with --task translation_structural")
        return self.structural_relative[:, src_len - tgt_len : src_len, :src_len]


def structural_relative(depth: Tensor, tin: Tensor, tout: Tensor, clip: int) -> Tensor:
    """Relative structural positions of a batch (Wang et al. 2019, section 3.2), vectorised.

    Each token carries its word's tree depth and the entry/exit times ``tin``/``tout`` of that word
    in a depth-first walk of the parse, so word a is an ancestor of (or is) word b exactly when
    ``tin[a] <= tin[b]`` and ``tout[b] <= tout[a]``. EOS and pads have ``tin = -1``: on no path.

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
