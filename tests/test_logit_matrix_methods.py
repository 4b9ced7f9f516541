"""Multi-token attention (MTA) and DAPE, the logit-matrix transforms (kind 10), against their authors' code
transcribed in float64 and the papers' equations written as loops (tests/reference_attention.py), each with a
negative control; their decoding, initialisation, refusals and inspection.

Outside code read (transcribed below, not imported):

- MTA: facebookresearch/RAM, commit e6f051fbcfaef4cab69bf2ea1b25f500f94c0c64, projects/mta/mta_transformer.py:
  ``Attention.forward`` (the ``use_mta`` branch), ``_mta_convolution`` (``pad_key="both"``, no chunks) and
  ``_head_convolution``;
- DAPE: chuanyang-Zheng/DAPE, commit bde344a844f2bd1f498b2bac70240dcda41c50c1, DAPE.py: ``AliBi_DAPE.forward`` and
  ``ParallelKerpleLog_DAPE.forward`` (``x + bias + mlp2(cat(x, bias))``), with the masked softmax of
  megatron/model/transformer.py after it.
"""

import math

import pytest
import torch
import torch.nn.functional as F

import posattn
from posattn.position_options import PositionOptionError
from reference_attention import randomize_, reference_attention

B, H, T, D_HEAD = 2, 4, 7, 6
E = H * D_HEAD


def qkv(seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    return [torch.randn(B, H, T, D_HEAD, generator=generator, dtype=torch.float64) for _ in range(3)]


def method(causal: bool = True, seed: int = 1, **options):
    """A layer's position method in float64 with random parameters (its identity initialisation tests nothing)."""
    kernel = posattn.position_method(H, D_HEAD, causal=causal, **options).double()
    randomize_(kernel, seed)
    return kernel


# ----------------------------------------------------------------- MTA, the authors' code transcribed
def authors_mta(q, k, v, kernel, head_kernel, pad_key="both"):
    """RAM's ``Attention.forward`` with ``use_mta`` (pre-softmax q-k kernel, post-softmax head kernel), causal mask."""
    bsz, n_heads, slen, _ = q.shape
    scores = torch.matmul(q, k.transpose(2, 3)) * (1.0 / math.sqrt(q.size(-1)))
    mask = torch.triu(torch.full((slen, slen), float("-inf"), dtype=q.dtype), diagonal=1).repeat(bsz, n_heads, 1, 1)
    scores = scores.clone()
    scores[mask == float("-inf")] = 0  # _mta_convolution
    _, head_kernel_size, qdim, kdim = kernel.shape
    if pad_key == "both":
        padded = F.pad(scores, ((kdim - 1) // 2, (kdim - 1) // 2, qdim - 1, 0), value=0.0)
    else:  # "left"
        padded = F.pad(scores, (kdim - 1, 0, qdim - 1, 0), value=0.0)
    scores = F.conv2d(padded, kernel, padding=0, groups=n_heads // head_kernel_size)
    scores = F.softmax(scores + mask, dim=-1)
    groups, size = head_kernel.shape[0], head_kernel.shape[1]  # _head_convolution
    grouped = scores.reshape(bsz, groups, size, slen, -1)
    mixed = torch.empty_like(grouped)
    for i in range(groups):
        mixed[:, i] = torch.matmul(grouped[:, i].transpose(1, -1), head_kernel[i]).transpose(1, -1)
    return torch.matmul(mixed.reshape(bsz, n_heads, slen, -1), v)


MTA = {"multi_token_attention": True, "mta_query_kernel": 4, "mta_key_kernel": 5, "mta_head_group": 2}


def test_mta_equals_the_authors_code_and_not_with_other_key_padding():
    q, k, v = qkv()
    mta = method(**MTA)
    term = mta.logit_matrix_terms[0]
    ours = posattn.position_attention(q, k, v, mta, causal=True)
    theirs = authors_mta(q, k, v, term.kernel.detach(), term.head_mixing.detach())
    torch.testing.assert_close(ours, theirs, rtol=1e-12, atol=1e-12)
    left = authors_mta(q, k, v, term.kernel.detach(), term.head_mixing.detach(), pad_key="left")
    assert (ours - left).abs().max() > 1e-2  # negative control: the key window's side matters, and is seen


@pytest.mark.parametrize("causal", [True, False])
def test_mta_equals_the_papers_equations_as_loops_and_not_without_head_mixing(causal):
    options = dict(MTA, mta_query_kernel=3)
    layer = posattn.SelfAttention(E, H, causal=causal, **options).double()
    randomize_(layer, 2)
    x = torch.randn(1, T, E, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    ours = layer(x)[0]
    with torch.no_grad():
        expected, _ = reference_attention(layer, x[0], causal)
    torch.testing.assert_close(ours, expected, rtol=1e-10, atol=1e-10)
    with torch.no_grad():
        layer.logit_matrix_terms[0].head_mixing.copy_(torch.eye(2).repeat(2, 1, 1))
    assert (layer(x)[0] - expected).abs().max() > 1e-3  # negative control: the mixing is in the comparison


def test_mta_starts_as_plain_attention():
    """The authors' identity initialisation: kernels 1 at the current query and key, mixings the identity."""
    q, k, v = qkv(4)
    for causal in (True, False):
        options = dict(MTA, mta_query_kernel=3)
        mta = posattn.position_method(H, D_HEAD, causal=causal, **options).double()
        plain = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        torch.testing.assert_close(posattn.position_attention(q, k, v, mta, causal=causal), plain)


@pytest.mark.parametrize("left_pad", [False, True])
def test_mta_decoding_step_by_step_equals_the_full_pass(left_pad):
    """c_q = 4 rows reach back past the first steps, also for several queries after cached keys; a left-padded
    sentence's pads give the window nothing."""
    layer = posattn.SelfAttention(E, H, causal=True, **MTA).double()
    randomize_(layer, 5)
    x = torch.randn(B, T, E, dtype=torch.float64, generator=torch.Generator().manual_seed(6))
    padding = torch.zeros(B, T, dtype=torch.bool)
    if left_pad:
        padding[1, :2] = True
    full = layer(x, padding_mask=padding)
    cache = posattn.DecodingCache()
    steps = torch.cat([layer(x[:, :2], padding_mask=padding[:, :2], cache=cache),
                       layer(x[:, 2:4], padding_mask=padding[:, 2:4], cache=cache)]
                      + [layer(x[:, i : i + 1], padding_mask=padding[:, i : i + 1], cache=cache)
                         for i in range(4, T)], 1)
    real = ~padding
    torch.testing.assert_close(steps[real], full[real], rtol=1e-10, atol=1e-10)
    assert set(cache.state) >= {"prev_logit_rows_0"}
    assert cache.state["prev_logit_rows_0"].shape == (B, H, 3, T)  # the c_q - 1 rows before the next query


def test_mta_with_one_query_tap_decodes_without_cached_rows():
    layer = posattn.SelfAttention(E, H, causal=True, **dict(MTA, mta_query_kernel=1)).double()
    randomize_(layer, 11)
    x = torch.randn(B, T, E, dtype=torch.float64, generator=torch.Generator().manual_seed(12))
    cache = posattn.DecodingCache()
    steps = torch.cat([layer(x[:, i : i + 1], cache=cache) for i in range(T)], 1)
    torch.testing.assert_close(steps, layer(x), rtol=1e-10, atol=1e-10)
    assert set(cache.state) == {"prev_key", "prev_value"}


# ----------------------------------------------------------------- DAPE, the authors' code transcribed
def authors_alibi_slopes(n):
    """DAPE.py's ``AliBi._get_slopes`` (n a power of 2)."""
    start = 2 ** (-(2 ** -(math.log2(n) - 3)))
    return [start * start ** i for i in range(n)]


def authors_dape(q, k, v, bias, mlp_in, mlp_out, swap=False):
    """DAPE.py's ``*_DAPE.forward`` on the scores (``x + bias + mlp2(cat(x, bias))``), then megatron's causal masked
    softmax and the values. ``swap``: the negative control, the MLP's inputs in the other order."""
    slen = q.size(2)
    x = torch.matmul(q, k.transpose(2, 3)) / math.sqrt(q.size(-1))
    tiled = torch.tile(bias, (x.shape[0], 1, 1, 1))
    features = torch.cat((tiled, x) if swap else (x, tiled), dim=1).permute(0, 2, 3, 1)
    hidden = F.leaky_relu(F.linear(features, mlp_in.weight, mlp_in.bias))
    x_a_bias = F.linear(hidden, mlp_out.weight, mlp_out.bias).permute(0, 3, 1, 2)
    scores = x + bias + x_a_bias
    future = torch.triu(torch.ones(slen, slen, dtype=torch.bool), diagonal=1)
    return torch.matmul(torch.softmax(scores.masked_fill(future, float("-inf")), dim=-1), v)


def test_dape_on_alibi_equals_the_authors_code_and_not_with_its_inputs_swapped():
    q, k, v = qkv(7)
    dape = method(dape=8, alibi=True)
    term = dape.logit_matrix_terms[0]
    slopes = torch.tensor(authors_alibi_slopes(H), dtype=torch.float64)
    positions = torch.arange(T)
    alibi = -torch.tril(positions[:, None] - positions[None, :]).to(torch.float64) * slopes[:, None, None]
    ours = posattn.position_attention(q, k, v, dape, causal=True)
    theirs = authors_dape(q, k, v, alibi, term.mlp_in, term.mlp_out)
    torch.testing.assert_close(ours, theirs, rtol=1e-12, atol=1e-12)
    swapped = authors_dape(q, k, v, alibi, term.mlp_in, term.mlp_out, swap=True)
    assert (ours - swapped).abs().max() > 1e-2  # negative control


def test_dape_on_kerple_equals_the_authors_code():
    """ParallelKerpleLog_DAPE's bias ``-p log(1 + a |i - j|)`` with our KERPLE's (clamped) parameters."""
    q, k, v = qkv(8)
    dape = method(dape=8, kerple="log")
    kerple = dape.additive_terms[0].side_parameters
    p, a = kerple.r1.detach().clamp(min=0.01), kerple.r2.detach().clamp(min=0.01)
    positions = torch.arange(T)
    diff = torch.tril(positions[:, None] - positions[None, :]).to(torch.float64)
    bias = -p[:, None, None] * torch.log(1 + a[:, None, None] * diff)
    term = dape.logit_matrix_terms[0]
    ours = posattn.position_attention(q, k, v, dape, causal=True)
    torch.testing.assert_close(ours, authors_dape(q, k, v, bias, term.mlp_in, term.mlp_out), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("causal", [True, False])
def test_dape_equals_the_papers_equation_as_a_loop_and_not_without_its_mlp(causal):
    layer = posattn.SelfAttention(E, H, causal=causal, dape=5, alibi=True).double()
    randomize_(layer, 9)
    x = torch.randn(1, T, E, dtype=torch.float64, generator=torch.Generator().manual_seed(10))
    with torch.no_grad():
        expected, _ = reference_attention(layer, x[0], causal)
    torch.testing.assert_close(layer(x)[0], expected, rtol=1e-10, atol=1e-10)
    with torch.no_grad():
        layer.logit_matrix_terms[0].mlp_out.weight.zero_()
        layer.logit_matrix_terms[0].mlp_out.bias.zero_()
    assert (layer(x)[0] - expected).abs().max() > 1e-3  # negative control: the MLP's term is in the comparison


# ----------------------------------------------------------------- refusals, paths, inspection
@pytest.mark.parametrize("options, message", [
    ({"dape": 8}, "--decoder-dape 8 reads the additive biases of the logits, and layer 0"),
    ({"dape": -1}, "--decoder-dape must be 0 (off)"),
    ({"dape": 8, "alibi": True, "attention_kernel": "flex"}, "--decoder-attention-kernel flex: --decoder-dape 8"),
    ({"multi_token_attention": True, "mta_key_kernel": 4}, "--decoder-mta-key-kernel must be an odd positive"),
    ({"multi_token_attention": True, "mta_query_kernel": 0}, "--decoder-mta-query-kernel must be a positive"),
    ({"multi_token_attention": True, "mta_head_group": 3}, "--decoder-mta-head-group 3 does not divide the layer's 4"),
    ({"multi_token_attention": True, "mta_query_kernel": 1, "mta_key_kernel": 1, "mta_head_group": 1},
     "--decoder-multi-token-attention with a 1 x 1 kernel and no head mixing"),
    ({"mta_head_group": 2}, "--decoder-mta-head-group 2 has no effect without --decoder-multi-token-attention"),
])
def test_refusals_name_the_option(options, message):
    with pytest.raises(PositionOptionError, match="^" + message.replace("(", r"\(").replace(")", r"\)")):
        posattn.SelfAttention(E, H, causal=True, **options)


def test_mta_on_a_bidirectional_side_needs_an_odd_query_window():
    with pytest.raises(PositionOptionError, match="--encoder-mta-query-kernel must be a positive number of query "
                                                  "taps, odd on a bidirectional side"):
        posattn.SelfAttention(E, H, causal=False, multi_token_attention=True)


def test_both_take_the_explicit_path_and_show_their_parameters():
    mta = posattn.SelfAttention(E, H, causal=True, **MTA)
    dape = posattn.SelfAttention(E, H, causal=True, dape=8, kerple="log")
    for layer in (mta, dape):
        assert layer.path(False, torch.device("cpu"), decoding=False)[0] == "explicit"
    shown = {quantity.name: quantity for quantity in mta.logit_matrix_terms[0].inspect(T)}
    assert shown["kernels"].values.shape == (H, 4, 5)
    torch.testing.assert_close(shown["head_mixing"].values, torch.eye(H))  # two identity groups, block-diagonal
    shown = {quantity.name: quantity for quantity in dape.logit_matrix_terms[0].inspect(T)}
    assert shown["mlp_in"].values.shape == (8, 2 * H) and shown["mlp_out"].values.shape == (H, 8)
