"""Sandwich (Chi et al. 2023, "Dissecting Transformer Length Extrapolation via the Lens of Receptive Field
Analysis", section 5), a parameter-free baseline.

Sandwich keeps, of the sinusoidal embeddings' contribution to a logit, only the product of the two position
embeddings, ``p_i . p_j``: with ``p`` the sinusoid of ``d'`` dimensions, that product is a function of
``i - j`` alone, ``sum_{k=1}^{d'/2} cos((i - j) / 10000^(2k/d'))``, which decays roughly logarithmically
over the first distances (the pattern that KERPLE-log and T5 learn) and oscillates beyond. Head h of H
(h = 1 .. H) adds

    bias_h(i - j) = (sum_{k=1}^{d'/2} cos((i - j) / 10000^(2k/d')) - d'/2) / (8h / H)

to the logit of query i and key j. Choices:

- **the per-head scaling**: ALiBi's exponents ``8h/H`` divide the bias as compression ratios, so the heads
  range from steep (h = 1) to flat (h = H) as ALiBi's slopes ``2^(-8h/H)`` do; the same scaling as NVIDIA
  NeMo's implementation of Sandwich (``sandwich_pos_bias``);
- **the shift ``-d'/2``** makes the bias 0 at distance 0 and negative elsewhere (a constant per query: the
  softmax does not see it);
- **the sum runs over k = 1 .. d'/2** as the paper writes it: the fastest frequency is ``10000^(-2/d')``, the
  slowest ``1/10000`` (a standard sinusoid's k = 0 term, ``cos(i - j)``, is not in it);
- **d'** (``--{side}-sandwich``) is the paper's hyperparameter, independent of the model's sizes; no default
  is implied beyond the registered variant's 128;
- the paper is about causal language models; the bias is even in ``i - j``, so a bidirectional side (an
  encoder) takes the same formula.

No parameters: the bias of every distance is one ``(heads, distances)`` table, prepared once per batch for
every layer (built in fp64, cast to the model's precision, at least fp32); the explicit and SDPA paths read
the bias of every pair gathered from it, once per batch too, the ``score_mod`` indexes it at ``[h, |i - j|]``.
"""

from dataclasses import dataclass
from typing import Any, Hashable, List, Tuple

import torch
from torch import Tensor, nn

from posattn.position_context import AbsoluteDistances, PositionContext, Preparation
from posattn.position_terms.base import AdditiveLogitBias, ScoreMod, at_least_fp32, lookup
from posattn.position_terms.quantities import CURVE, Quantity
from posattn.position_terms.registry import (
    LayerSpec,
    MethodOption,
    PositionMethod,
    PositionOptionError,
    register,
)

SINUSOID_BASE = 10000.0


def compression_ratios(num_heads: int) -> Tensor:
    """``8h / H`` of the heads h = 1 .. H (ALiBi's exponents), by which each head's bias is divided."""
    return torch.arange(1, num_heads + 1, dtype=torch.float64) * 8.0 / num_heads


def sandwich_bias(num_heads: int, dim: int, distance: Tensor) -> Tensor:
    """``(heads, *distance.shape)`` in fp64: Sandwich's bias of each distance (any sign, any shape)."""
    k = torch.arange(1, dim // 2 + 1, dtype=torch.float64, device=distance.device)
    frequency = SINUSOID_BASE ** (-2.0 * k / dim)
    product = torch.cos(distance.to(torch.float64)[..., None] * frequency).sum(-1) - dim / 2
    ratios = compression_ratios(num_heads).to(distance.device)
    return product[None] / ratios.view(-1, *([1] * distance.dim()))


@dataclass(frozen=True)
class SandwichTable(Preparation):
    """``(heads, length)``: the bias of every distance ``0 .. length - 1``, in ``dtype``."""

    num_heads: int
    dim: int
    length: int
    dtype: torch.dtype

    def build(self, ctx: PositionContext) -> Tensor:
        distance = torch.arange(self.length, device=ctx.padding_mask.device)
        return sandwich_bias(self.num_heads, self.dim, distance).to(self.dtype)


@dataclass(frozen=True)
class SandwichPairs(Preparation):
    """``(1, heads, tgt_len, src_len)``: the bias of the last ``tgt_len`` queries and every key, read from the
    prepared table of its distances (``table``: the last query's key length)."""

    table: SandwichTable
    tgt_len: int

    def build(self, ctx: PositionContext) -> Tensor:
        distance = ctx.prepared(AbsoluteDistances(self.tgt_len, self.table.length))
        return lookup(ctx.prepared(self.table), 1, distance).unsqueeze(0)


class SandwichBias(AdditiveLogitBias):
    """``logits[h, i, j] += bias_h(|i - j|)``: the sinusoids' product, shifted and compressed per head."""

    def __init__(self, num_heads: int, dim: int):
        super().__init__()
        self.num_heads, self.dim = num_heads, dim
        # a buffer only for the dtype the model is cast to (the table is built at least in fp32)
        self.register_buffer("ratios", compression_ratios(num_heads).float(), persistent=False)

    def extra_repr(self) -> str:
        return f"dim={self.dim}"

    def table_key(self, *built_with: Hashable) -> Tuple[Hashable, ...]:
        """Parameter-free: the layers of a side with the same sizes share the sequence's table."""
        return (SandwichTable, self.num_heads, self.dim, *built_with)

    def table(self, ctx: PositionContext, length: int) -> Tensor:
        """:class:`SandwichTable` of ``length`` distances, prepared once per batch for every layer."""
        return ctx.prepared(SandwichTable(self.num_heads, self.dim, length, at_least_fp32(self.ratios.dtype)))

    def prepared_bias(self, tgt_len: int, src_len: int) -> Preparation:
        """No parameters: the bias of every pair is prepared once per batch for every layer."""
        return SandwichPairs(SandwichTable(self.num_heads, self.dim, src_len, at_least_fp32(self.ratios.dtype)),
                             tgt_len)

    def forward(self, ctx: PositionContext, tgt_len: int, src_len: int) -> Tensor:
        """``(1, heads, tgt_len, src_len)``, prepared once per batch for every layer (:meth:`prepared_bias`)."""
        return ctx.prepared(self.prepared_bias(tgt_len, src_len))

    def score_mod(self, ctx: PositionContext, q: Tensor, src_len: int) -> ScoreMod:
        """``score + bias[h, |i - j|]`` from the prepared table."""
        table, offset = self.table(ctx, src_len), src_len - q.size(2)

        def sandwich(score: Tensor, b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
            return score + table[h, (q_idx + offset - kv_idx).abs()].to(score.dtype)
        return sandwich

    def inspect(self, positions: int) -> List[Quantity]:
        """Each head's (fixed) bias over ``i - j`` for the first ``positions`` positions."""
        distance = torch.arange(-(positions - 1), positions)
        bias = sandwich_bias(self.num_heads, self.dim, distance).float()
        return [Quantity("bias", bias, CURVE,
                         f"fixed bias (sum_k cos((i - j) / 10000^(2k/{self.dim})) - {self.dim // 2}) / (8h/H)",
                         axes=("i - j (query position minus key position)", "bias"),
                         ticks=(distance.tolist(),))]


class SandwichMethod(PositionMethod):
    name = "sandwich"
    citation = "Chi et al. 2023, section 5"
    options = (
        MethodOption("sandwich", 0,
                     "Sandwich's parameter-free bias in every layer of the {what} (Chi et al. 2023): the "
                     "product of two sinusoidal position embeddings of this even dimension d', sum_k cos((i - "
                     "j) / 10000^(2k/d')) - d'/2, divided by 8h/H in head h = 1..H (ALiBi's exponents); "
                     "0 = off"),
    )
    benchmark_target = "additive"
    variants = {"sandwich": {"sandwich": 128}}
    labels = {"sandwich": "Sandwich"}
    combined = {"sandwich": 128}

    def is_on(self, options: Any) -> bool:
        return options.sandwich != 0

    def validate(self, options: Any) -> None:
        dim = options.sandwich
        if dim < 0 or dim % 2:
            raise PositionOptionError(
                f"{options.flag('sandwich')} is the even dimension d' of the sinusoids (0 = off), got {dim}")

    def terms(self, options: Any, layer: LayerSpec) -> List[nn.Module]:
        return [SandwichBias(layer.num_heads, options.sandwich)]


register(SandwichMethod())
