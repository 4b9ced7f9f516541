"""Convolved attention (Dufter et al. 2020, section 2.5; SPEC.md section 3).

Applied to the post-softmax matrix ``S = softmax(A)`` per head, followed by ReLU and not
renormalised: ``A' = ReLU(conv(S))``, head output ``A' V`` (the ReLU is in the authors' released code).

Padding contributes nothing: blocked entries (padded keys, future keys, padded query rows) are zeroed
before the convolution and again after it. On a causal side the window along the query axis covers
only the current and the ``k - 1`` earlier rows; in incremental decoding those earlier rows come from
the cache (``history``). Filters start from PyTorch's default convolution initialisation.
"""

from typing import Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fairseq_posattn.modules.position_context import PositionContext
from fairseq_posattn.modules.position_terms.base import PostSoftmaxTransform, check_length


def _with_query_context(
    probs: Tensor, kernel_size: int, causal: bool, history: Optional[Tensor]
) -> Tuple[Tensor, Optional[Tensor]]:
    """Pad the query axis for a 'same' (or causal) window; return the rows and the rows to cache."""
    if not causal:
        half = kernel_size // 2
        return F.pad(probs, (0, 0, half, half)), None
    context = kernel_size - 1
    if history is None:
        history = probs.new_zeros(probs.shape[:2] + (context, probs.size(-1)))
    else:
        history = F.pad(history.to(probs.dtype), (0, probs.size(-1) - history.size(-1)))
    rows = torch.cat([history, probs], dim=2)
    return rows, rows[:, :, rows.size(2) - context :]


class ConvolvedAttention2d(PostSoftmaxTransform):
    """One k x k filter plus bias per head over the (query, key) matrix, 'same' padding."""

    def __init__(self, num_heads: int, kernel_size: int, causal: bool):
        super().__init__()
        self.kernel_size = kernel_size
        self.causal = causal
        self.history_rows = kernel_size - 1 if causal else 0
        self.conv = nn.Conv2d(num_heads, num_heads, kernel_size, groups=num_heads)

    def forward(
        self, probs: Tensor, blocked: Tensor, ctx: PositionContext, history: Optional[Tensor]
    ) -> Tuple[Tensor, Optional[Tensor]]:
        probs = probs.masked_fill(blocked, 0.0)
        rows, cache = _with_query_context(probs, self.kernel_size, self.causal, history)
        half = self.kernel_size // 2
        out = F.conv2d(
            rows, self.conv.weight.to(rows.dtype), self.conv.bias.to(rows.dtype),
            padding=(0, half), groups=self.conv.groups,
        )
        return torch.relu(out).masked_fill(blocked, 0.0), cache


class ConvolvedAttention1d(PostSoftmaxTransform):
    """Per head a Conv1d whose t input channels are the key columns (zero-padded to t), sliding
    with width k along the query axis, t output channels (one per output column), with bias.

    Key columns are channels, so they are indexed by *token* position: a left-padded sentence is
    shifted to column 0 before the convolution and back after it.
    """

    def __init__(self, num_heads: int, kernel_size: int, causal: bool, max_positions: int,
                 max_positions_option: str):
        super().__init__()
        self.kernel_size = kernel_size
        self.causal = causal
        self.history_rows = kernel_size - 1 if causal else 0
        self.num_heads = num_heads
        self.max_positions = max_positions
        self.max_positions_option = max_positions_option
        self.conv = nn.Conv1d(
            num_heads * max_positions, num_heads * max_positions, kernel_size, groups=num_heads
        )

    def _shift_columns(self, matrix: Tensor, shift: Tensor, width: int) -> Tensor:
        """``out[b, ..., c] = matrix[b, ..., c + shift[b]]`` (zero where out of range), ``width`` columns."""
        columns = torch.arange(width, device=matrix.device)[None, :] + shift[:, None]  # B x width
        valid = (columns >= 0) & (columns < matrix.size(-1))
        index = columns.clamp(0, matrix.size(-1) - 1)
        index = index[:, None, None, :].expand(matrix.shape[:-1] + (width,))
        shifted = matrix.gather(-1, index)
        return shifted * valid[:, None, None, :].to(matrix.dtype)

    def forward(
        self, probs: Tensor, blocked: Tensor, ctx: PositionContext, history: Optional[Tensor]
    ) -> Tuple[Tensor, Optional[Tensor]]:
        batch, heads, tgt_len, src_len = probs.shape
        t = self.max_positions
        check_length(src_len, t, "the 1d attention convolution (t key channels)", self.max_positions_option)
        probs = probs.masked_fill(blocked, 0.0)
        rows, cache = _with_query_context(probs, self.kernel_size, self.causal, history)
        left_pads = ctx.left_pad_counts()
        if left_pads is None:
            aligned = F.pad(rows, (0, t - src_len))
        else:
            aligned = self._shift_columns(rows, left_pads, t)
        channels = aligned.transpose(2, 3).reshape(batch, heads * t, rows.size(2))
        out = F.conv1d(
            channels, self.conv.weight.to(rows.dtype), self.conv.bias.to(rows.dtype),
            groups=heads,
        )
        out = out.reshape(batch, heads, t, tgt_len).transpose(2, 3)  # B x H x Tq x t
        if left_pads is None:
            out = out[..., :src_len]
        else:
            out = self._shift_columns(out, -left_pads, src_len)
        return torch.relu(out).masked_fill(blocked, 0.0), cache
