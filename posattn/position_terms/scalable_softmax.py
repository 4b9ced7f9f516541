"""Scalable-Softmax, SSMax (Nakanishi 2025, "Scalable-Softmax Is Superior for Attention", arXiv 2501.19399).

SSMax replaces the softmax of a query's ``n`` logits ``z`` by ``n^(s z_j) / sum_j' n^(s z_j')``, the softmax of the
logits multiplied by ``s log n``, so that the largest weight does not fade as ``n`` grows; ``s`` is learned per
layer and head. As the paper implements it, the factor multiplies the query before the dot product:

    z_ij = (s_h log n_i) q_i . k_j / sqrt(d_h),

n_i the number of keys query i sees: its token position + 1 on a causal side, the sentence's real length (its
pads excluded) on a bidirectional one. A per-query factor on the query is a
:class:`~posattn.position_terms.base.QueryKeyTransform`, so the fused paths stay open (SDPA, flex_attention).

Choices:

- **what is scaled**: the query, so every logit term that reads it (the content logits, Shaw's key term, CoPE's
  ``q . e[p]``) is multiplied by ``s_h log n_i``; the additive biases of other methods (ALiBi, T5, FoX's gates...)
  are added after and are not (docs/methods.md, Order of operations);
- **the initial s** is the option's value (the paper's Figure 1 draws SSMax at s = 0.43; the registered variant
  starts there), one per head, learned;
- ``log n_i`` in fp32 at least; a causal side's first query (n = 1) gets a zero query: it sees itself alone;
- **decoding**: n_i comes from the token's position, so a decoding step scales its query as the full pass does.
"""

import math
from typing import Any, List, Tuple

import torch
from torch import Tensor, nn

from posattn.position_context import PositionContext
from posattn.position_terms.base import QueryKeyTransform, at_least_fp32, same_dtype
from posattn.position_terms.quantities import BARS, CURVE, Quantity
from posattn.position_terms.registry import (
    LayerSpec,
    MethodOption,
    PositionMethod,
    PositionOptionError,
    register,
)


class ScalableSoftmaxQuery(QueryKeyTransform):
    """``q_i <- s_h log(n_i) q_i``; the keys unchanged (module docstring)."""

    def __init__(self, num_heads: int, initial_scale: float, causal: bool):
        super().__init__()
        self.causal = causal
        self.scale = nn.Parameter(torch.full((num_heads,), float(initial_scale)))

    def extra_repr(self) -> str:
        return f"heads={self.scale.numel()}, causal={self.causal}"

    def log_keys_seen(self, ctx: PositionContext, tgt_len: int) -> Tensor:
        """``(batch or 1, tgt_len)``: ``log n_i`` of the current queries (the last ``tgt_len`` tokens), in fp32 at
        least (fp64 for a double model)."""
        dtype = at_least_fp32(self.scale.dtype)
        if self.causal:
            keys_seen = ctx.query_key_positions(tgt_len, ctx.length)[0] + 1
        else:
            keys_seen = (~ctx.padding_mask).sum(dim=1, keepdim=True).clamp(min=1).expand(-1, tgt_len)
        return keys_seen.to(dtype).log()

    def forward(self, q: Tensor, k: Tensor, ctx: PositionContext) -> Tuple[Tensor, Tensor]:
        log_n = self.log_keys_seen(ctx, q.size(2))
        factor = same_dtype(self.scale, log_n.dtype)[None, :, None] * log_n[:, None, :]  # b x h x tgt
        return same_dtype(same_dtype(q, factor.dtype) * factor[..., None], q.dtype), k

    def inspect(self, positions: int) -> List[Quantity]:
        """s per head, and each head's query factor ``s_h log n`` over n = 1 .. ``positions`` keys seen."""
        scale = self.scale.detach().float().cpu()
        seen = torch.arange(1, positions + 1)
        factors = scale[:, None] * seen.float().log()[None, :]
        return [Quantity("s", scale, BARS, "learned s per head"),
                Quantity("factor", factors, CURVE, "query factor s_h log n",
                         axes=("n (keys the query sees)", "factor"), ticks=(seen.tolist(),))]


class ScalableSoftmaxMethod(PositionMethod):
    name = "scalable-softmax"
    citation = "Nakanishi 2025 (arXiv 2501.19399), SSMax"
    options = (
        MethodOption("scalable_softmax", 0.0,
                     "Scalable-Softmax (SSMax, Nakanishi 2025) in every layer of the {what}: each query multiplied "
                     "by s_h log n, n the number of keys it sees (causal: its position + 1; bidirectional: the "
                     "sentence's length), s learned per head; the value is the initial s; 0 = off"),
    )
    benchmark_target = "additive"
    variants = {"scalable-softmax": {"scalable_softmax": 0.43}}
    labels = {"scalable-softmax": "SSMax"}
    combined = {"scalable_softmax": 0.43}

    def is_on(self, options: Any) -> bool:
        return options.scalable_softmax != 0

    def validate(self, options: Any) -> None:
        value = options.scalable_softmax
        if not math.isfinite(value) or value < 0:
            raise PositionOptionError(
                f"{options.flag('scalable_softmax')} is the initial s of SSMax's factor s log n, a positive number "
                f"(0 = off), got {value}" + (" (a negative s would turn every query around)" if value < 0 else ""))

    def terms(self, options: Any, layer: LayerSpec) -> List[nn.Module]:
        return [ScalableSoftmaxQuery(layer.num_heads, options.scalable_softmax, options.causal)]


register(ScalableSoftmaxMethod())
