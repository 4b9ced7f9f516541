"""The later methods (KERPLE, Sandwich, FIRE, xPos, FoX, CoPE): a few of their numbers by hand, the regimes
their registered variants do not reach in the shared test families (FIRE past its threshold, xPos with a short
scale base, CoPE's counts clipped) against the loop-by-loop references, and their start-up refusals."""

import math
from typing import Dict

import pytest
import torch

from posattn.position_options import PositionOptionError, SidePositionOptions
from posattn.position_context import PositionContext
from posattn.position_terms.base import apply_densely
from posattn.position_terms.contextual import ContextualPositionBias
from posattn.position_terms.fire import FireBias
from posattn.position_terms.forget_gate import ForgetGateBias
from posattn.position_terms.kerple import KerpleBias, KerpleParameters
from posattn.position_terms.sandwich import SandwichBias
from posattn.position_terms.xpos import XPosEmbedding
from model_helpers import build_lm, build_model, randomized
from test_attention_terms import (assert_gradients_match_finite_differences, assert_matches_reference, batch,
                                  build_attention, causal_mask, context, side_cases)

#: FIRE past its threshold (L = |m| 2, m random: most queries of a 7-token sentence are past it), xPos with
#: a scale base of 4 (a decay of zeta^(d/4): strong within a sentence) and CoPE counting at most 2 positions
SHORT_REGIMES = {"fire-threshold-2": {"fire": True, "fire_threshold": 2, "fire_hidden": 5},
                 "xpos-base-4": {"xpos": True, "xpos_scale_base": 4}, "cope-3": {"cope": 3}}


def unpadded(length: int) -> PositionContext:
    return PositionContext.unpadded(length, torch.device("cpu"))


# ------------------------------------------------------------------------------------- numbers by hand
def kerple_term(kernel: str, r1: float, r2: float) -> KerpleBias:
    parameters = KerpleParameters(kernel, 1)
    with torch.no_grad():
        parameters.r1.fill_(r1)
        parameters.r2.fill_(r2)
    return KerpleBias(parameters)


def test_kerple_biases_by_hand():
    log = kerple_term("log", 1.0, 2.0)(unpadded(4), 4, 4)[0, 0]
    assert log[3, 0].item() == pytest.approx(-math.log(7)) and log[0, 3].item() == pytest.approx(-math.log(7))
    assert log[2, 2].item() == 0
    power = kerple_term("power", 0.5, 1.5)(unpadded(5), 5, 5)[0, 0]
    assert power[4, 0].item() == pytest.approx(-0.5 * 4 ** 1.5) and power[1, 1].item() == 0


def test_kerple_clamps_as_the_authors_code_and_passes_the_gradient():
    """r1 below 0.01 is used as 0.01, r2 of the power kernel above 2 as 2; the gradient reaches the stored values."""
    term = kerple_term("power", -3.0, 5.0)
    bias = term(unpadded(3), 3, 3)[0, 0]
    assert bias[2, 0].item() == pytest.approx(-0.01 * 2 ** 2.0)
    bias.sum().backward()
    assert term.side_parameters.r1.grad.abs().item() > 0 and term.side_parameters.r2.grad.abs().item() > 0


def test_sandwich_bias_by_hand():
    """d' = 4: frequencies 10000^(-2/4) = 0.01 and 10000^(-4/4) = 1e-4; H = 2: head 1 divided by 4, head 2 by 8."""
    bias = SandwichBias(2, 4)(unpadded(101), 101, 101)[0]
    expected = math.cos(100 * 0.01) + math.cos(100 * 1e-4) - 2
    assert bias[0, 100, 0].item() == pytest.approx(expected / 4, rel=1e-6)
    assert bias[1, 0, 100].item() == pytest.approx(expected / 8, rel=1e-6)
    assert bias[:, 7, 7].abs().max().item() == 0


def fire_identity(threshold: float) -> FireBias:
    """FIRE with f(x) = ReLU(x) in every head (one hidden unit of weight 1) and c = 1."""
    term = FireBias(2, 1, threshold)
    with torch.no_grad():
        term.mlp_in.weight.fill_(1.0)
        term.mlp_in.bias.zero_()
        term.mlp_out.weight.fill_(1.0)
        term.mlp_out.bias.zero_()
        term.c.fill_(1.0)
    return term


def test_fire_bias_by_hand():
    """c = 1, L = 2: query 5 normalises by log(1 + 5), query 1 by the threshold, log(1 + 2)."""
    bias = fire_identity(2.0)(unpadded(6), 6, 6)[0]
    assert bias[0, 5, 2].item() == pytest.approx(math.log(4) / (math.log(6) + 1e-6))
    assert bias[1, 1, 0].item() == pytest.approx(math.log(2) / (math.log(3) + 1e-6))
    assert bias[0, 4, 4].item() == 0
    # a key after the query: x = -psi(3) / psi(max(L, 1, 4)) < 0, and ReLU(x) = 0 (the signed form)
    assert bias[0, 1, 4].item() == 0


def test_fire_threshold_is_learned_as_a_multiple_and_gets_gradient():
    term = fire_identity(2.0)
    term(unpadded(6), 6, 6).sum().backward()
    assert term.threshold_scale.grad.abs().item() > 0 and term.c.grad.abs().item() > 0


def test_xpos_logits_depend_on_the_distance_and_decay():
    """Head size 2, q = k = (1, 0): q_n . k_m = cos(n - m) zeta_0^((n - m)/B), zeta_0 = 0.4 / 1.4."""
    term = XPosEmbedding(2, 8)
    ones = torch.zeros(1, 1, 12, 2, dtype=torch.float64)
    ones[..., 0] = 1
    q, k = term(ones, ones, unpadded(12))
    logits = (q @ k.transpose(-1, -2))[0, 0]
    zeta = 0.4 / 1.4
    for n, m in ((5, 2), (11, 8), (3, 3), (9, 0)):
        assert logits[n, m].item() == pytest.approx(math.cos(n - m) * zeta ** ((n - m) / 8), rel=1e-12)


# ------------------------------------------------------------------------ regimes the variants do not reach
@pytest.mark.parametrize("regime,causal,padding",
                         side_cases(SHORT_REGIMES, [(False, "left"), (False, "right"), (True, "right")]))
@torch.no_grad()
def test_short_regimes_match_the_references(regime, causal, padding):
    assert_matches_reference(build_attention(SHORT_REGIMES[regime], causal), causal, padding)


@pytest.mark.parametrize("causal,padding", [(False, "left"), (True, "right")])
def test_fire_past_its_threshold_score_mod_equals_explicit_logits_and_gradients(causal, padding):
    attn = build_attention(SHORT_REGIMES["fire-threshold-2"], causal)
    x, mask = batch(padding)
    x = x.requires_grad_()
    ctx = context(mask, x, causal)
    q, k, _ = attn._project(x)
    attn_mask = causal_mask(x.size(0)) if causal else None
    explicit = attn.explicit_logits(q, k, ctx, attn_mask, [])
    dense = apply_densely(attn.score_mod(ctx, q, k.size(2), []), torch.matmul(q, k.transpose(-1, -2)))
    seen = torch.isfinite(explicit)
    torch.testing.assert_close(dense[seen], explicit[seen], rtol=0, atol=0)
    inputs = [x, *attn.parameters()]
    grads = [[torch.zeros_like(p) if g is None else g
              for g, p in zip(torch.autograd.grad(logits[seen].sum(), inputs, retain_graph=True, allow_unused=True),
                              inputs)]
             for logits in (dense, explicit)]
    for got, expected in zip(*grads):
        torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("regime", sorted(SHORT_REGIMES))
@torch.no_grad()
def test_short_regimes_decode_step_by_step_as_the_full_pass(regime):
    """A language model of 24 positions, 20 steps: the sequence tables (FIRE's bias rows, xPos's scales) equal
    the full pass at every step."""
    torch.manual_seed(0)
    flags = [flag for name, value in SHORT_REGIMES[regime].items()
             for flag in ([f"--decoder-{name.replace('_', '-')}"] + ([] if value is True else [str(value)]))]
    model = randomized(build_lm("transformer_lm_posattn", flags))
    prev = torch.randint(4, 20, (2, 20), generator=torch.Generator().manual_seed(1))
    full = torch.log_softmax(model.decoder(prev)[0], dim=-1)
    state: Dict = {}
    for step in range(prev.size(1)):
        out = model.decoder(prev[:, : step + 1], incremental_state=state)[0]
        torch.testing.assert_close(torch.log_softmax(out[:, -1], dim=-1), full[:, step], rtol=1e-5, atol=1e-5)


def test_kerple_parameters_are_the_sides_once():
    model = build_model("transformer_posattn", ["--encoder-kerple", "log", "--decoder-kerple", "power"])
    keys = [key for key in model.state_dict() if "kerple" in key]
    assert sorted(keys) == ["decoder.position_shared.kerple.r1", "decoder.position_shared.kerple.r2",
                            "encoder.position_shared.kerple.r1", "encoder.position_shared.kerple.r2"]
    first, second = (layer.self_attn.additive_terms[0] for layer in model.encoder.layers)
    assert first.side_parameters is second.side_parameters is model.encoder.position_shared["kerple"]


# ------------------------------------------------------------------------------------------- refusals
@pytest.mark.parametrize("values,message", [
    ({"sandwich": 7}, "--encoder-sandwich is the even dimension d'"),
    ({"sandwich": -2}, "--encoder-sandwich is the even dimension d'"),
    ({"fire_hidden": 8}, "--encoder-fire-hidden 8 has no effect without --encoder-fire"),
    ({"fire": True, "fire_threshold": 0}, "--encoder-fire-threshold must be positive"),
    ({"fire": True, "fire_hidden": 0}, "--encoder-fire-hidden must be at least 1"),
    ({"xpos_scale_base": 64}, "--encoder-xpos-scale-base 64 has no effect without --encoder-xpos"),
    ({"xpos": True, "xpos_scale_base": 0}, "--encoder-xpos-scale-base must be positive"),
    ({"kerple": "square"}, "--encoder-kerple must be one of"),
])
def test_impossible_options_are_refused_naming_the_flag(values, message):
    options = SidePositionOptions("encoder", False, 16, "--max-source-positions", **values)
    with pytest.raises(PositionOptionError, match=message):
        options.validate()


def test_xpos_needs_an_even_head_size():
    options = SidePositionOptions("encoder", False, 16, "--max-source-positions", xpos=True)
    options.validate()
    with pytest.raises(PositionOptionError, match="--encoder-xpos turns pairs of dimensions"):
        options.build_terms(0, 2, 3)


@pytest.mark.parametrize("regime,causal,padding", side_cases(SHORT_REGIMES, [(False, "left"), (True, "right")]))
def test_gradients_match_finite_differences(regime, causal, padding):
    """FIRE's MLP, c and threshold, and the input through xPos, against finite differences (gradcheck's fast
    mode, as tests/test_attention_terms.py does for the other terms)."""
    assert_gradients_match_finite_differences(build_attention(SHORT_REGIMES[regime], causal), causal, padding)


@pytest.mark.parametrize("kernel", ["log", "power"])
def test_kerple_gradients_match_finite_differences(kernel):
    """r1 and r2 inside their clamps (where the straight-through clamp is the identity)."""
    term, ctx = kerple_term(kernel, 0.7, 1.3), unpadded(6)

    def bias(r1, r2):
        return _kerple_bias_with(term, r1, r2, ctx)

    r1 = torch.tensor([0.7, 1.6], dtype=torch.float64, requires_grad=True)
    r2 = torch.tensor([1.3, 0.4], dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(bias, (r1, r2), eps=1e-6, atol=1e-6)


def _kerple_bias_with(term: KerpleBias, r1: torch.Tensor, r2: torch.Tensor, ctx: PositionContext) -> torch.Tensor:
    parameters = KerpleParameters(term.kernel, r1.numel()).double()
    del parameters.r1, parameters.r2
    parameters.r1, parameters.r2 = r1, r2
    return KerpleBias(parameters)(ctx, ctx.length, ctx.length)


# ------------------------------------------------------------------------------------- FoX and CoPE
def test_forget_gates_at_their_initial_bias_forget_half_per_token():
    """With zero gate weights every gate is sigmoid(0) = 1/2: the bias of key j for query i is -(i - j) log 2,
    a pad's gate is 1 (no change), and a decoding step continues the sums of the cached tokens."""
    term = ForgetGateBias(embed_dim=4, num_heads=2).double()
    torch.nn.init.zeros_(term.gate.weight)
    x = torch.randn(6, 1, 4, dtype=torch.double)
    values = term.token_values(x, unpadded(6), None)
    bias = term.bias_of(values, 6)[0, 1]
    for i, j in ((5, 2), (3, 3), (4, 0)):
        assert bias[i, j].item() == pytest.approx(-(i - j) * math.log(2), rel=1e-12)
    padded = PositionContext.from_padding(torch.tensor([[True, True, False, False, False, False]]), right_padded=False)
    assert term.token_values(x, padded, None)[0, 0, :2].tolist() == [0.0, 0.0]
    step = term.token_values(x[5:], unpadded(6), values[..., :5])
    torch.testing.assert_close(step, values, rtol=0, atol=1e-12)


def test_contextual_positions_count_the_gates_from_the_key_to_the_query():
    """p_ij sums sigmoid of the row's logits from key j to the query; a masked key counts 0; a count past
    p_max - 1 reads the last embedding; a fractional count interpolates between its neighbours."""
    term = ContextualPositionBias(head_dim=1, count_limit=3).double()
    with torch.no_grad():
        term.embeddings.copy_(torch.tensor([[10.0, 20.0, 40.0]], dtype=torch.double))
    logits = torch.tensor([[[[0.0, 0.0, float("-inf")]]]], dtype=torch.double)  # 2 visible keys, gates 1/2
    q = torch.ones(1, 1, 1, 1, dtype=torch.double)  # the kernel's scaled query; unscaled, d_h = 1: the same
    bias = term(logits, q, unpadded(3))[0, 0, 0]
    assert bias[:2].tolist() == pytest.approx([20.0, 15.0])  # p = 1 and p = 1/2 (halfway between e[0] and e[1])
    far = term(torch.full((1, 1, 1, 8), 30.0, dtype=torch.double), q, unpadded(8))[0, 0, 0]
    assert far[0].item() == 40.0  # 8 gates of ~1: clipped at p_max - 1 = 2


def test_flex_kernel_is_refused_for_contextual_positions():
    options = SidePositionOptions("decoder", True, 16, "--max-target-positions", attention_kernel="flex", cope=8)
    options.validate()
    with pytest.raises(PositionOptionError, match="--decoder-attention-kernel flex: --decoder-cope 8 computes"):
        options.build_terms(0, 2, 4)


@pytest.mark.parametrize("flags", [["--encoder-forget-gate"], ["--encoder-cope", "8"]])
def test_the_causal_only_methods_have_no_encoder_option(flags, capsys):
    with pytest.raises(SystemExit):
        build_model("transformer_posattn", flags)
    assert f"unrecognized arguments: {' '.join(flags)}" in capsys.readouterr().err
