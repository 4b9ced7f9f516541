"""Incremental decoding's steps: past the first length bucket of the per-sequence tables the steps equal the
full pass, and a step runs the lean forms: Shaw's relative embeddings as two products with a slice of the
sequence's table (no gather, no scatter), a causal convolution as k batched products over the cached rows
(nothing kept for a backward pass)."""

from typing import Dict, List

import pytest
import torch

from posattn.position_context import SMALLEST_TABLE
from model_helpers import build_lm, randomized, side_flags

LENGTH = SMALLEST_TABLE + 6  # past the first bucket: every table is built again, longer
LONG_BLOCKS = ["--tokens-per-sample", str(LENGTH), "--max-target-positions", str(LENGTH)]
VARIANTS = ["shaw", "conv-1d", "conv-2d", "t5-bias", "distance-aware", "direct-both-all-layers", "rotary",
            "temperature"]


def model_of(variant: str):
    torch.manual_seed(0)
    return randomized(build_lm("transformer_lm_posattn", [*side_flags("decoder", variant), *LONG_BLOCKS]))


def tokens(batch: int = 2) -> torch.Tensor:
    return torch.randint(4, 20, (batch, LENGTH), generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("variant", VARIANTS)
@torch.no_grad()
def test_steps_past_the_first_table_bucket_equal_the_full_pass(variant):
    model, sentence = model_of(variant), tokens()
    full = torch.log_softmax(model(sentence)[0], dim=-1)
    state: Dict = {}
    for step in range(LENGTH):
        out = model.decoder(sentence[:, : step + 1], incremental_state=state)[0]
        torch.testing.assert_close(torch.log_softmax(out[:, -1], dim=-1), full[:, step], rtol=1e-5, atol=1e-5)


def step_operators(variant: str) -> List[str]:
    """The operators of the 11th decoding step, in call order."""
    model, sentence = model_of(variant), tokens()
    state: Dict = {}
    with torch.no_grad():
        for step in range(10):
            model.decoder(sentence[:, : step + 1], incremental_state=state)
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profiler:
            model.decoder(sentence[:, :11], incremental_state=state)
    return [event.name for event in profiler.events()]


def test_a_shaw_step_reads_its_embeddings_from_the_sequence_table():
    operators = step_operators("shaw")
    assert "aten::gather" not in operators and "aten::scatter_add_" not in operators
    assert "aten::index" not in operators  # the table is built at the first step, then sliced


@pytest.mark.parametrize("variant,kernel", [("conv-1d", 3)])
def test_a_causal_1d_convolution_step_is_k_batched_products(variant, kernel):
    operators = step_operators(variant)
    layers = 2  # one product and k - 1 accumulations per layer (a full pass's form: k accumulations)
    assert operators.count("aten::baddbmm_") == layers * (kernel - 1)

