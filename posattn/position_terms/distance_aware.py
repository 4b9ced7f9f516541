"""Distance-aware attention (Wu et al. 2021, DA-Transformer, section 3; see docs/methods.md)."""

from typing import Any, List

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from posattn.position_context import PositionContext
from posattn.position_terms.base import LogitScaling, ScoreMod, at_least_fp32, lookup, same_dtype
from posattn.position_terms.quantities import BARS, MATRIX, Quantity
from posattn.position_terms.registry import LayerSpec, MethodOption, PositionMethod, register


class DistanceAwareScaling(LogitScaling):
    """``logits = ReLU(Q K^T) * Rhat / sqrt(d_h)`` with ``Rhat = f(w |i - j|; v)`` (eq. 5 and 6).

    ``f(x; v) = (1 + exp(v)) / (1 + exp(v - x))`` is computed in log space, as
    ``exp(softplus(v) - softplus(v - x))``, and in fp32 whatever the model's precision: ``exp(v)``
    alone is inf in fp16 past v ~ 11 (and in fp32 past v ~ 88), while f stays finite until its true
    value overflows. Per head learnable w and v, both initialised to 0 so that ``f = 1`` everywhere
    at the start. The logits it receives are already scaled by 1/sqrt(d_h); ReLU commutes with that
    positive scaling. Masks are applied by the kernel *after* this product.
    """

    def __init__(self, num_heads: int):
        super().__init__()
        self.w = nn.Parameter(torch.zeros(num_heads))
        self.v = nn.Parameter(torch.zeros(num_heads))

    def rescaling(self, src_len: int, device: torch.device) -> Tensor:
        """``f(w_h d; v_h)`` (eq. 6) of every distance ``d = 0 .. src_len - 1``: ``(heads, src_len)``, in
        fp32 (or fp64 for a double model); both paths read ``Rhat`` from it."""
        dtype = at_least_fp32(self.w.dtype)
        distance = torch.arange(src_len, device=device, dtype=dtype)
        w, v = self.w.to(dtype)[:, None], self.v.to(dtype)[:, None]
        return torch.exp(F.softplus(v) - F.softplus(v - w * distance))

    def coefficients(self, ctx: PositionContext, tgt_len: int, src_len: int) -> Tensor:
        """``Rhat`` of shape ``(heads, tgt_len, src_len)``, in fp32 (or fp64 for a double model)."""
        distance = ctx.relative_distances(tgt_len, src_len).abs()
        return lookup(self.rescaling(src_len, distance.device), 1, distance)

    def forward(self, logits: Tensor, ctx: PositionContext) -> Tensor:
        """The rescaled logits in fp32 (the kernel's softmax runs in fp32 anyway). In incremental
        decoding ``Rhat`` comes from a table built once per sequence."""
        tgt_len, src_len = logits.shape[-2:]
        coefficients = ctx.pair_table(self.table_key(), tgt_len, src_len, self.coefficients)
        return torch.relu(same_dtype(logits, at_least_fp32(logits.dtype))) * coefficients

    def score_mod(self, ctx: PositionContext, q: Tensor, src_len: int) -> ScoreMod:
        """``ReLU(score) * Rhat[h, |i - j|]``, in fp32 (fp64 for a double model) and returned in the
        score's dtype; ``Rhat`` per head and distance ``0 .. src_len - 1`` is computed before the kernel
        (:func:`~posattn.position_terms.base.captured`)."""
        rescaling = self.rescaling(src_len, q.device)
        offset = src_len - q.size(2)

        def distance_aware(score: Tensor, b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
            coefficient = rescaling[h, (q_idx + offset - kv_idx).abs()]
            return (torch.relu(score.to(coefficient.dtype)) * coefficient).to(score.dtype)
        return distance_aware

    def inspect(self, positions: int) -> List[Quantity]:
        """w and v per head, and ``Rhat`` (eq. 6) of the first ``positions`` positions."""
        unpadded = PositionContext.unpadded(positions, self.w.device)
        coefficients = self.coefficients(unpadded, positions, positions).detach().cpu()
        return [Quantity("w", self.w.detach().cpu(), BARS, "learned w"),
                Quantity("v", self.v.detach().cpu(), BARS, "learned v"),
                Quantity("coefficients", coefficients, MATRIX, "re-scaled coefficients f(w|i-j|; v)",
                         signed=False)]


class DistanceAwareMethod(PositionMethod):
    name = "distance-aware"
    citation = "Wu et al. 2021, section 3"
    options = (
        MethodOption("distance_aware", False,
                     "distance-aware attention in every layer of the {what} (Wu et al. 2021, "
                     "DA-Transformer): ReLU(QK^T) * f(w |i - j|; v) / sqrt(d_h), f(x; v) = (1 + e^v) / "
                     "(1 + e^(v - x)), with w and v learned per head"),
    )
    benchmark_target = "scaling"
    variants = {"distance-aware": {"distance_aware": True}}
    labels = {"distance-aware": "DA-Transformer"}
    combined = {"distance_aware": True}

    def is_on(self, options: Any) -> bool:
        return options.distance_aware

    def terms(self, options: Any, layer: LayerSpec) -> List[nn.Module]:
        return [DistanceAwareScaling(layer.num_heads)]


register(DistanceAwareMethod())
