"""CABLE: context-aware biases for length extrapolation (Veisi, Amirzadeh and Mansourian 2025, "Context-aware
Biases for Length Extrapolation", arXiv 2503.08067; the authors' code: axiomlab/Cable, ``src/Cable.py``).

Like ALiBi, CABLE lowers the logit of a key by a slope per token it lies back; unlike ALiBi the slope is learned
per token and head from the token's input to the attention layer,

    m_t = softplus(w_h . x_t + b_h) >= 0,

and the bias of query i on key j <= i sums the slopes of the tokens after the key up to the query,

    B_ij = -sum_{l = j+1 .. i} m_l = c_i - c_j,     c_i = -sum_{l <= i} m_l,

as the authors' code computes it (``b = cumsum(-softplus(h_attn(x)))``, ``Bias = b_i - b_j``). A difference of
per-token cumulative sums is a :class:`~posattn.position_terms.base.TokenDifferenceBias`, fused by flex_attention
and SDPA as FoX's forget gates are.

Choices:

- **the slope's input** is the attention layer's input as fairseq hands it to self-attention (after the layer norm
  on a pre-norm side, as the authors' ``attn(ln_1(x))``), one linear map with one output per head and a bias,
  initialised as the authors' ``_init_weights`` does (weights normal with standard deviation 0.02, bias 0: every
  slope starts at ``log 2``);
- **the content logits are divided by sqrt(d_h)**, as everywhere in the kernel: the authors' ``Cable.py``
  divides them by ``sqrt(C / n_embd) = 1`` (not at all), their evaluation notebook by ``sqrt(n_embd)``;
- ``softplus`` and the cumulative sum in fp32 (fp64 for a double model); a pad's slope is 0, so a padded batch
  gives each sentence the biases it has alone;
- **causal sides only** (the decoder, the language model), the case the authors' code defines: the slopes
  accumulate along the order of the tokens; the option exists on the decoder only;
- since ``-softplus(z) = log sigmoid(-z)``, CABLE's bias with ``(w, b)`` is FoX's with ``(-w, -b)``: the two
  methods are one family of functions, parametrised with opposite signs (tested).
"""

from typing import Any, List, Optional

import torch.nn.functional as F
from torch import Tensor, nn

from posattn.position_context import PositionContext
from posattn.position_terms.base import TokenDifferenceBias, at_least_fp32, same_dtype
from posattn.position_terms.quantities import BARS, Quantity
from posattn.position_terms.registry import LayerSpec, MethodOption, PositionMethod, register

#: the standard deviation of the slope weights' initialisation (the authors' ``_init_weights``)
SLOPE_INIT_STD = 0.02


class ContextAwareSlopeBias(TokenDifferenceBias):
    """``logits[b, h, i, j] += c[b, h, i] - c[b, h, j]``, ``c`` minus the cumulative slopes of head h."""

    def __init__(self, embed_dim: int, num_heads: int):
        super().__init__()
        self.slope = nn.Linear(embed_dim, num_heads)
        nn.init.normal_(self.slope.weight, std=SLOPE_INIT_STD)
        nn.init.zeros_(self.slope.bias)

    def slopes(self, x: Tensor, ctx: PositionContext) -> Tensor:
        """``(batch, heads, tgt_len)``: ``m_t`` of the current tokens (0 at pads), in fp32 at least."""
        logits = self.slope(x)  # tgt_len x batch x heads
        # softplus(z) as -log sigmoid(-z), the same number: softplus' backward under torch.compile with dynamic
        # shapes views a permuted tensor it cannot (torch 2.13, aot_eager)
        slopes = -F.logsigmoid(-same_dtype(logits, at_least_fp32(logits.dtype))).permute(1, 2, 0)
        return slopes.masked_fill(ctx.query_padding_mask(x.size(0))[:, None, :], 0.0)

    def token_values(self, x: Tensor, ctx: PositionContext, earlier: Optional[Tensor]) -> Tensor:
        """``c`` of every token: the earlier tokens' followed by the sums continued over the current ones."""
        return self.continued_sums(-self.slopes(x, ctx), earlier)

    def inspect(self, positions: int) -> List[Quantity]:
        """Per head, the slope at a zero input ``softplus(b_h)`` and the norm of its weights ``|w_h|`` (the slopes
        themselves depend on the tokens)."""
        bias = F.softplus(self.slope.bias.detach().float().cpu())
        norm = self.slope.weight.detach().float().cpu().norm(dim=1)
        return [Quantity("slope-at-zero-input", bias, BARS, "slope softplus(b_h) at a zero input", signed=False),
                Quantity("slope-weight-norm", norm, BARS, "norm of the slope's weights |w_h|", signed=False)]


class CableMethod(PositionMethod):
    name = "cable"
    citation = "Veisi et al. 2025 (arXiv 2503.08067), CABLE"
    sides = ("decoder",)
    options = (
        MethodOption("cable", False,
                     "CABLE's context-aware biases in every layer of the {what} (Veisi et al. 2025): a slope "
                     "m_t = softplus(w_h . x_t + b_h) per head and token, the logit of query i and key j lowered by "
                     "sum_{{l=j+1..i}} m_l"),
    )
    benchmark_target = "additive"
    variants = {"cable": {"cable": True}}
    labels = {"cable": "CABLE"}
    combined = {"cable": True}

    def is_on(self, options: Any) -> bool:
        return options.cable

    def terms(self, options: Any, layer: LayerSpec) -> List[nn.Module]:
        return [ContextAwareSlopeBias(layer.num_heads * layer.head_dim, layer.num_heads)]


register(CableMethod())
