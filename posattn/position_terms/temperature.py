"""Learnable temperature (Dufter et al. 2020, section 2.4; docs/methods.md, Learnable temperature).

A scaling of the projections (:class:`~posattn.position_terms.base.ProjectionScaling`):
per head three scalars gamma_q, gamma_k, gamma_v, initialised to 1, multiply that head's slice (rows)
of W_q, W_k, W_v. Biases are not scaled (the paper scales the matrices). Applied in every layer of the
side.
"""

from typing import Any, List, Tuple

import torch
from torch import Tensor, nn

from posattn.position_terms.base import ProjectionScaling
from posattn.position_terms.quantities import BARS, Quantity
from posattn.position_terms.registry import LayerSpec, MethodOption, PositionMethod, register


class LearnableTemperature(ProjectionScaling):
    def __init__(self, num_heads: int, head_dim: int):
        super().__init__()
        self.head_dim = head_dim
        self.gamma = nn.Parameter(torch.ones(3, num_heads))  # rows: q, k, v

    def scale_weights(self, q_weight: Tensor, k_weight: Tensor, v_weight: Tensor) -> Tuple[Tensor, Tensor, Tensor]:
        """Return W_q, W_k, W_v with each head's output rows multiplied by its gamma."""
        row_scale = self.gamma.repeat_interleave(self.head_dim, dim=1).unsqueeze(-1)  # 3 x E x 1
        return q_weight * row_scale[0], k_weight * row_scale[1], v_weight * row_scale[2]

    def inspect(self, positions: int) -> List[Quantity]:
        """gamma_q, gamma_k and gamma_v per head (no position axis: ``positions`` is unused)."""
        gamma = self.gamma.detach().cpu()
        return [Quantity(f"gamma_{name}", row, BARS, f"learned temperature gamma_{name}")
                for name, row in zip("qkv", gamma)]


class LearnableTemperatureMethod(PositionMethod):
    name = "learnable-temperature"
    citation = "Dufter et al. 2020, section 2.4"
    options = (
        MethodOption("learnable_temperature", False,
                     "learnable per-head temperatures gamma_q, gamma_k, gamma_v (starting at 1) that scale the "
                     "head's rows of W_q, W_k, W_v, in every layer of the {what} (Dufter et al. 2020, 2.4; +Temp)"),
    )
    benchmark_target = "temperature"
    variants = {"temperature": {"learnable_temperature": True}}
    labels = {"temperature": "+Temp"}
    combined = {"learnable_temperature": True}

    def is_on(self, options: Any) -> bool:
        return options.learnable_temperature

    def terms(self, options: Any, layer: LayerSpec) -> List[nn.Module]:
        return [LearnableTemperature(layer.num_heads, layer.head_dim)]


register(LearnableTemperatureMethod())
