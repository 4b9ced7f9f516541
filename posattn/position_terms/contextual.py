"""CoPE: contextual position encoding (Golovneva et al. 2024, "Contextual Position Encoding: Learning to Count
What's Important", section 3), a baseline.

CoPE counts positions with gates decided by the content. The gate of query i on key j is
``g_ij = sigmoid(q_i . k_j)``, and the position of key j seen from query i is the sum of the gates from j to
i,

    p_ij = sum_{t = j .. i} g_it,

a fractional position. Each integer position p has a learned embedding ``e[p]``; a fractional one is
interpolated, ``e[p_ij] = (p_ij - floor p_ij) e[ceil p_ij] + (1 - p_ij + floor p_ij) e[floor p_ij]``, and the
logit gets ``q_i . e[p_ij]``. As the authors compute it, the products ``q_i . e[p]`` of the integer positions
are taken once per query and interpolated, and positions are clipped at ``p_max - 1``.

Choices, as the authors' reference code does them:

- **the gates** are the sigmoid of the row's logits after every earlier step of the kernel, masks included:
  a key the query may not see (the future, a pad) has a gate of 0 and counts nothing. With CoPE alone these
  are the content logits ``q_i . k_j / sqrt(d_h)``; the position term uses the query before that scaling;
- **one table per layer**, ``e`` of ``(head_dim, p_max)`` shared by the heads, initialised to zero;
- **the gates, the counts and the interpolation in fp32** (fp64 for a double model), cast back to the model's
  dtype;
- **causal sides only** (the decoder, the language model): the paper counts from the key up to the query; the
  option exists on the decoder only.

The term needs each query's whole row (the count sums gates over keys), so a layer with it takes the explicit
path; a decoding step's row holds every cached key, so nothing is cached.
"""

from typing import Any, List

import torch
from torch import Tensor, nn

from posattn.position_context import PositionContext
from posattn.position_terms.base import RowDependentBias, at_least_fp32, same_dtype
from posattn.position_terms.quantities import TABLE, Quantity
from posattn.position_terms.registry import (
    LayerSpec,
    MethodOption,
    PositionMethod,
    PositionOptionError,
    register,
)


def contextual_positions(logits: Tensor, count_limit: int) -> Tensor:
    """``p_ij = sum_{t >= j} sigmoid(logits_it)`` (masked keys, at ``-inf``, add 0), clipped at ``count_limit - 1``."""
    gates = torch.sigmoid(logits)
    return gates.flip(-1).cumsum(dim=-1).flip(-1).clamp(max=count_limit - 1)


def interpolated(per_position: Tensor, positions: Tensor) -> Tensor:
    """``per_position[..., p]`` at fractional ``positions``, linearly between ``floor p`` and ``ceil p``."""
    low, high = positions.floor(), positions.ceil()
    weight = positions - low
    return (per_position.gather(-1, high.long()) * weight
            + per_position.gather(-1, low.long()) * (1 - weight))


class ContextualPositionBias(RowDependentBias):
    """``logits[b, h, i, j] += q_i . e[p_ij]``, CoPE's interpolated embedding of the contextual position."""

    def __init__(self, head_dim: int, count_limit: int):
        super().__init__()
        self.head_dim, self.count_limit = head_dim, count_limit
        self.embeddings = nn.Parameter(torch.zeros(head_dim, count_limit))

    def extra_repr(self) -> str:
        return f"head_dim={self.head_dim}, count_limit={self.count_limit}"

    def forward(self, logits: Tensor, q: Tensor, ctx: PositionContext) -> Tensor:
        dtype = at_least_fp32(logits.dtype)
        positions = contextual_positions(same_dtype(logits, dtype), self.count_limit)
        unscaled = same_dtype(q, dtype) * self.head_dim ** 0.5  # the kernel's queries are scaled by 1/sqrt(d_h)
        per_position = torch.matmul(unscaled, same_dtype(self.embeddings, dtype))  # b x h x tgt x p_max
        return interpolated(per_position, positions)

    def inspect(self, positions: int) -> List[Quantity]:
        """The position embeddings ``e[p]``, a row per integer contextual position."""
        table = self.embeddings.detach().float().cpu().t()
        return [Quantity("embeddings", table, TABLE, "CoPE position embeddings e[p]",
                         axes=("contextual position p", "dimension"))]


class ContextualPositionMethod(PositionMethod):
    name = "cope"
    citation = "Golovneva et al. 2024, section 3"
    sides = ("decoder",)
    options = (
        MethodOption("cope", 0,
                     "CoPE's contextual positions in every layer of the {what} (Golovneva et al. 2024): the "
                     "position of key j seen from query i is p_ij = sum_{{t=j..i}} sigmoid(q_i . k_t), whose "
                     "interpolated learned embedding e[p_ij] adds q_i . e[p_ij] to the logit; the value is p_max, "
                     "the number of positions counted (larger counts are clipped); 0 = off"),
    )
    benchmark_target = "scaling"
    variants = {"cope": {"cope": 64}}
    labels = {"cope": "CoPE"}
    combined = {"cope": 16}

    def is_on(self, options: Any) -> bool:
        return options.cope > 0

    def validate(self, options: Any) -> None:
        if options.cope < 0 or options.cope == 1:
            raise PositionOptionError(
                f"{options.flag('cope')} must be 0 (off) or a number of positions of at least 2, got {options.cope}"
                + (" (one position clips every count to 0: the term adds the same value to a whole row and changes "
                   "nothing)" if options.cope == 1 else ""))

    def terms(self, options: Any, layer: LayerSpec) -> List[nn.Module]:
        return [ContextualPositionBias(layer.head_dim, options.cope)]


register(ContextualPositionMethod())
