"""Character-level word representation: a convolution over each word's characters, max-pooled
(Yu et al. 2017, as used by Dufter et al. 2020, section 2.1; filter width 3, 64 filters)."""

import torch
from torch import Tensor, nn


class CharCNNWordEncoder(nn.Module):
    """``(batch, words, max_chars)`` character ids -> ``(batch, words, filters)`` word vectors.

    Character embeddings, one Conv1d (``same`` padding) with ReLU, then a max over the word's real
    characters (padding characters never win the max; a word of pads only gives zeros).
    """

    def __init__(self, num_chars: int, padding_idx: int, embed_dim: int = 64, filters: int = 64,
                 width: int = 3):
        super().__init__()
        self.padding_idx = padding_idx
        self.embed = nn.Embedding(num_chars, embed_dim, padding_idx=padding_idx)
        self.conv = nn.Conv1d(embed_dim, filters, width, padding=width // 2)
        self.output_dim = filters

    def forward(self, chars: Tensor) -> Tensor:
        batch, words, max_chars = chars.shape
        flat = chars.view(batch * words, max_chars)
        features = torch.relu(self.conv(self.embed(flat).transpose(1, 2)))  # (B*W, filters, chars)
        is_pad = flat.eq(self.padding_idx).unsqueeze(1)
        pooled = features.masked_fill(is_pad, 0.0).amax(dim=2)  # ReLU output >= 0: 0 is a neutral fill
        return pooled.view(batch, words, self.output_dim)
