"""The plain-PyTorch group's models (``--pytorch``): a stack of causal self-attention layers as a plain PyTorch
model holds them, each ``x + attention(x)`` after a token embedding, with the mean square of the last output as
the loss. The reference's layers are a hand-written module calling ``F.scaled_dot_product_attention(q, k, v,
is_causal=True)``; the others are ``posattn.SelfAttention`` layers of the same projections built from one
``posattn.position_options`` (the row's keyword options), which share one ``posattn.batch_context(None, True,
length)`` per batch, as the library's documents advise a model with several layers to.

Only the workers of that group import this module.
"""

from typing import Any, Dict, List, Mapping

import torch
import torch.nn.functional as F
from torch import Tensor, nn

import posattn
from posattn_benchmark.variants import PYTORCH_OPTIONS, VANILLA_SDPA, Variant


class SDPASelfAttention(nn.Module):
    """Causal self-attention written by hand: four projections of ``posattn.SelfAttention``'s sizes and names and
    SDPA's causal kernel."""

    def __init__(self, embed_dim: int, num_heads: int):
        super().__init__()
        self.num_heads, self.head_dim = num_heads, embed_dim // num_heads
        self.q_proj, self.k_proj, self.v_proj, self.out_proj = (nn.Linear(embed_dim, embed_dim) for _ in range(4))

    def forward(self, x: Tensor) -> Tensor:
        batch, length, embed_dim = x.shape

        def heads(projection: nn.Linear) -> Tensor:
            return projection(x).view(batch, length, self.num_heads, self.head_dim).transpose(1, 2)

        out = F.scaled_dot_product_attention(heads(self.q_proj), heads(self.k_proj), heads(self.v_proj), is_causal=True)
        return self.out_proj(out.transpose(1, 2).reshape(batch, length, embed_dim))


class AttentionStack(nn.Module):
    """Token embedding, then ``x = x + layer(x)`` for each attention layer (the posattn layers with the batch's one
    context)."""

    def __init__(self, vocab_size: int, embed_dim: int, layers: List[nn.Module]):
        super().__init__()
        self.embed = nn.Embedding(vocab_size, embed_dim)
        self.layers = nn.ModuleList(layers)
        self.shares_context = isinstance(layers[0], posattn.SelfAttention)

    def forward(self, tokens: Tensor) -> Tensor:
        x = self.embed(tokens)
        if not self.shares_context:
            for layer in self.layers:
                x = x + layer(x)
            return x
        context = posattn.batch_context(None, True, tokens.size(1), tokens.device)
        for layer in self.layers:
            x = x + layer(x, context=context)
        return x


def build(variant: Variant, sizes: Mapping[str, int], vocab_size: int, max_positions: int) -> AttentionStack:
    """The reference's stack, or ``variant``'s (its keyword options, t = ``max_positions``). Seed torch first for
    the same weights."""
    embed_dim, heads = sizes["embed_dim"], sizes["heads"]
    if variant == VANILLA_SDPA:
        layers: List[nn.Module] = [SDPASelfAttention(embed_dim, heads) for _ in range(sizes["layers"])]
    else:
        options = posattn.position_options(True, max_positions, **PYTORCH_OPTIONS[variant.name])
        layers = [posattn.SelfAttention(embed_dim, heads, causal=True, options=options, layer_index=index,
                                        max_positions=max_positions) for index in range(sizes["layers"])]
    return AttentionStack(vocab_size, embed_dim, layers)


def loss(model: AttentionStack, batch: Dict[str, Any]) -> Tensor:
    """The mean square of the last layer's output on the batch's token blocks (they hold no pad)."""
    return model(batch["net_input"]["src_tokens"]).float().pow(2).mean()
