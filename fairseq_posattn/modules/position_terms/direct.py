"""Direct position interactions (Dufter et al. 2020, section 2.3; SPEC.md section 1)."""

import torch
from torch import Tensor, nn

from fairseq_posattn.modules.position_context import PositionContext
from fairseq_posattn.modules.position_terms.base import AdditiveLogitBias, check_length


class DirectAbsolutePositionBias(AdditiveLogitBias):
    """Absolute interactions ``A + A^p[:T, :T]`` with a learnable ``A^p`` of shape t x t per head.

    ``A^p[i, j]`` is indexed by the *token* positions of query i and key j, so a left-padded
    sentence sees the same entries as when it is alone. Initialised to zero: training starts from
    plain attention.
    """

    def __init__(self, num_heads: int, max_positions: int, max_positions_option: str):
        super().__init__()
        self.max_positions = max_positions
        self.max_positions_option = max_positions_option
        self.weight = nn.Parameter(torch.zeros(num_heads, max_positions, max_positions))

    def forward(self, ctx: PositionContext, tgt_len: int, src_len: int) -> Tensor:
        check_length(
            src_len, self.max_positions, "the direct absolute position matrix A^p",
            self.max_positions_option,
        )
        if ctx.positions is None:  # right padding: token positions are the indices
            first_query = src_len - tgt_len
            return self.weight[:, first_query:src_len, :src_len].unsqueeze(0)
        query_pos, key_pos = ctx.query_key_positions(tgt_len, src_len)
        bias = self.weight[:, query_pos[:, :, None], key_pos[:, None, :]]  # H x B x Tq x Tk
        return bias.transpose(0, 1)


class DirectRelativePositionBias(AdditiveLogitBias):
    """Relative interactions ``A + a^r[i - j + t - 1]`` with a learnable vector of 2t - 1 per head.

    Initialised to zero: training starts from plain attention.
    """

    def __init__(self, num_heads: int, max_positions: int, max_positions_option: str):
        super().__init__()
        self.max_positions = max_positions
        self.max_positions_option = max_positions_option
        self.weight = nn.Parameter(torch.zeros(num_heads, 2 * max_positions - 1))

    def forward(self, ctx: PositionContext, tgt_len: int, src_len: int) -> Tensor:
        check_length(
            src_len, self.max_positions, "the direct relative position vector a^r",
            self.max_positions_option,
        )
        index = ctx.relative_distances(tgt_len, src_len) + (self.max_positions - 1)
        return self.weight[:, index].unsqueeze(0)
