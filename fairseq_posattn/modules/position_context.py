"""Per-batch token geometry shared by every position-aware attention layer of one side.

A side (encoder, decoder or language model) builds one :class:`PositionContext` per forward pass
from its token padding mask and binds it to its attention modules for that pass. Every index tensor a
position term needs (token positions, query-minus-key distances) is computed here once per batch and
memoised by shape, so layers and heads share it instead of rebuilding it.

Positions are *token* positions (SPEC.md, notation): with fairseq's left-padded source, position 0 is
the first real token, never a pad.
"""

from typing import Dict, Optional, Tuple

import torch
from torch import Tensor


class PositionContext:
    """Token positions and pairwise distances of one batch.

    Args:
        padding_mask: ``(batch, length)`` bool, True at pads, over *all* tokens of the side so far
            (in incremental decoding: every generated token, not only the current step); None when
            the batch has no padding.
        length: number of tokens of the side so far (the key length of self-attention).
        structural: optional structural side data of the batch, collated like the tokens:
            ``depth``, ``tin``, ``tout``, each ``(batch, length)`` long (see
            :func:`structural_relative`).
    """

    def __init__(
        self,
        padding_mask: Optional[Tensor],
        length: int,
        device: torch.device,
        structural: Optional[Dict[str, Tensor]] = None,
    ):
        if padding_mask is not None and not bool(padding_mask.any()):
            padding_mask = None
        self.padding_mask = padding_mask
        self.length = length
        self.device = device
        self.structural = structural or {}
        self._positions: Optional[Tensor] = None
        self._relative: Dict[Tuple[int, int], Tensor] = {}
        self._structural_relative: Dict[int, Tensor] = {}

    @classmethod
    def from_tokens(
        cls, tokens: Tensor, padding_idx: int, structural: Optional[Dict[str, Tensor]] = None
    ) -> "PositionContext":
        return cls(tokens.eq(padding_idx), tokens.size(1), tokens.device, structural)

    @property
    def left_padded(self) -> bool:
        """True when some sequence has pads *before* its tokens, so index != token position."""
        return self.padding_mask is not None and bool(self.padding_mask[:, 0].any())

    def token_positions(self) -> Optional[Tensor]:
        """``(batch, length)`` token positions (pads clamped to 0), or None when position == index."""
        if not self.left_padded:
            return None
        if self._positions is None:
            real = (~self.padding_mask).long()
            self._positions = (real.cumsum(dim=1) - 1).clamp(min=0)
        return self._positions

    def left_pad_counts(self) -> Optional[Tensor]:
        """``(batch,)`` number of pads before each sequence's first token; None without left pads."""
        if not self.left_padded:
            return None
        return self.padding_mask.long().cumprod(dim=1).sum(dim=1)

    def query_key_positions(self, tgt_len: int, src_len: int) -> Tuple[Tensor, Tensor]:
        """Token positions of the ``tgt_len`` queries (the last ones) and the ``src_len`` keys.

        Shapes ``(batch or 1, tgt_len)`` and ``(batch or 1, src_len)``. In incremental decoding the
        query rows are the last ``tgt_len`` of ``src_len`` tokens (FAIRSEQ_NOTES, incremental decoding).
        """
        positions = self.token_positions()
        if positions is None:
            keys = torch.arange(src_len, device=self.device).unsqueeze(0)
        else:
            keys = positions[:, :src_len]
        return keys[:, src_len - tgt_len :], keys

    def relative_distances(self, tgt_len: int, src_len: int) -> Tensor:
        """``(tgt_len, src_len)`` long tensor of ``i - j`` (query minus key token position).

        Padding shifts query and key of one sequence alike, so the index difference is the token
        distance for every real pair; pads are masked anyway. Memoised per shape.
        """
        key = (tgt_len, src_len)
        if key not in self._relative:
            queries = torch.arange(src_len - tgt_len, src_len, device=self.device)
            keys = torch.arange(src_len, device=self.device)
            self._relative[key] = queries[:, None] - keys[None, :]
        return self._relative[key]

    def query_padding_mask(self, tgt_len: int) -> Optional[Tensor]:
        """``(batch, tgt_len)`` bool, True at padded query rows; None without padding."""
        if self.padding_mask is None:
            return None
        return self.padding_mask[:, self.length - tgt_len : self.length]

    def structural_relative(self, clip: int) -> Tensor:
        """``(batch, length, length)`` clipped relative structural positions, memoised per clip."""
        if clip not in self._structural_relative:
            if not self.structural:
                raise ValueError(
                    "structural positions need the parse side data of each sentence: train and "
                    "translate with --task translation_structural")
            s = self.structural
            self._structural_relative[clip] = structural_relative(s["depth"], s["tin"], s["tout"], clip)
        return self._structural_relative[clip]


def structural_relative(depth: Tensor, tin: Tensor, tout: Tensor, clip: int) -> Tensor:
    """Relative structural positions of a batch (Wang et al. 2019; SPEC.md section 6), vectorised.

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
