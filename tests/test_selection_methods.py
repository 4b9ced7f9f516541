"""Scalable softmax (SSMax), CABLE and selective attention: each against the outside computation it comes from
(written out here in float64) and against a loop of its paper's equation, with negative controls; their regimes
(padding, decoding with beam reordering) and refusals. The shared families cover their registered variants
against tests/reference_attention.py.

Outside code transcribed (read, not copied; re-expressed in float64 on our tensors):

- CABLE: axiomlab/Cable at commit 8bc6b83e872899c50827e6940344350c37fadaa8, ``src/Cable.py``,
  ``CausalSelfAttention.forward``;
- selective attention: lucidrains/x-transformers at commit 9252ed7838021ee61e6c5be0930b3a9a88efdf06,
  ``x_transformers/attend.py``, ``selective_attn`` (and ``Attend.forward``'s masking before it).
"""

import math

import pytest
import torch
import torch.nn.functional as F

import posattn
from posattn.position_options import PositionOptionError
from model_helpers import build_model

B, H, L, D = 2, 3, 7, 4
TOLERANCE = {"rtol": 1e-10, "atol": 1e-10}


def qkv(length: int = L, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    return [torch.randn(B, H, length, D, generator=generator, dtype=torch.float64) for _ in range(3)]


def method(causal: bool, **options):
    torch.manual_seed(0)
    return posattn.position_method(H, D, causal=causal, **options).double()


def masked_softmax_output(logits: torch.Tensor, v: torch.Tensor, visible: torch.Tensor) -> torch.Tensor:
    """softmax over the visible keys of ``logits`` (b, h, i, j), times v."""
    return torch.softmax(logits.masked_fill(~visible, float("-inf")), dim=-1) @ v


def causal_visible(length: int) -> torch.Tensor:
    return torch.ones(length, length, dtype=torch.bool).tril()


def max_gap(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a - b).abs().max().item()


# ------------------------------------------------------------------------------------------------------- SSMax
def ssmax_logits(q, k, scale, keys_seen) -> torch.Tensor:
    """The paper's z_ij = s_h log(n_i) q_i . k_j / sqrt(d_h), entry by entry (n_i per batch and query)."""
    out = torch.zeros(q.size(0), H, q.size(2), k.size(2), dtype=torch.float64)
    for b in range(q.size(0)):
        for h in range(H):
            for i in range(q.size(2)):
                factor = float(scale[h].detach()) * math.log(keys_seen[b][i])
                for j in range(k.size(2)):
                    out[b, h, i, j] = factor * float(q[b, h, i] @ k[b, h, j]) / math.sqrt(D)
    return out


@pytest.mark.parametrize("causal", [True, False])
def test_ssmax_is_the_papers_equation_with_its_negative_control(causal):
    """Causal: n = position + 1; bidirectional: n = the sentence's length. The control (n = L for every causal query,
    the length of the block rather than the keys seen) differs."""
    attn = method(causal, scalable_softmax=0.43)
    with torch.no_grad():
        attn.query_key_terms[0].scale.copy_(torch.tensor([0.3, 0.7, 1.1]))
    q, k, v = qkv()
    out = posattn.position_attention(q, k, v, attn, causal=causal)
    seen = [[i + 1 if causal else L for i in range(L)]] * B
    visible = causal_visible(L) if causal else torch.ones(L, L, dtype=torch.bool)
    expected = masked_softmax_output(ssmax_logits(q, k, attn.query_key_terms[0].scale, seen), v, visible)
    torch.testing.assert_close(out, expected, **TOLERANCE)
    if causal:
        control = masked_softmax_output(ssmax_logits(q, k, attn.query_key_terms[0].scale, [[L] * L] * B), v, visible)
        assert max_gap(out, control) > 1e-2


def test_ssmax_counts_the_real_tokens_of_a_padded_sentence():
    """Bidirectional, left padding: n is each sentence's real length (4 and 7), not the batch's 7."""
    attn = method(False, scalable_softmax=0.5)
    q, k, v = qkv()
    padding = torch.zeros(B, L, dtype=torch.bool)
    padding[0, :3] = True
    out = posattn.position_attention(q, k, v, attn, padding_mask=padding, causal=False)
    alone = posattn.position_attention(q[:1, :, 3:], k[:1, :, 3:], v[:1, :, 3:], attn, causal=False)
    torch.testing.assert_close(out[:1, :, 3:], alone, **TOLERANCE)
    seen = [[4] * 4]
    expected = masked_softmax_output(ssmax_logits(q[:1, :, 3:], k[:1, :, 3:], attn.query_key_terms[0].scale, seen),
                                      v[:1, :, 3:], torch.ones(4, 4, dtype=torch.bool))
    torch.testing.assert_close(alone, expected, **TOLERANCE)
    control = masked_softmax_output(ssmax_logits(q[:1, :, 3:], k[:1, :, 3:], attn.query_key_terms[0].scale,
                                                 [[L] * 4]), v[:1, :, 3:], torch.ones(4, 4, dtype=torch.bool))
    assert max_gap(alone, control) > 1e-2


def test_ssmax_leaves_the_additive_biases_unscaled():
    """With ALiBi: z_ij = s_h log(n_i) q_i . k_j / sqrt(d_h) - m_h (i - j), the bias added after the query's
    scaling (docs/methods.md, order of operations); scaling the bias too (the control) differs."""
    attn = method(True, scalable_softmax=0.43, alibi=True)
    q, k, v = qkv()
    out = posattn.position_attention(q, k, v, attn, causal=True)
    slopes = attn.additive_terms[0].slopes.double()
    distance = torch.arange(L)[:, None] - torch.arange(L)[None, :]
    bias = -slopes[:, None, None] * distance
    scale = attn.query_key_terms[0].scale
    content = ssmax_logits(q, k, scale, [[i + 1 for i in range(L)]] * B)
    visible = causal_visible(L)
    torch.testing.assert_close(out, masked_softmax_output(content + bias, v, visible), **TOLERANCE)
    factor = scale.double()[:, None, None] * torch.arange(1, L + 1, dtype=torch.float64).log()[None, :, None]
    assert max_gap(out, masked_softmax_output(content + factor * bias, v, visible)) > 1e-2


def test_ssmax_refuses_a_negative_scale_naming_the_flag():
    with pytest.raises(PositionOptionError, match="--encoder-scalable-softmax is the initial s"):
        posattn.position_options(False, scalable_softmax=-0.5)


# ------------------------------------------------------------------------------------------------------- CABLE
def cable_outside(x, weight, bias, q, k, v) -> torch.Tensor:
    """axiomlab/Cable ``src/Cable.py`` ``CausalSelfAttention.forward`` in float64, from its bias to ``softmax(att) @
    v``: ``b = cumsum(-softplus(h_attn(x)), dim=1).permute(0, 2, 1)``; ``Bias = (b.unsqueeze(3) - b.unsqueeze(2)) +
    triu(-inf, 1)``; ``att = baddbmm(Bias, q, k^T)``. Their code multiplies q and k by 1 (``sqrt(C / n_embd)``): the
    queries given here are already divided by sqrt(d_h), as the kernel divides them."""
    T = x.size(1)
    b = torch.cumsum(-F.softplus(x @ weight.t() + bias), dim=1).permute(0, 2, 1)
    causal_mask = torch.triu(torch.full((T, T), float("-inf"), dtype=torch.float64), diagonal=1)
    biases = (b.unsqueeze(3) - b.unsqueeze(2)) + causal_mask
    scores = torch.baddbmm(biases.reshape(-1, T, T), q.reshape(-1, T, D), k.reshape(-1, T, D).transpose(1, 2))
    return F.softmax(scores.reshape(x.size(0), H, T, T), dim=-1) @ v


def cable_layer_input(length: int = L):
    return torch.randn(B, length, H * D, generator=torch.Generator().manual_seed(3), dtype=torch.float64)


def randomized_slopes(attn):
    term = attn.token_difference_terms[0]
    generator = torch.Generator().manual_seed(4)
    with torch.no_grad():
        term.slope.weight.copy_(torch.randn(term.slope.weight.shape, generator=generator, dtype=torch.float64) * 0.5)
        term.slope.bias.copy_(torch.randn(term.slope.bias.shape, generator=generator, dtype=torch.float64))
    return term


def test_cable_equals_the_authors_code():
    attn = method(True, cable=True)
    term = randomized_slopes(attn)
    q, k, v = qkv()
    x = cable_layer_input()
    out = posattn.position_attention(q, k, v, attn, causal=True, x=x)
    expected = cable_outside(x, term.slope.weight, term.slope.bias, q / math.sqrt(D), k, v)
    torch.testing.assert_close(out, expected, **TOLERANCE)
    assert max_gap(out, posattn.position_attention(q, k, v, method(True), causal=True)) > 1e-2  # the bias matters


def test_cable_bias_is_the_equations_sum_with_its_negative_control():
    """B_ij = -sum_{l=j+1..i} softplus(w_h . x_l + b_h) entry by entry; the control sums from l = j (the key's own
    slope too) and differs."""
    term = randomized_slopes(method(True, cable=True)).requires_grad_(False)
    x = cable_layer_input()
    ctx = posattn.batch_context(None, True, L)
    bias = term.bias_of(term.token_values(x.transpose(0, 1), ctx, None), L)
    control_gap = 0.0
    for b in range(B):
        for h in range(H):
            slopes = [math.log1p(math.exp(float(term.slope.weight[h] @ x[b, t]) + float(term.slope.bias[h])))
                      for t in range(L)]
            for i in range(L):
                for j in range(i + 1):
                    assert bias[b, h, i, j].item() == pytest.approx(-sum(slopes[j + 1: i + 1]), abs=1e-12)
                    control_gap = max(control_gap, abs(bias[b, h, i, j].item() + sum(slopes[j: i + 1])))
    assert control_gap > 1e-2


def test_cable_is_fox_with_the_gates_weights_negated():
    """-softplus(z) = log sigmoid(-z): CABLE with (w, b) computes FoX with (-w, -b)."""
    cable = method(True, cable=True)
    term = randomized_slopes(cable)
    fox = method(True, forget_gate=True)
    with torch.no_grad():
        fox.token_difference_terms[0].gate.weight.copy_(-term.slope.weight)
        fox.token_difference_terms[0].gate.bias.copy_(-term.slope.bias)
    q, k, v = qkv()
    x = cable_layer_input()
    torch.testing.assert_close(posattn.position_attention(q, k, v, cable, causal=True, x=x),
                               posattn.position_attention(q, k, v, fox, causal=True, x=x), **TOLERANCE)


def test_cable_is_for_causal_sides_only():
    with pytest.raises(PositionOptionError, match="cable"):
        posattn.position_options(False, cable=True)


# ------------------------------------------------------------------------------------------ selective attention
def x_transformers_selective(sim: torch.Tensor) -> torch.Tensor:
    """x-transformers ``selective_attn(sim)`` (no gate head given, ``no_mask_sos=True``) in float64: gate = ReLU of
    head 0's logits, column -i (the first key when i == j) zeroed, ``(1 - eye)`` zeroes self-selection, shifted one
    query down (``F.pad(gate, (0, 0, 1, -1))``), summed over queries (``cumsum(dim=-2)``), subtracted from every
    head."""
    i, j = sim.shape[-2:]
    gate = F.relu(sim[:, 0]).clone()
    gate[..., -i] = 0.0
    eye = torch.eye(i, dtype=sim.dtype)
    if j > i:
        eye = F.pad(eye, (j - i, 0), value=1.0)
    gate = (1.0 - eye) * gate
    gate = F.pad(gate, (0, 0, 1, -1), value=0.0)
    return sim - gate.cumsum(dim=-2)[:, None]


def x_transformers_output(q, k, v) -> torch.Tensor:
    """``Attend.forward`` up to the weights: ``sim = q k^T * scale``, the causal mask as ``-finfo.max``, then
    ``selective_attn``, softmax, times v."""
    sim = torch.einsum("bhid,bhjd->bhij", q, k) * D ** -0.5
    sim = sim.masked_fill(~causal_visible(q.size(2)), -torch.finfo(sim.dtype).max)
    return torch.softmax(x_transformers_selective(sim), dim=-1) @ v


def selection_loop(logits: torch.Tensor, exclude_first: bool = True, exclude_self: bool = True,
                   inclusive: bool = False) -> torch.Tensor:
    """The paper's F_ij = sum_{k<i} S_kj, S_kj = max(head 0's l_kj, 0) (0 where k may not see j), without j = k and
    j = 0, subtracted from every head; the switches make the negative controls."""
    out = logits.clone()
    for b in range(logits.size(0)):
        for i in range(logits.size(2)):
            for j in range(logits.size(3)):
                earlier = range(i + 1) if inclusive else range(i)
                selected = sum(max(float(logits[b, 0, k, j]), 0.0) for k in earlier
                               if not (exclude_self and k == j) and not (exclude_first and j == 0) and j <= k)
                out[b, :, i, j] -= selected
    return out


def test_selective_attention_equals_x_transformers_and_the_papers_loop():
    attn = method(True, selective_attention=True)
    q, k, v = qkv()
    out = posattn.position_attention(q, k, v, attn, causal=True)
    torch.testing.assert_close(out, x_transformers_output(q, k, v), **TOLERANCE)
    logits = torch.einsum("bhid,bhjd->bhij", q, k) * D ** -0.5
    visible = causal_visible(L)
    torch.testing.assert_close(out, masked_softmax_output(selection_loop(logits), v, visible), **TOLERANCE)
    for control in ({"exclude_first": False}, {"exclude_self": False}, {"inclusive": True}):
        assert max_gap(out, masked_softmax_output(selection_loop(logits, **control), v, visible)) > 1e-3, control
    assert max_gap(out, posattn.position_attention(q, k, v, method(True), causal=True)) > 1e-2


def test_selective_attention_of_a_padded_batch_is_each_sentence_alone():
    """Left padding: the first token is the sentence's first real token (position 0), and pads select nothing."""
    attn = method(True, selective_attention=True)
    q, k, v = qkv()
    padding = torch.zeros(B, L, dtype=torch.bool)
    padding[1, :2] = True
    out = posattn.position_attention(q, k, v, attn, padding_mask=padding, causal=True)
    alone = posattn.position_attention(q[1:, :, 2:], k[1:, :, 2:], v[1:, :, 2:], attn, causal=True)
    torch.testing.assert_close(out[1:, :, 2:], alone, **TOLERANCE)
    torch.testing.assert_close(out[:1], posattn.position_attention(q[:1], k[:1], v[:1], attn, causal=True),
                               **TOLERANCE)


def test_selective_attention_decodes_as_the_full_pass_with_beam_reordering():
    """A prompt of 3 tokens, then one token per step; the batch reordered (beam search) after the second step: the
    cached sums of the selection scores follow their sequences."""
    attn = method(True, selective_attention=True)
    q, k, v = qkv(length=9)
    order = torch.tensor([1, 0])
    cache = posattn.DecodingCache()
    steps = [posattn.position_attention(q[:, :, :3], k[:, :, :3], v[:, :, :3], attn, causal=True, cache=cache)]
    for t in range(3, 9):
        if t == 5:
            cache.reorder(order)
            q, k, v = (tensor[order] for tensor in (q, k, v))
            steps = [step[order] for step in steps]
        steps.append(posattn.position_attention(q[:, :, t:t + 1], k[:, :, t:t + 1], v[:, :, t:t + 1], attn,
                                                causal=True, cache=cache))
    torch.testing.assert_close(torch.cat(steps, dim=2), posattn.position_attention(q, k, v, attn, causal=True),
                               **TOLERANCE)


def test_selective_attention_is_for_causal_sides_only_and_refuses_flex():
    with pytest.raises(PositionOptionError, match="selective"):
        posattn.position_options(False, selective_attention=True)
    with pytest.raises(PositionOptionError, match="--decoder-attention-kernel flex: --decoder-selective-attention"):
        posattn.position_method(H, D, causal=True, selective_attention=True, attention_kernel="flex")


@pytest.mark.parametrize("flags", [["--encoder-cable"], ["--encoder-selective-attention"]])
def test_the_causal_only_methods_have_no_encoder_option(flags, capsys):
    with pytest.raises(SystemExit):
        build_model("transformer_posattn", flags)
    assert f"unrecognized arguments: {' '.join(flags)}" in capsys.readouterr().err
