"""``torch.compile`` of position-aware encoder and decoder layers, every term on: no graph break in
forward (``torch._dynamo.explain``), outputs and gradients equal to eager, and one compiled graph
for batches of varying lengths with ``dynamic=True``.

On CPU, compilation uses the ``aot_eager`` backend (dynamo's graph capture and AOT autograd, the
parts that break on Python-side state or host syncs, without a C++ build of every graph on 2 cores);
on CUDA (``pytest --device cuda``, as ``scripts/gpu_check.py`` runs it) the graphs go to inductor.
"""

from typing import Callable, List, Tuple

import pytest
import torch
import torch._dynamo
from torch import Tensor, nn
from torch._dynamo.utils import counters

from posattn.position_context import PositionContext
from model_helpers import build_model, randomized, side_flags

#: every term: "combined" has direct (both), temperature, conv 2d, DA and Shaw; conv 1d on its own
EVERY_TERM = ["combined", "conv-1d"]
LENGTHS = (7, 11, 16)


def layer_of(side: str, variant: str, device: torch.device) -> nn.Module:
    torch.manual_seed(0)
    flags = side_flags(side, variant) + ["--dropout", "0", "--attention-dropout", "0"]
    model = randomized(build_model("transformer_posattn", flags)).to(device)
    return (model.encoder if side == "encoder" else model.decoder).layers[0]


def inputs(side: str, length: int, device: torch.device) -> Tuple[Tensor, PositionContext, Tensor]:
    """A batch of two: one full row and one padded by 3 (left on the encoder, right on the decoder)."""
    generator = torch.Generator().manual_seed(length)
    padding = torch.zeros(2, length, dtype=torch.bool)
    if side == "encoder":
        padding[1, :3] = True
    else:
        padding[1, -3:] = True
    ctx = PositionContext.from_padding(padding.to(device), right_padded=side == "decoder", causal=side == "decoder")
    x = torch.randn(length, 2, 16, generator=generator).to(device).requires_grad_()
    causal = torch.triu(torch.full((length, length), float("-inf")), 1).to(device)
    return x, ctx, causal


def layer_call(layer: nn.Module, side: str) -> Callable[[Tensor, PositionContext, Tensor], Tensor]:
    if side == "encoder":
        return lambda x, ctx, causal: layer(x, position_context=ctx)
    return lambda x, ctx, causal: layer(x, position_context=ctx, self_attn_mask=causal)[0]


def gradients(out: Tensor, x: Tensor, layer: nn.Module) -> List[Tensor]:
    """Gradients of a fixed function of ``out`` for ``x`` and every parameter ``out`` depends on
    (a decoder layer called without a source leaves its cross-attention out)."""
    used = [x, *(p for p in layer.parameters())]
    grads = torch.autograd.grad(out.square().sum(), used, allow_unused=True)
    return [g for g in grads if g is not None]


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    counters.clear()
    yield
    torch._dynamo.reset()


@pytest.mark.parametrize("side", ["encoder", "decoder"])
@pytest.mark.parametrize("variant", EVERY_TERM)
def test_no_graph_break_in_forward(side, variant, device):
    layer = layer_of(side, variant, device).train()
    explanation = torch._dynamo.explain(layer_call(layer, side))(*inputs(side, 9, device))
    reasons = [b.reason for b in explanation.break_reasons]
    assert explanation.graph_break_count == 0, reasons
    assert explanation.graph_count == 1


@pytest.mark.parametrize("side", ["encoder", "decoder"])
@pytest.mark.parametrize("variant", EVERY_TERM)
def test_compiled_equals_eager_with_one_graph_for_all_lengths(side, variant, device):
    layer = layer_of(side, variant, device).train()
    eager = layer_call(layer, side)
    backend = "inductor" if device.type == "cuda" else "aot_eager"
    compiled = torch.compile(eager, backend=backend, dynamic=True, fullgraph=True)
    for length in LENGTHS:
        x, ctx, causal = inputs(side, length, device)
        expected = eager(x, ctx, causal)
        got = compiled(x, ctx, causal)
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
        for grad, expected_grad in zip(gradients(got, x, layer), gradients(expected, x, layer)):
            torch.testing.assert_close(grad, expected_grad, rtol=1e-4, atol=1e-5)
    graphs = counters["stats"]["unique_graphs"]
    assert graphs == 1, f"{graphs} graphs compiled for lengths {LENGTHS}"
