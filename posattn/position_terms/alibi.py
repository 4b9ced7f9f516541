"""ALiBi: attention with linear biases (Press et al. 2022, section 3), a baseline.

No parameters: head h adds ``-m_h * (i - j)`` to the logit of query i and key j <= i, with the
paper's fixed geometric slopes. For n heads, n a power of two, ``m_h = 2^(-8 h / n)``, h = 1..n
(1/2, 1/4, ... 1/256 for 8 heads); otherwise the slopes of the largest power of two p below n,
followed by every other slope of 2p heads (the odd-numbered ones) until there are n, as the
authors' code does.

ALiBi is published for causal language models (keys after the query are masked). On a
bidirectional side (an encoder) this plug-in uses the symmetric form ``-m_h * |i - j|``, our
choice: the paper does not define one. Press et al. drop the position embeddings; so can users,
with fairseq's ``--no-token-positional-embeddings``.
"""

import math
from dataclasses import dataclass
from typing import Any, List, Optional

import torch
from torch import Tensor, nn

from posattn.position_context import PositionContext, Preparation
from posattn.position_terms.base import AdditiveLogitBias, ScoreMod, at_least_fp32
from posattn.position_terms.quantities import CURVE, Quantity
from posattn.position_terms.registry import LayerSpec, MethodOption, PositionMethod, register


def alibi_slopes(num_heads: int, dtype: torch.dtype = torch.float64,
                 device: Optional[torch.device] = None) -> Tensor:
    """The paper's head slopes ``m_1 .. m_n`` (section 3), each rounded once to ``dtype`` from its exact value."""
    def geometric(n: int) -> List[float]:
        return [2.0 ** (-8.0 * h / n) for h in range(1, n + 1)]

    power = 2 ** int(math.floor(math.log2(num_heads)))
    slopes = geometric(power) + geometric(2 * power)[0::2][: num_heads - power]
    return torch.tensor(slopes, dtype=dtype, device=device)


@dataclass(frozen=True)
class Slopes(Preparation):
    """:func:`alibi_slopes` of ``num_heads`` heads in ``dtype``, on the batch's device."""

    num_heads: int
    dtype: torch.dtype

    def build(self, ctx: PositionContext) -> Tensor:
        return alibi_slopes(self.num_heads, self.dtype, ctx.padding_mask.device)


@dataclass(frozen=True)
class LinearBias(Preparation):
    """ALiBi's bias ``-m_h (i - j)`` (causal; keys after i are masked anyway) or ``-m_h |i - j|``, computed in fp32
    at least and given in ``dtype``."""

    num_heads: int
    causal: bool
    tgt_len: int
    src_len: int
    dtype: torch.dtype

    def build(self, ctx: PositionContext) -> Tensor:
        distance = ctx.relative_distances(self.tgt_len, self.src_len)
        distance = distance.clamp(min=0) if self.causal else distance.abs()
        computed = at_least_fp32(self.dtype)
        slopes = ctx.prepared(Slopes(self.num_heads, computed))
        return -(slopes[:, None, None] * distance.to(computed)).unsqueeze(0).to(self.dtype)


class LinearDistanceBias(AdditiveLogitBias):
    """``logits[h, i, j] -= m_h * (i - j)`` (causal) or ``m_h * |i - j|`` (bidirectional).

    The slopes are computed in the dtype of the call from their exact values (:attr:`slopes`), never cast from
    another dtype's: a float32 slope in a float64 model is 1e-8 off. The layer's dtype is that of an empty
    buffer, which follows the model's ``.to()`` / ``.double()``."""

    def __init__(self, num_heads: int, causal: bool):
        super().__init__()
        self.num_heads, self.causal = num_heads, causal
        self.register_buffer("dtype_anchor", torch.empty(0), persistent=False)

    @property
    def slopes(self) -> Tensor:
        """The head slopes in the layer's dtype, on its device."""
        return alibi_slopes(self.num_heads, self.dtype_anchor.dtype, self.dtype_anchor.device)

    def prepared_bias(self, tgt_len: int, src_len: int) -> Preparation:
        """No parameters: the bias is prepared once per batch for every layer."""
        return LinearBias(self.num_heads, self.causal, tgt_len, src_len, self.dtype_anchor.dtype)

    def forward(self, ctx: PositionContext, tgt_len: int, src_len: int) -> Tensor:
        """``(1, heads, tgt_len, src_len)``, prepared once per batch for every layer (:meth:`prepared_bias`)."""
        return ctx.prepared(self.prepared_bias(tgt_len, src_len))

    def score_mod(self, ctx: PositionContext, q: Tensor, src_len: int) -> ScoreMod:
        """``score - m_h (i - j)`` (causal) or ``score - m_h |i - j|``."""
        slopes = ctx.prepared(Slopes(self.num_heads, at_least_fp32(self.dtype_anchor.dtype)))
        causal, offset = self.causal, src_len - q.size(2)

        def alibi(score: Tensor, b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
            distance = q_idx + offset - kv_idx
            distance = distance.clamp(min=0) if causal else distance.abs()
            return score - (slopes[h] * distance.to(slopes.dtype)).to(score.dtype)
        return alibi

    def inspect(self, positions: int) -> List[Quantity]:
        """Each head's (fixed) bias over ``i - j`` for the first ``positions`` positions (``i - j >= 0``
        only on a causal side)."""
        distance = torch.arange(0 if self.causal else -(positions - 1), positions)
        slopes = alibi_slopes(self.num_heads)
        bias = (-slopes[:, None] * (distance if self.causal else distance.abs()).to(slopes.dtype)).float()
        form = "-m_h (i - j)" if self.causal else "-m_h |i - j|"
        return [Quantity("bias", bias, CURVE, f"fixed linear bias {form}",
                         axes=("i - j (query position minus key position)", "bias"),
                         ticks=(distance.tolist(),))]


class AlibiMethod(PositionMethod):
    name = "alibi"
    citation = "Press et al. 2022, section 3"
    options = (
        MethodOption("alibi", False,
                     "ALiBi linear distance biases in every layer of the {what} (Press et al. 2022): "
                     "-m_h (i - j) with the paper's fixed geometric slopes per head; symmetric "
                     "-m_h |i - j| on a bidirectional side (our choice)"),
    )
    benchmark_target = "additive"
    variants = {"alibi": {"alibi": True}}
    labels = {"alibi": "ALiBi"}
    combined = {"alibi": True}

    def is_on(self, options: Any) -> bool:
        return options.alibi

    def terms(self, options: Any, layer: LayerSpec) -> List[nn.Module]:
        return [LinearDistanceBias(layer.num_heads, options.causal)]


register(AlibiMethod())
