"""A small GPT-style language model whose attention is ``posattn.SelfAttention``.

The layers mirror fairseq's ``transformer_lm`` (``transformer_lm_posattn`` in the fairseq recipe) so that the
two recipes' perplexities are comparable:

- token embeddings N(0, d^-1/2) with the padding row zero, scaled by sqrt(d) (fairseq's ``Embedding`` and
  ``embed_scale``), dropout after them, no position embedding (``--no-token-positional-embeddings``: the
  position method is the model's only position information);
- post-norm layers (fairseq's default ``decoder_normalize_before=False``):
  ``x = LN(x + drop(attn(x)))``, then ``x = LN(x + drop(fc2(relu(fc1(x)))))``; fc1 and fc2 keep PyTorch's
  initialisation (fairseq builds them as plain ``nn.Linear``), the attention's fairseq's
  (``SelfAttention.reset_parameters``); attention dropout 0;
- no final layer norm; the output projection is the input embedding (``--share-decoder-input-output-embed``).

A nanoGPT model takes the position method by one line in its ``Block``:
``self.attn = posattn.SelfAttention(n_embd, n_head, causal=True, options=opts, layer_index=i)``.
"""

import math
from dataclasses import dataclass

import torch.nn.functional as F
from torch import Tensor, nn

import posattn
from posattn.position_options import SidePositionOptions


@dataclass
class ModelSize:
    """The recipe's sizes (fairseq's ``--decoder-embed-dim``, ``-ffn-embed-dim``, ``-layers``, ``-attention-heads``)."""

    dim: int = 128
    ffn_dim: int = 512
    layers: int = 2
    heads: int = 4
    dropout: float = 0.1


class PostNormBlock(nn.Module):
    """One fairseq ``TransformerDecoderLayer`` without encoder attention, post-norm."""

    def __init__(self, size: ModelSize, options: SidePositionOptions, layer_index: int):
        super().__init__()
        self.attn = posattn.SelfAttention(size.dim, size.heads, causal=True, options=options, layer_index=layer_index)
        self.attn_norm = nn.LayerNorm(size.dim)
        self.fc1 = nn.Linear(size.dim, size.ffn_dim)
        self.fc2 = nn.Linear(size.ffn_dim, size.dim)
        self.ffn_norm = nn.LayerNorm(size.dim)
        self.dropout = nn.Dropout(size.dropout)

    def forward(self, x: Tensor) -> Tensor:
        x = self.attn_norm(x + self.dropout(self.attn(x)))
        return self.ffn_norm(x + self.dropout(self.fc2(F.relu(self.fc1(x)))))


class PositionLM(nn.Module):
    """Token embedding, post-norm blocks sharing one side's position options, tied output projection."""

    def __init__(self, vocab_size: int, padding_index: int, size: ModelSize, options: SidePositionOptions):
        super().__init__()
        self.embed = nn.Embedding(vocab_size, size.dim, padding_idx=padding_index)
        nn.init.normal_(self.embed.weight, mean=0.0, std=size.dim ** -0.5)
        nn.init.zeros_(self.embed.weight[padding_index])
        self.embed_scale = math.sqrt(size.dim)
        self.dropout = nn.Dropout(size.dropout)
        self.blocks = nn.ModuleList(PostNormBlock(size, options, i) for i in range(size.layers))

    def forward(self, tokens: Tensor) -> Tensor:
        """Logits ``(batch, length, vocab)`` of the next token at every position of ``tokens`` ``(batch, length)``."""
        x = self.dropout(self.embed_scale * self.embed(tokens))
        for block in self.blocks:
            x = block(x)
        return F.linear(x, self.embed.weight)

    def parameter_count(self) -> int:
        """Parameters, the tied embedding once (as fairseq counts them)."""
        return sum(p.numel() for p in self.parameters())
