"""Absolute structural position embedding (Wang et al. 2019, eq. 5 and 7; see docs/methods.md).

The tree depth of each token's word goes through the *same* sinusoidal function as fairseq's
sequential positions (fairseq offsets positions by ``padding_idx + 1``; depth d uses the row that
sequential position d uses), and is combined with the sequential embedding by

- ``add``: the parameter-free sum (the paper's footnote 1), or
- ``nonlinear``: ``tanh(W [PE_seq ; PE_stru] + b)``, a learned fusion (the paper's f_abs, eq. 7,
  whose form the paper leaves open).

Without sequential embeddings (``--no-token-positional-embeddings``) the structural one is used alone.
"""

from typing import Optional

import torch
import torch.nn.functional as F
from fairseq.modules import SinusoidalPositionalEmbedding
from torch import Tensor, nn

from fairseq_posattn.modules.position_terms.base import check_length


class StructuralPositionalEmbedding(nn.Module):
    def __init__(self, embed_dim: int, padding_idx: int, max_depth: int, fusion: str):
        super().__init__()
        self.padding_idx = padding_idx
        self.max_depth = max_depth
        table = SinusoidalPositionalEmbedding.get_embedding(max_depth + padding_idx + 2, embed_dim, padding_idx)
        self.register_buffer("table", table, persistent=False)
        self.fusion = nn.Linear(2 * embed_dim, embed_dim) if fusion == "nonlinear" else None

    def forward(self, depth: Tensor, padding_mask: Tensor, sequential: Optional[Tensor]) -> Tensor:
        """``depth``, ``padding_mask``: ``(batch, length)``; ``sequential``: ``(batch, length, dim)``."""
        # a word's depth is below the sentence's token count: checking the length needs no sync
        check_length(depth.size(1), self.max_depth, "the structural position embedding (tree depth)")
        index = (depth + self.padding_idx + 1).masked_fill(padding_mask, self.padding_idx)
        structural = F.embedding(index, self.table.to(sequential.dtype if sequential is not None else self.table.dtype))
        if sequential is None:
            return structural
        if self.fusion is None:
            return sequential + structural
        return torch.tanh(self.fusion(torch.cat([sequential, structural], dim=-1)))
