"""Each position term against the direct re-implementation in ``reference_attention.py``
(probabilities and outputs), on padded batches, for a bidirectional and a causal side."""

import math

import pytest
import torch

from core_helpers import E, H, T_MAX, VARIANTS, AllAtOnce, applies, batch, context, on_side, side_cases  # noqa: F401
from fairseq_posattn.modules.attention import PositionAwareMultiheadAttention
from posattn.attention import SDPA
from posattn.position_context import PositionContext
from posattn.position_options import SidePositionOptions
from posattn.position_terms.base import SequenceTooLongError, lookup
from posattn.position_terms.direct import circulant_bias
from posattn.position_terms.distance_aware import DistanceAwareScaling
from posattn.position_terms.relative_embeddings import RelativePositionEmbeddings
from reference_attention import randomize_, reference_attention, sentence_of


def build_attention(variant: dict, causal: bool, seed: int = 0) -> PositionAwareMultiheadAttention:
    options = SidePositionOptions(
        side="decoder" if causal else "encoder", causal=causal, max_positions=T_MAX,
        max_positions_option="--max-positions", **on_side(variant, causal),
    )
    options.validate()
    attn = PositionAwareMultiheadAttention(E, H, options.build_terms(0, H, E // H)).double()
    randomize_(attn, seed)
    for shared in options.shared.values():  # what the side would own (T5's table), random and double too
        randomize_(shared.double(), seed + 1)
    return attn.eval()


def unpadded(length: int) -> PositionContext:
    return PositionContext.from_padding(torch.zeros(1, length, dtype=torch.bool), right_padded=True)


def causal_mask(T: int) -> torch.Tensor:
    return torch.triu(torch.full((T, T), float("-inf"), dtype=torch.double), 1)


@pytest.mark.parametrize("variant,causal,padding",
                         side_cases(VARIANTS, [(False, "left"), (False, "right"), (True, "right")]))
@torch.no_grad()
def test_matches_reference(variant, causal, padding):
    assert_matches_reference(build_attention(VARIANTS[variant], causal), causal, padding)


@pytest.mark.parametrize("block_rows", [1, 2, 3])
@pytest.mark.parametrize("variant", ["conv-1d", "all-with-conv-1d"])
@torch.no_grad()
def test_causal_1d_convolution_in_blocks_matches_reference(variant, block_rows):
    """The causal 1d convolution computes blocks of query rows on the key columns they can see."""
    attn = build_attention(VARIANTS[variant], causal=True)
    attn.post_softmax_term.block_rows = block_rows
    assert_matches_reference(attn, causal=True, padding="right")


def assert_matches_reference(attn: PositionAwareMultiheadAttention, causal: bool, padding: str) -> None:
    x, mask = batch(padding)
    out, probs = attn(x, x, x, key_padding_mask=context(mask, x, causal), need_head_weights=True,
                      attn_mask=causal_mask(x.size(0)) if causal else None)
    for b in range(x.size(1)):
        real = ~mask[b] if mask is not None else torch.ones(x.size(0), dtype=torch.bool)
        ref_out, ref_probs = reference_attention(attn, sentence_of(x, b, mask), causal)
        torch.testing.assert_close(out[real, b], ref_out, rtol=1e-9, atol=1e-9)
        got_probs = probs[:, b][:, real][:, :, real]
        torch.testing.assert_close(got_probs, ref_probs, rtol=1e-9, atol=1e-9)
        # padded keys get no weight from real queries
        assert probs[:, b][:, real][:, :, ~real].abs().max().item() == 0 if (~real).any() else True


@pytest.mark.parametrize("variant", ["conv-1d", "conv-2d", "distance-aware", "shaw", "t5-bias", "rotary",
                                     "all-with-conv-1d"])
@pytest.mark.parametrize("causal,padding", [(False, "left"), (True, "right")])
def test_gradients_match_finite_differences(variant, causal, padding):
    """Backward passes (the 1d convolution's own, in blocks of 2 rows; in-place masking) against
    finite differences, for the input and every parameter. gradcheck's fast mode compares u^T J v for random
    u, v instead of every entry of J (a tenth of the time; an error of 1e-3 in one entry of the 1d
    convolution's weight gradient fails it)."""
    attn = build_attention(VARIANTS[variant], causal)
    if hasattr(attn.post_softmax_term, "block_rows"):
        attn.post_softmax_term.block_rows = 2
    assert_gradients_match_finite_differences(attn, causal, padding)


def assert_gradients_match_finite_differences(attn: PositionAwareMultiheadAttention, causal: bool, padding: str) -> None:
    """gradcheck (fast mode) of ``attn`` on a padded batch of 5 and 3 tokens: the input and every parameter."""
    x, mask = batch(padding, lengths=(5, 3))
    names, params = zip(*attn.named_parameters())
    options = dict(key_padding_mask=context(mask, x, causal), need_weights=False,
                   attn_mask=causal_mask(x.size(0)) if causal else None)

    def attend(x, *params):
        return torch.func.functional_call(attn, dict(zip(names, params)), (x, x, x), options)[0]

    inputs = (x.requires_grad_(), *(p.detach().requires_grad_() for p in params))
    assert torch.autograd.gradcheck(attend, inputs, eps=1e-6, atol=1e-5, fast_mode=True)


def runs_fused(variant: str) -> bool:
    causal = not applies(VARIANTS[variant], causal=False)
    return build_attention(VARIANTS[variant], causal).path(False, torch.device("cpu"), False)[0] == SDPA


@pytest.mark.parametrize("variant,causal,padding", side_cases(
    {name: VARIANTS[name] for name in filter(runs_fused, VARIANTS)}, [(False, "left"), (True, "right")]))
def test_fused_path_equals_explicit_path(variant, causal, padding):
    """Query/key transforms, additive biases and temperature run through
    scaled_dot_product_attention unless weights are needed: both paths give one result."""
    attn = build_attention(VARIANTS[variant], causal=causal)
    x, mask = batch(padding)
    causal_part = dict(attn_mask=causal_mask(x.size(0))) if causal else {}
    fused, _ = attn(x, x, x, key_padding_mask=context(mask, x, causal), need_weights=False, **causal_part)
    explicit, _ = attn(x, x, x, key_padding_mask=context(mask, x, causal), need_weights=True, **causal_part)
    real = ~mask
    torch.testing.assert_close(fused.transpose(0, 1)[real], explicit.transpose(0, 1)[real])


def test_distance_aware_coefficients_follow_the_paper_form():
    term = DistanceAwareScaling(3).double()
    with torch.no_grad():
        term.w.copy_(torch.tensor([0.0, 0.7, -1.3]))
        term.v.copy_(torch.tensor([0.0, 1.5, -0.4]))
    coef = term.coefficients(unpadded(6), 6, 6)
    for h in range(3):
        for i in range(6):
            for j in range(6):
                w, v = term.w[h].item(), term.v[h].item()
                expected = (1 + math.exp(v)) / (1 + math.exp(v - w * abs(i - j)))
                assert coef[h, i, j].item() == pytest.approx(expected, rel=1e-12)
    assert torch.allclose(coef[0], torch.ones(6, 6, dtype=torch.double))  # f(0; v) = 1 at w = 0


def test_distance_aware_is_stable_for_large_arguments():
    term = DistanceAwareScaling(1)
    with torch.no_grad():
        term.w.fill_(200.0)
        term.v.fill_(3.0)
    coef = term.coefficients(unpadded(50), 50, 50)
    assert torch.isfinite(coef).all()
    assert coef.max().item() == pytest.approx(1 + math.exp(3.0), rel=1e-5)  # bound 1 + exp(v)


def test_shaw_key_logits_gather_equals_explicit_sum():
    term = RelativePositionEmbeddings(head_dim=4, clip=2).double()
    q = torch.randn(2, 3, 5, 4, dtype=torch.double)
    got = term.key_logits(q, unpadded(5), 5, 5)
    for i in range(5):
        for j in range(5):
            a = term.key_table[max(-2, min(2, j - i)) + 2]
            torch.testing.assert_close(got[..., i, j], q[..., i, :] @ a)


@pytest.mark.parametrize("variant", ["direct-absolute", "direct-relative", "conv-1d"])
def test_sequence_longer_than_t_is_refused(variant):
    """The term refuses what it has no parameters for; the side's check names the option."""
    attn = build_attention(VARIANTS[variant], causal=False)
    x = torch.randn(T_MAX + 1, 1, E, dtype=torch.double)
    with pytest.raises(SequenceTooLongError, match=f"longer than the {T_MAX} positions"):
        attn(x, x, x, key_padding_mask=context(None, x))
    options = SidePositionOptions("encoder", False, T_MAX, "--max-positions", **VARIANTS[variant])
    with pytest.raises(SequenceTooLongError, match="larger --max-positions"):
        options.check_length(T_MAX + 1)
    options.check_length(T_MAX)


@pytest.mark.parametrize("causal", [False, True])
def test_no_nan_for_a_single_token(causal):
    attn = build_attention(VARIANTS["all-at-once"], causal)
    x = torch.randn(1, 2, E, dtype=torch.double)
    out, _ = attn(x, x, x, key_padding_mask=context(None, x))
    assert torch.isfinite(out).all()


def test_lookup_equals_advanced_indexing_with_repeated_indices(device):
    table = torch.randn(3, 5, 4, device=device, requires_grad=True)
    index = torch.randint(0, 5, (6, 7, 2), device=device)  # 84 reads of 5 rows
    got = lookup(table, 1, index)
    expected = table[:, index]
    torch.testing.assert_close(got, expected)
    upstream = torch.randn_like(expected)
    (got_grad,) = torch.autograd.grad(got, table, upstream)
    (expected_grad,) = torch.autograd.grad(expected, table, upstream)
    torch.testing.assert_close(got_grad, expected_grad)


@pytest.mark.parametrize("variant", ["direct-absolute", "direct-relative", "t5-bias"])
def test_additive_terms_backward_avoids_the_advanced_indexing_backward(variant):
    """Advanced indexing's backward (index_put_ with accumulate) serialises over repeated indices on
    CUDA (pytorch/pytorch#41162); a bias table is read at the same entries for every query, key and
    sentence, so the terms read it through ``lookup``. Left padding: the absolute term's per-sentence path."""
    attn = build_attention(VARIANTS[variant], causal=False).train()
    x, mask = batch("left")
    ctx = context(mask, x)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profiler:
        out, _ = attn(x, x, x, key_padding_mask=ctx, need_weights=False)
        out.sum().backward()
    operators = {event.key for event in profiler.key_averages()}
    assert "aten::index_select" in operators  # the lookup ran
    assert not operators & {"aten::index_put_", "aten::_index_put_impl_"}, sorted(operators)


def test_left_padded_1d_convolution_shifts_columns_by_an_index_built_once_per_batch():
    """The column shift of a left-padded batch is its geometry: the first layer builds it, every
    later layer of the same batch (the same context) only gathers."""
    attn = build_attention(VARIANTS["conv-1d"], causal=False)
    x, mask = batch("left")
    ctx = context(mask, x)
    first, _ = attn(x, x, x, key_padding_mask=ctx)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profiler:
        again, _ = attn(x, x, x, key_padding_mask=ctx)
    operators = {event.key for event in profiler.key_averages()}
    assert "aten::gather" in operators
    assert not operators & {"aten::arange", "aten::clamp", "aten::ge", "aten::lt"}, sorted(operators)
    torch.testing.assert_close(again, first)


def first_layer_terms(variant: dict, t: int = 60, heads: int = 4):
    options = SidePositionOptions(side="encoder", causal=False, max_positions=t,
                                  max_positions_option="--max-source-positions", **variant)
    options.validate()
    return options.build_terms(0, heads, 16)


def term_of(terms, kind: str):
    members = [m for group in vars(terms).values() for m in (group if isinstance(group, list) else [group])]
    found = [term for term in members if type(term).__name__ == kind]
    assert len(found) == 1, (kind, terms)
    return found[0]


def test_direct_absolute_starts_as_the_authors_glorot_normal():
    """Keras 2.2.4's glorot_normal, written out: fans (t, t) of each head's t x t matrix, a normal
    truncated at 2 sd whose sd is divided by 0.8796 (scipy's truncnorm sd) to keep 2 / (t + t)."""
    torch.manual_seed(0)
    weight = term_of(first_layer_terms({"direct_position": "absolute"}), "DirectAbsolutePositionBias").weight
    target_sd = math.sqrt(2.0 / (60 + 60))
    cut = 2 * target_sd / 0.87962566103423978
    assert weight.abs().max() <= cut
    assert weight.abs().max() > 0.9 * cut  # truncated at 2 sd, not clipped elsewhere
    assert weight.std().item() == pytest.approx(target_sd, rel=0.05)
    zero = first_layer_terms({"direct_position": "absolute", "direct_position_init": "zero"})
    assert not term_of(zero, "DirectAbsolutePositionBias").weight.any()


def test_circulant_bias_is_the_real_part_of_a_circulant_operator_with_that_spectrum():
    """TensorFlow's LinearOperatorCirculant(spectrum) is F^-1 diag(spectrum) F; its real part applied to
    the identity, top-left t x t block, is the bias the authors' code adds at (i, j)."""
    t, heads = 7, 2
    spectrum = torch.randn(heads, 2 * t, dtype=torch.float64)
    identity = torch.eye(2 * t, dtype=torch.complex128)
    operator = torch.fft.ifft(spectrum[:, :, None] * torch.fft.fft(identity, dim=0), dim=1).real
    bias = circulant_bias(spectrum, t)
    for i in range(t):
        for j in range(t):
            torch.testing.assert_close(operator[:, i, j], bias[:, i - j + t - 1])


def test_direct_relative_starts_at_the_authors_starting_bias():
    """R ~ glorot_normal of a 1-d shape of 2t entries (both fans sqrt(2t)) read as a spectrum: a
    bias symmetric in i - j with sd sd_R / sqrt(2N) off the diagonal, sd_R / sqrt(N) at i = j."""
    torch.manual_seed(0)
    t, heads = 60, 64
    terms = first_layer_terms({"direct_position": "relative"}, t=t, heads=heads)
    weight = term_of(terms, "DirectRelativePositionBias").weight.detach()
    torch.testing.assert_close(weight, weight.flip(-1))
    sd_r = math.sqrt(2.0 / (2 * math.sqrt(2 * t)))
    assert weight[:, t - 1].std().item() == pytest.approx(sd_r / math.sqrt(2 * t), rel=0.25)
    assert weight[:, t:].std().item() == pytest.approx(sd_r / math.sqrt(4 * t), rel=0.1)
    zero = first_layer_terms({"direct_position": "relative", "direct_position_init": "zero"})
    assert not term_of(zero, "DirectRelativePositionBias").weight.any()


@pytest.mark.parametrize("variant,fan", [
    ({"conv_attention": "2d"}, 9),            # Keras Conv2D(1, 3): kernel (3, 3, 1, 1), fans 9 and 9
    ({"conv_attention": "1d"}, 60 * 3),       # Keras Conv1D(t, 3): kernel (3, t, t), fans 3t and 3t
])
def test_convolutions_start_as_the_authors_keras_defaults(variant, fan):
    kind = "ConvolvedAttention2d" if variant["conv_attention"] == "2d" else "ConvolvedAttention1d"
    torch.manual_seed(0)
    conv = term_of(first_layer_terms(variant), kind).conv
    limit = math.sqrt(6.0 / (fan + fan))  # glorot_uniform
    assert not conv.bias.any()
    assert conv.weight.abs().max() <= limit
    assert conv.weight.abs().max() > 0.9 * limit
    pytorch = term_of(first_layer_terms(dict(variant, conv_attention_init="pytorch")), kind).conv
    bound = 1 / math.sqrt(fan)  # PyTorch's default: weight and bias uniform in +-1/sqrt(fan_in)
    assert pytorch.bias.abs().max() <= bound and pytorch.bias.abs().max() > 0.5 * bound
    assert pytorch.weight.abs().max() <= bound


@pytest.mark.parametrize("flag", [{"direct_position_init": "zero"}, {"conv_attention_init": "pytorch"}])
def test_an_initialisation_option_without_its_method_is_refused(flag):
    with pytest.raises(ValueError, match="has no effect without"):
        first_layer_terms(flag)
