"""Distance-aware attention (Wu et al. 2021, DA-Transformer, section 3; SPEC.md section 4)."""

import torch
from torch import Tensor, nn

from fairseq_posattn.modules.position_context import PositionContext
from fairseq_posattn.modules.position_terms.base import LogitScaling


class DistanceAwareScaling(LogitScaling):
    """``logits = ReLU(Q K^T) * Rhat / sqrt(d_h)`` with ``Rhat = f(w |i - j|; v)``.

    ``f(x; v) = (1 + exp(v)) / (1 + exp(v - x))``, computed stably as ``(1 + exp(v)) * sigmoid(x - v)``.
    Per head learnable w and v, both initialised to 0 so that ``f = 1`` everywhere at the start
    (SPEC.md). The logits it receives are already scaled by 1/sqrt(d_h); ReLU commutes with that
    positive scaling. Masks are applied by the kernel *after* this product.
    """

    def __init__(self, num_heads: int):
        super().__init__()
        self.w = nn.Parameter(torch.zeros(num_heads))
        self.v = nn.Parameter(torch.zeros(num_heads))

    def coefficients(self, ctx: PositionContext, tgt_len: int, src_len: int) -> Tensor:
        """``Rhat`` of shape ``(heads, tgt_len, src_len)``."""
        distance = ctx.relative_distances(tgt_len, src_len).abs().to(self.w.dtype)
        x = self.w[:, None, None] * distance
        v = self.v[:, None, None]
        return (1 + torch.exp(v)) * torch.sigmoid(x - v)

    def forward(self, logits: Tensor, ctx: PositionContext) -> Tensor:
        tgt_len, src_len = logits.shape[-2:]
        return torch.relu(logits) * self.coefficients(ctx, tgt_len, src_len).to(logits.dtype)
