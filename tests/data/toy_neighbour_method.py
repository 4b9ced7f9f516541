"""A toy position method in one file, as a new method is written: tests/test_registry_is_closed.py
copies it into a copy of the package's ``position_terms/`` with one import line, and nothing else.

The term adds a learned bias ``b_h`` per head to the logits of the two neighbours of a query
(``|i - j| = 1``), and shows ``b_h`` over ``i - j`` in posattn-inspect. It states its mathematics once,
as a ``score_mod``: the dense bias of the kernel's explicit and SDPA paths is derived from it
(:class:`~posattn.position_terms.base.AdditiveLogitBias`, which evaluates it over
``num_heads`` heads).
"""

from typing import Any, List

import torch
from torch import Tensor, nn

from posattn.position_context import PositionContext
from posattn.position_terms.base import AdditiveLogitBias, ScoreMod
from posattn.position_terms.quantities import CURVE, Quantity
from posattn.position_terms.registry import LayerSpec, MethodOption, PositionMethod, register


class NeighbourBias(AdditiveLogitBias):
    """``logits[h, i, j] += b_h`` where ``|i - j| = 1``."""

    def __init__(self, num_heads: int):
        super().__init__()
        self.num_heads = num_heads
        self.b = nn.Parameter(torch.zeros(num_heads))

    def score_mod(self, ctx: PositionContext, q: Tensor, src_len: int) -> ScoreMod:
        b, offset = self.b, src_len - q.size(2)

        def neighbour(score: Tensor, batch: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
            near = (q_idx + offset - kv_idx).abs() == 1
            return score + torch.where(near, b[h], torch.zeros_like(b[h])).to(score.dtype)
        return neighbour

    def inspect(self, positions: int) -> List[Quantity]:
        distance = torch.arange(-(positions - 1), positions)
        bias = self.b.detach().cpu()[:, None] * (distance.abs() == 1).to(self.b.dtype)
        return [Quantity("bias", bias, CURVE, "toy neighbour bias", axes=("i - j", "bias"),
                         ticks=(distance.tolist(),))]


class ToyNeighbourMethod(PositionMethod):
    name = "toy-neighbour"
    citation = "none (a test's toy)"
    options = (MethodOption("toy_neighbour_bias", False, "a learned bias per head on the neighbours in the {what}"),)
    variants = {"toy-neighbour": {"toy_neighbour_bias": True}}
    labels = {"toy-neighbour": "Toy neighbour bias"}
    combined = {"toy_neighbour_bias": True}

    def is_on(self, options: Any) -> bool:
        return options.toy_neighbour_bias

    def terms(self, options: Any, layer: LayerSpec) -> List[nn.Module]:
        return [NeighbourBias(layer.num_heads)]


register(ToyNeighbourMethod())
