"""The rotation-derived methods of issue 67 (p-RoPE, HoPE, PoPE): numbers by hand, the outside code named for each
(transformers' ``proportional`` RoPE for p-RoPE, x-transformers' ``PolarEmbedding`` for PoPE), negative controls
(transformers' ``partial_rotary_factor``, RoPE itself, the phase bias, a softplus of the scaled query) and their
start-up refusals. Their registered variants join the shared families (the loop references of
``tests/reference_attention.py``, kernel paths, decoding steps, invariants)."""

import math
from typing import Tuple

import pytest
import torch
import torch.nn.functional as F

import posattn
from posattn.kernel_self_check import compare_paths, query_key_size
from posattn.position_context import PositionContext
from posattn.position_options import PositionOptionError, SidePositionOptions
from posattn.position_terms.hope import HighFrequencyRotaryEmbedding, high_frequency_pairs
from posattn.position_terms.p_rope import PRotaryEmbedding, TruncatedRotaryEmbedding, kept_pairs, truncated_frequencies
from posattn.position_terms.polar import PolarEmbedding
from posattn.position_terms.rotary import RotaryEmbedding

DOUBLE = torch.float64


def unpadded(length: int) -> PositionContext:
    return PositionContext.unpadded(length, torch.device("cpu"))


def logits_of(term: torch.nn.Module, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """``q k^T`` of the transformed current tokens of one unpadded sequence."""
    q, k = term(q, k, unpadded(q.size(2)))
    return q @ k.transpose(-1, -2)


def random_qk(heads: int, length: int, head_dim: int, seed: int = 0) -> Tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(1, heads, length, head_dim, generator=generator, dtype=DOUBLE) for _ in range(2))


# ------------------------------------------------------------------------------------------------------- p-RoPE
@pytest.mark.parametrize("fraction,head_dim,kept", [(0.75, 8, 3), (0.75, 4, 1), (0.25, 64, 8), (1.0, 6, 3),
                                                    (0.5, 6, 1), (0.75, 2, 0)])
def test_p_rope_keeps_floor_p_d_over_2_pairs(fraction, head_dim, kept):
    assert kept_pairs(fraction, head_dim) == kept
    frequencies = truncated_frequencies(head_dim, kept, DOUBLE)
    assert frequencies[:kept].tolist() == pytest.approx([10000.0 ** (-2 * k / head_dim) for k in range(kept)])
    assert frequencies[kept:].abs().sum().item() == 0


def test_p_rope_logit_by_hand():
    """d_h = 4, p = 0.5: the first pair turns by theta_0 = 1, the second not: q = k = (1, 0, 1, 0) gives
    q_i . k_j = cos(i - j) + 1."""
    ones = torch.tensor([1.0, 0.0, 1.0, 0.0], dtype=DOUBLE).expand(1, 1, 9, 4)
    logits = logits_of(PRotaryEmbedding(4, 0.5), ones, ones)[0, 0]
    for i, j in ((5, 2), (8, 0), (3, 3), (1, 7)):
        assert logits[i, j].item() == pytest.approx(math.cos(i - j) + 1, abs=1e-14)


@pytest.mark.parametrize("fraction", [0.25, 0.75])
def test_p_rope_frequencies_are_transformers_proportional_rope(fraction):
    """transformers' ``rope_type="proportional"`` (Gemma 4's, the authors' ``rope_proportion``) gives the same
    frequencies; its ``partial_rotary_factor`` with the default rope type re-derives them over fewer dimensions (the
    negative control: not p-RoPE)."""
    transformers = pytest.importorskip("transformers")
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
    from transformers.models.gpt_neox.modeling_gpt_neox import GPTNeoXRotaryEmbedding
    head_dim = 64

    def config(rope_type: str) -> object:
        return transformers.GPTNeoXConfig(hidden_size=2 * head_dim, num_attention_heads=2, rope_parameters={
            "rope_type": rope_type, "rope_theta": 10000.0, "partial_rotary_factor": fraction})

    ours = truncated_frequencies(head_dim, kept_pairs(fraction, head_dim), DOUBLE)
    proportional = ROPE_INIT_FUNCTIONS["proportional"](config("proportional"), torch.device("cpu"))[0]
    torch.testing.assert_close(ours, proportional.double(), rtol=1e-6, atol=0)
    partial = GPTNeoXRotaryEmbedding.compute_default_rope_parameters(config("default"))[0].double()
    assert partial.numel() == int(head_dim * fraction) // 2  # frequencies of the first factor * d_h dimensions only
    assert partial[-1].item() < ours[kept_pairs(fraction, head_dim) - 1].item() / 5  # its slowest pair is far slower


def partial_rotary_logits(q: torch.Tensor, k: torch.Tensor, factor: float) -> torch.Tensor:
    """transformers' ``partial_rotary_factor`` (GPT-NeoX's rotary_pct), in float64 and our pairing: the first
    ``int(factor d_h)`` dimensions turned with frequencies ``10000^(-2k / int(factor d_h))``, the rest unturned."""
    rotary_dim = int(q.size(-1) * factor)
    frequencies = 10000.0 ** (-torch.arange(0, rotary_dim, 2, dtype=DOUBLE) / rotary_dim)
    angles = torch.arange(q.size(2), dtype=DOUBLE)[:, None] * frequencies
    cos, sin = angles.cos().repeat_interleave(2, -1), angles.sin().repeat_interleave(2, -1)

    def turn(x: torch.Tensor) -> torch.Tensor:
        head, rest = x[..., :rotary_dim], x[..., rotary_dim:]
        pairs = head.unflatten(-1, (-1, 2))
        swapped = torch.stack([-pairs[..., 1], pairs[..., 0]], -1).flatten(-2)
        return torch.cat([head * cos + swapped * sin, rest], -1)

    return turn(q) @ turn(k).transpose(-1, -2)


def test_p_rope_is_neither_partial_rotary_nor_rope():
    """Negative controls, 64 tokens of a head of 16: p-RoPE (p = 0.75) against transformers' partial rotary of the
    same fraction and against RoPE; p = 1 is RoPE to the last bit."""
    q, k = random_qk(2, 64, 16)
    ours = logits_of(PRotaryEmbedding(16, 0.75), q, k)
    partial_gap = (ours - partial_rotary_logits(q, k, 0.75)).abs().max().item()
    rope_gap = (ours - logits_of(RotaryEmbedding(16), q, k)).abs().max().item()
    assert partial_gap > 1 and rope_gap > 0.1, (partial_gap, rope_gap)  # measured: 18.5 and 0.34
    torch.testing.assert_close(logits_of(PRotaryEmbedding(16, 1.0), q, k), logits_of(RotaryEmbedding(16), q, k),
                               rtol=0, atol=0)


# -------------------------------------------------------------------------------------------------------- HoPE
@pytest.mark.parametrize("head_dim,length,kept", [(8, 512, 2), (8, 63, 2), (8, 62, 1), (8, 7, 1), (4, 512, 1),
                                                  (64, 2048, 21), (2, 512, 1)])
def test_hope_keeps_the_pairs_that_complete_a_period_within_l(head_dim, length, kept):
    """Periods 2 pi / 10000^(-2k/d): d = 8 gives 6.28, 62.83, 628.3, 6283 tokens."""
    assert high_frequency_pairs(head_dim, length) == kept
    assert HighFrequencyRotaryEmbedding(head_dim, length).kept == kept


def test_hope_logit_by_hand_and_controls():
    """d_h = 4, L = 512: the pair of period 2 pi turns, the one of period 628 does not: q = k = (1, 0, 1, 0) gives
    cos(i - j) + 1. HoPE is the truncated rotation of its count (p-RoPE's), is RoPE when every period fits L, and
    is not RoPE otherwise (negative control)."""
    ones = torch.tensor([1.0, 0.0, 1.0, 0.0], dtype=DOUBLE).expand(1, 1, 9, 4)
    logits = logits_of(HighFrequencyRotaryEmbedding(4, 512), ones, ones)[0, 0]
    assert logits[7, 1].item() == pytest.approx(math.cos(6) + 1, abs=1e-14)
    q, k = random_qk(2, 40, 16, seed=1)
    hope = logits_of(HighFrequencyRotaryEmbedding(16, 512), q, k)
    torch.testing.assert_close(hope, logits_of(TruncatedRotaryEmbedding(16, high_frequency_pairs(16, 512)), q, k),
                               rtol=0, atol=0)
    rope = logits_of(RotaryEmbedding(16), q, k)
    assert (hope - rope).abs().max().item() > 0.5
    torch.testing.assert_close(logits_of(HighFrequencyRotaryEmbedding(16, 10 ** 6), q, k), rope, rtol=0, atol=0)


# -------------------------------------------------------------------------------------------------------- PoPE
def x_transformers_polar_logits(q: torch.Tensor, k: torch.Tensor, learned_bias: torch.Tensor) -> torch.Tensor:
    """x-transformers' PoPE logits, transcribed in float64 from lucidrains/x-transformers at commit
    9252ed7838021ee61e6c5be0930b3a9a88efdf06, x_transformers/x_transformers.py: ``PolarEmbedding.forward`` (freqs
    ``t inv_freq``, ``inv_freq = 1 / 10000^(arange(dim) / dim)``; bias ``learned_bias.clamp(-2 pi, 0)``),
    ``apply_polar_pos_emb`` (``cat(softplus(t) cos(freqs), softplus(t) sin(freqs))``, the keys with ``freqs +
    bias``, in ``Attention.forward``) and the scale ``dim_head ** -0.5`` that ``Attend`` applies (x_transformers/
    attend.py: q times ``scale / q.shape[-1] ** -0.5``, then SDPA's default ``q.shape[-1] ** -0.5``). ``q``, ``k``:
    ``(batch, heads, n, dim)``, unscaled; ``learned_bias``: ``(heads, 1, dim)``."""
    dim, n = q.size(-1), q.size(-2)
    inv_freq = 1.0 / (10000 ** (torch.arange(0, dim, dtype=DOUBLE) / dim))
    freqs = torch.einsum("b i , j -> b i j", torch.arange(n, dtype=DOUBLE)[None], inv_freq)
    bias = learned_bias.clamp(-2.0 * math.pi, 0.0)

    def apply_polar_pos_emb(t: torch.Tensor, freqs: torch.Tensor) -> torch.Tensor:
        t = F.softplus(t)
        return torch.cat((t * freqs.cos(), t * freqs.sin()), dim=-1)

    q, k = apply_polar_pos_emb(q, freqs), apply_polar_pos_emb(k, freqs + bias)
    scale = dim ** -0.5
    q = q * (scale / q.shape[-1] ** -0.5)
    return (q @ k.transpose(-1, -2)) * q.shape[-1] ** -0.5


def polar_term(heads: int, head_dim: int, seed: int = 2) -> PolarEmbedding:
    """A PoPE term with phase biases inside and outside ``[-2 pi, 0]`` (the clamp is part of the method)."""
    term = PolarEmbedding(heads, head_dim).double()
    with torch.no_grad():
        term.phase_bias.copy_(torch.empty(heads, head_dim, dtype=DOUBLE).uniform_(
            -8.0, 1.0, generator=torch.Generator().manual_seed(seed)))
    return term


def test_pope_equals_x_transformers_polar_embedding():
    """Our logits (the kernel's scaled queries in, ``q k^T`` of the transformed ones) against x-transformers'
    computation from the unscaled queries, in float64, 3 heads of 16, 50 tokens."""
    q, k = random_qk(3, 50, 16, seed=3)
    term = polar_term(3, 16)
    ours = logits_of(term, q * 16 ** -0.5, k)
    theirs = x_transformers_polar_logits(q, k, term.phase_bias.detach()[:, None, :])
    assert ours.shape == theirs.shape == (1, 3, 50, 50)
    torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-13)
    # negative controls: softplus of the scaled query, and the phase bias left out, are other functions
    wrong_scale = polar_term(3, 16)
    wrong_scale.head_dim = 1  # softplus(q) of the scaled query: the magnitudes of another query
    assert (logits_of(wrong_scale, q * 16 ** -0.5, k) - theirs).abs().max().item() > 0.1
    without_bias = x_transformers_polar_logits(q, k, torch.zeros(3, 1, 16, dtype=DOUBLE))
    assert (without_bias - theirs).abs().max().item() > 0.1


def test_pope_logit_by_hand():
    """d_h = 2, q = k = 0 (magnitudes softplus(0) = ln 2), phase bias 0 and -pi/2 on the second frequency
    (theta = 1, 0.01): a_ij = (ln 2)^2 (cos(j - i) + cos(0.01 (j - i) + delta)) / sqrt(2)."""
    term = PolarEmbedding(1, 2).double()
    zeros = torch.zeros(1, 1, 12, 2, dtype=DOUBLE)
    for delta in (0.0, -math.pi / 2):
        with torch.no_grad():
            term.phase_bias.copy_(torch.tensor([[0.0, delta]], dtype=DOUBLE))
        logits = logits_of(term, zeros, zeros)[0, 0]  # q = 0 is its own unscaled query
        for i, j in ((4, 1), (11, 0), (6, 6)):
            expected = math.log(2) ** 2 * (math.cos(j - i) + math.cos(0.01 * (j - i) + delta)) / 2 ** 0.5
            assert logits[i, j].item() == pytest.approx(expected, abs=1e-14)


def test_pope_phase_bias_learns_within_its_range():
    """The phase bias gets a gradient inside [-2 pi, 0] and none where the clamp holds it."""
    term = polar_term(2, 4)
    with torch.no_grad():
        term.phase_bias.copy_(torch.tensor([[-1.0, -3.0, 0.5, -7.0], [-0.2, -6.0, -2.0, 2.0]], dtype=DOUBLE))
    q, k = random_qk(2, 10, 4, seed=4)
    logits_of(term, q, k).sum().backward()
    inside = (term.phase_bias > -2 * math.pi) & (term.phase_bias < 0)
    assert bool((term.phase_bias.grad[inside] != 0).all()) and bool((term.phase_bias.grad[~inside] == 0).all())


def test_pope_self_attention_output_is_x_transformers_attention():
    """Through the public interface: a causal ``posattn.SelfAttention(polar=True)`` of 2 heads of 8 against
    x-transformers' PoPE attention written from its logits (softmax, values, output projection), 2 left-padded
    sequences; the keys and queries are twice the head size, the values and the output keep it."""
    torch.manual_seed(5)
    layer = posattn.SelfAttention(16, 2, causal=True, polar=True).double()
    with torch.no_grad():
        layer.query_key_terms[0].phase_bias.uniform_(-2 * math.pi, 0)
    x = torch.randn(2, 7, 16, dtype=DOUBLE)
    padding = torch.tensor([[False] * 7, [True, True] + [False] * 5])
    out = layer(x, padding_mask=padding)
    bias = layer.query_key_terms[0].phase_bias.detach()[:, None, :]
    for b, start in ((0, 0), (1, 2)):
        tokens = x[b, start:]

        def heads(projection: torch.nn.Linear) -> torch.Tensor:
            return projection(tokens).view(-1, 2, 8).transpose(0, 1)[None]

        logits = x_transformers_polar_logits(heads(layer.q_proj), heads(layer.k_proj), bias)
        logits = logits.masked_fill(torch.ones(7 - start, 7 - start, dtype=torch.bool).triu(1), float("-inf"))
        attended = torch.softmax(logits, -1) @ heads(layer.v_proj)
        expected = layer.out_proj(attended[0].transpose(0, 1).reshape(-1, 16))
        torch.testing.assert_close(out[b, start:], expected, rtol=0, atol=1e-12)


def test_the_self_check_compares_the_kernels_at_pope_sizes():
    """The fused paths' self-check draws queries and keys of the size the layer's transforms leave (PoPE: twice the
    head size; RoPE: the head size), so SDPA is checked on the sizes it runs with, and agrees."""
    layer = posattn.SelfAttention(16, 2, causal=True, polar=True).double()
    rope = posattn.SelfAttention(16, 2, causal=True, rotary=True).double()
    assert query_key_size(layer, torch.device("cpu"), DOUBLE) == 16 and query_key_size(rope, torch.device(
        "cpu"), DOUBLE) == 8
    ctx = PositionContext.example((9, 6), False, True, torch.device("cpu"))
    comparison = compare_paths(layer, "sdpa", ctx, DOUBLE, gradients=True)
    assert comparison.agrees and comparison.errors["output"] < 1e-12, comparison


# ---------------------------------------------------------------------------------------------------- refusals
def side(**values) -> SidePositionOptions:
    return SidePositionOptions("encoder", False, 16, "--max-source-positions", **values)


@pytest.mark.parametrize("values,message", [
    ({"p_rope": 1.5}, r"--encoder-p-rope is the fraction p in \(0, 1\]"),
    ({"p_rope": -0.25}, r"--encoder-p-rope is the fraction p in \(0, 1\]"),
    ({"hope": 6}, "--encoder-hope is the training length L .* at least 7"),
    ({"hope": -512}, "--encoder-hope is the training length L"),
    ({"polar": True, "rotary": True}, "--encoder-polar replaces the queries and keys .* --encoder-rotary True"),
    ({"polar": True, "p_rope": 0.75}, "--encoder-polar .* --encoder-p-rope 0.75"),
    ({"polar": True, "relative_positions": 4}, "--encoder-polar .* --encoder-relative-positions 4"),
])
def test_impossible_options_are_refused_naming_the_flag(values, message):
    with pytest.raises(PositionOptionError, match=message):
        side(**values).validate()


@pytest.mark.parametrize("values,head_dim,message", [
    ({"p_rope": 0.75}, 3, "--encoder-p-rope turns pairs of dimensions: the head size 3"),
    ({"hope": 512}, 5, "--encoder-hope turns pairs of dimensions: the head size 5"),
])
def test_head_sizes_the_rotations_cannot_take_are_refused(values, head_dim, message):
    options = side(**values)
    options.validate()
    with pytest.raises(PositionOptionError, match=message):
        options.build_terms(0, 2, head_dim)
