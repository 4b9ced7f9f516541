"""A toy position method that reads per-sentence side data, in one file, as a new method of that sort is
written: tests/test_registry_is_closed.py copies it into a copy of the package's ``position_terms/`` with one
import line, and nothing else.

Every batch carries a segment id per source token (``net_input["src_segments"]``, ``(batch, 1, src_len)``,
padded as the tokens are, collated by a task that names ``src_segments`` in its ``collated_side_data``); the
term adds a learned bias ``b_h`` per head to the logits of the (query, key) pairs in one segment, stated once,
as its ``score_mod`` (the dense form is derived from it). The segments it makes up for an example batch are
runs of :data:`SEGMENT` tokens.
"""

from typing import Any, Dict, List

import torch
from torch import Tensor, nn

from posattn.position_context import PositionContext
from posattn.position_terms.base import AdditiveLogitBias, ScoreMod
from posattn.position_terms.quantities import CURVE, Quantity
from posattn.position_terms.registry import LayerSpec, MethodOption, PositionMethod, register
from posattn.position_terms.side_inputs import BatchSideData

#: the length of the segments of an example batch
SEGMENT = 3


def example_segments(padding_mask: Tensor) -> Dict[str, Tensor]:
    """Runs of :data:`SEGMENT` tokens, counted from each sentence's first token; -1 at pads."""
    positions = (~padding_mask).long().cumsum(dim=1) - 1
    return {"segment": torch.where(padding_mask, torch.full_like(positions, -1), positions // SEGMENT)}


SEGMENTS = BatchSideData("src_segments", ("segment",), "each source token's segment",
                         "a task that collates src_segments", example_segments)


class SameSegmentBias(AdditiveLogitBias):
    """``logits[b, h, i, j] += b_h`` where tokens i and j of sentence b lie in one segment."""

    positions_only = False  # the bias comes from the batch's segments

    def __init__(self, num_heads: int):
        super().__init__()
        self.num_heads = num_heads
        self.b = nn.Parameter(torch.zeros(num_heads))

    def score_mod(self, ctx: PositionContext, q: Tensor, src_len: int) -> ScoreMod:
        segment, b, offset = ctx.side_data["segment"], self.b, src_len - q.size(2)

        def same_segment(score: Tensor, batch: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
            same = segment[batch, q_idx + offset] == segment[batch, kv_idx]
            return score + torch.where(same, b[h], torch.zeros_like(b[h])).to(score.dtype)
        return same_segment

    def example_side_data(self, padding_mask: Tensor) -> Dict[str, Tensor]:
        return SEGMENTS.example(padding_mask)

    def inspect(self, positions: int) -> List[Quantity]:
        return [Quantity("bias", self.b.detach().cpu()[:, None].repeat(1, 2) * torch.tensor([0.0, 1.0]), CURVE,
                         "toy same-segment bias", axes=("same segment", "bias"), ticks=([0, 1],))]


class ToySegmentMethod(PositionMethod):
    name = "toy-segment"
    citation = "none (a test's toy)"
    sides = ("encoder",)
    options = (MethodOption("toy_segment_bias", False, "a learned bias per head on the pairs of one segment in the "
                            "{what} (needs each token's segment from the task)"),)
    variants = {"toy-segment": {"toy_segment_bias": True}}
    labels = {"toy-segment": "Toy segment bias"}
    side_data = SEGMENTS

    def is_on(self, options: Any) -> bool:
        return options.toy_segment_bias

    def terms(self, options: Any, layer: LayerSpec) -> List[nn.Module]:
        return [SameSegmentBias(layer.num_heads)]


register(ToySegmentMethod())
