"""The suite's model: a small pre-norm decoder whose attention is ``posattn.SelfAttention``.

Token embedding (and, for the ``absolute`` baseline only, the sinusoidal position embedding of Vaswani et al.
2017, section 3.5, added to it), ``layers`` pre-norm blocks (``x + attn(LN(x))``, then ``x + mlp(LN(x))`` with a
GELU MLP of four times the width, as GPT-2), a final layer norm and an untied output projection. No dropout:
the tasks draw fresh examples at every step. Every layer's attention is built from one side's options, so
side-wide tables are shared as in the library's other front-ends.
"""

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

import posattn
from posattn.position_context import PositionContext
from posattn.position_options import SidePositionOptions


@dataclass(frozen=True)
class ModelSize:
    """The decoder's width, depth and heads."""

    dim: int = 64
    layers: int = 2
    heads: int = 4


def sinusoidal_positions(length: int, dim: int, device: torch.device) -> Tensor:
    """Vaswani et al. 2017, section 3.5: PE(p, 2i) = sin(p / 10000^(2i/d)), PE(p, 2i+1) = cos(...); ``(length, dim)``."""
    position = torch.arange(length, device=device, dtype=torch.float32)[:, None]
    frequency = torch.exp(torch.arange(0, dim, 2, device=device, dtype=torch.float32) * (-math.log(10000.0) / dim))
    table = torch.zeros(length, dim, device=device)
    table[:, 0::2] = torch.sin(position * frequency)
    table[:, 1::2] = torch.cos(position * frequency)
    return table


class Block(nn.Module):
    """One pre-norm decoder block."""

    def __init__(self, size: ModelSize, options: SidePositionOptions, layer_index: int):
        super().__init__()
        self.attn_norm = nn.LayerNorm(size.dim)
        self.attn = posattn.SelfAttention(size.dim, size.heads, causal=True, options=options,
                                          layer_index=layer_index)
        self.mlp_norm = nn.LayerNorm(size.dim)
        self.mlp = nn.Sequential(nn.Linear(size.dim, 4 * size.dim), nn.GELU(), nn.Linear(4 * size.dim, size.dim))

    def forward(self, x: Tensor, context: PositionContext) -> Tensor:
        x = x + self.attn(self.attn_norm(x), context=context)
        return x + self.mlp(self.mlp_norm(x))


class TaskDecoder(nn.Module):
    """Logits ``(batch, length, vocabulary)`` of ``tokens`` ``(batch, length)``, causal."""

    def __init__(self, vocabulary_size: int, size: ModelSize, options: SidePositionOptions,
                 sinusoidal: bool = False):
        super().__init__()
        self.embed = nn.Embedding(vocabulary_size, size.dim)
        self.sinusoidal = sinusoidal
        self.blocks = nn.ModuleList(Block(size, options, i) for i in range(size.layers))
        self.norm = nn.LayerNorm(size.dim)
        self.output = nn.Linear(size.dim, vocabulary_size, bias=False)
        self.options = options

    def forward(self, tokens: Tensor) -> Tensor:
        x = self.embed(tokens)
        if self.sinusoidal:
            x = x + sinusoidal_positions(tokens.shape[1], x.shape[-1], tokens.device).to(x.dtype)
        # one context per batch, shared by the layers: their position tables are prepared once, not per layer
        context = posattn.batch_context(None, True, tokens.shape[1], tokens.device)
        for block in self.blocks:
            x = block(x, context)
        return self.output(self.norm(x))

    def check_length(self, length: int) -> None:
        """Refuse, in one line, a length longer than the positions of the method's terms."""
        self.options.check_length(length)
