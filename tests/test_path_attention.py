"""PaTH attention (Yang et al. 2025) and PaTH-FoX: the layer against the paper's equation written as explicit matrix
products (``reference_attention._path``) and against a float64 transcription of flash-linear-attention's naive
reference; negative controls; the chunked form's memory; the decoding cache's carried keys; PaTH-FoX decoding with
beam reordering. The shared families (every invariant, padding, checkpointing, half precision, decoding) take the
registered variant ``path-attention``."""

import math
from typing import Dict, Tuple

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor

import posattn
from posattn.attention import EXPLICIT
from posattn.library_kernels import optional_module
from posattn.position_terms.path_attention import FLA_MODULE
from reference_attention import _path, _path_transform, randomize_, reference_attention, sentence_of

E, H = 16, 2
D = E // H


def layer(seed: int = 0, **options: bool) -> posattn.SelfAttention:
    """A causal float64 layer with PaTH (and ``options``), every parameter random."""
    attn = posattn.SelfAttention(E, H, causal=True, path_attention=True, **options).double()
    randomize_(attn, seed)
    return attn


def batch(length: int, seed: int = 1, sentences: int = 3) -> Tensor:
    return torch.randn(sentences, length, E, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def fla_naive_path_attn(q: Tensor, k: Tensor, v: Tensor, w: Tensor, beta: Tensor, g: Tensor, scale: float,
                        chunk_size: int) -> Tensor:
    """flash-linear-attention's ``naive_path_attn`` (fla-org/flash-linear-attention, commit bc3b101d,
    ``fla/ops/path_attn/naive.py``, the reference of its ``tests/ops/test_path_attn.py``), transcribed in float64
    without grouped heads: ``q, k, v, w`` ``(B, T, H, D)``, ``beta, g`` ``(B, T, H)`` (``g``: log forget gates, added to
    the logits *before* ``scale``, as in fla's kernels)."""
    q, k, v, w, beta, g = (t.double().transpose(1, 2) for t in (q, k, v, w, beta, g))
    g_cumsum = g.cumsum(-1)
    b, h, length, _ = q.shape
    bt = chunk_size
    if length % bt != 0:
        padding = bt - length % bt
        q, k, w = (F.pad(t, (0, 0, 0, padding)) for t in (q, k, w))
        beta = F.pad(beta, (0, padding))
    seq_len = q.shape[2]
    w_beta = w * beta[..., None]
    q, k, w, w_beta = (t.unflatten(2, (seq_len // bt, bt)) for t in (q, k, w, w_beta))
    mask = torch.triu(torch.ones(bt, bt, dtype=torch.bool), diagonal=0)
    t_mat = -(w_beta @ w.transpose(-1, -2)).masked_fill(mask, 0)
    for i in range(1, bt):
        t_mat[..., i, :i] = t_mat[..., i, :i].clone() + (t_mat[..., i, :, None].clone()
                                                         * t_mat[..., :, :i].clone()).sum(-2)
    t_mat = t_mat + torch.eye(bt, dtype=q.dtype)
    twbk = t_mat @ (w_beta @ k.transpose(-1, -2)).masked_fill(mask, 0)
    qw = (q @ w.transpose(-1, -2)).tril()
    twb = t_mat @ w_beta
    a_local = (q @ k.transpose(-1, -2)).tril() - qw @ twbk
    q = q - qw @ twb
    k = k - twbk.transpose(-1, -2) @ w
    h_mat = w.transpose(-1, -2) @ twb
    a = torch.zeros(b, h, seq_len, seq_len, dtype=q.dtype)
    q, k = (t.flatten(2, 3) for t in (q, k))
    for i in range(0, seq_len, bt):
        q_i = q[:, :, i:i + bt].clone()
        for j in range(i - bt, -bt, -bt):
            a[:, :, i:i + bt, j:j + bt] = q_i @ k[:, :, j:j + bt].transpose(-1, -2)
            q_i = q_i - q_i @ h_mat[:, :, j // bt]
    for i in range(seq_len // bt):
        a[:, :, i * bt:(i + 1) * bt, i * bt:(i + 1) * bt] = a_local[:, :, i]
    causal = torch.tril(torch.ones(seq_len, seq_len, dtype=torch.bool))
    a = a.masked_fill(~causal, float("-inf"))[:, :, :length, :length]
    a = a + g_cumsum[..., None] - g_cumsum[..., None, :]
    return ((a * scale).softmax(-1) @ v).transpose(1, 2)


def path_values(method: posattn.attention.PositionKernel, x: Tensor) -> Tuple[Tensor, Tensor]:
    """The layer's ``w`` ``(B, H, T, D)`` and ``beta`` ``(B, H, T)`` of the unpadded batch ``x`` ``(B, T, E)``."""
    ctx = posattn.batch_context(None, True, x.size(1))
    (w, beta), _ = method.content_term.token_values(x.transpose(0, 1), ctx, None)
    return w, beta


@pytest.mark.parametrize("padding", ["left", "right"])
@pytest.mark.parametrize("chunk", [1, 3, 64])
def test_path_and_path_fox_equal_the_papers_equation(padding: str, chunk: int) -> None:
    """Every chunking of the chunked form, PaTH alone and PaTH-FoX (the forget gate's bias added to PaTH's logits),
    padded either side, equals the loop of explicit matrix products sentence by sentence (weights and output)."""
    x, mask = batch(7), torch.zeros(3, 7, dtype=torch.bool)
    mask[1, :3] = mask[2, :1] = True
    if padding == "right":
        mask = mask.flip(1)
    for options in ({}, {"forget_gate": True}):
        attn = layer(**options)
        attn.content_term.chunk = chunk
        out, weights = attn(x, padding_mask=mask, need_weights=True)
        for b in range(3):
            ref_out, ref_probs = reference_attention(attn, sentence_of(x.transpose(0, 1), b, mask), causal=True)
            real = ~mask[b]
            assert (out[b, real] - ref_out).abs().max() < 1e-12
            assert (weights[b][:, real][:, :, real] - ref_probs).abs().max() < 1e-12


@pytest.mark.parametrize("forget_gate", [False, True])
def test_equals_flash_linear_attentions_naive_reference(forget_gate: bool) -> None:
    """PaTH (and PaTH-FoX) equal fla's reference on the layer's own q, k, v, w and beta, in float64; fla adds the log
    gates before the 1/sqrt(d) scaling, FoX after it, so fla's g is sqrt(d) times FoX's log gates."""
    method = posattn.position_method(H, D, causal=True, path_attention=True, forget_gate=forget_gate).double()
    randomize_(method, 3)
    method.content_term.chunk = 8
    q, k, v = (torch.randn(2, H, 37, D, generator=torch.Generator().manual_seed(s), dtype=torch.float64)
               for s in (4, 5, 6))
    x = batch(37, seed=7, sentences=2)
    out = posattn.position_attention(q, k, v, method, x=x)
    w, beta = path_values(method, x)
    g = torch.zeros_like(beta)
    if forget_gate:
        ctx = posattn.batch_context(None, True, 37)
        g = method.token_difference_terms[0].log_gates(x.transpose(0, 1), ctx) * math.sqrt(D)
    fla = fla_naive_path_attn(*(t.transpose(1, 2) for t in (q, k, v, w, beta, g)), scale=D ** -0.5, chunk_size=16)
    assert (out - fla.transpose(1, 2)).abs().max() < 1e-12
    if forget_gate:  # fla's g taken as FoX's log gates themselves: another model
        unscaled = fla_naive_path_attn(*(t.transpose(1, 2) for t in (q, k, v, w, beta, g / math.sqrt(D))),
                                       scale=D ** -0.5, chunk_size=16)
        assert (out - unscaled.transpose(1, 2)).abs().max() > 1e-3


def reversed_order_probs(attn: posattn.SelfAttention, sentence: Tensor) -> Tensor:
    """Head 0's weights with the transforms in the wrong order, ``q_i^T H_{j+1} ... H_i k_j``."""
    length = sentence.size(0)
    q, k = (sentence @ p.weight[:D].t() + p.bias[:D] for p in (attn.q_proj, attn.k_proj))
    transforms = [_path_transform(attn.content_term, sentence, 0, t) for t in range(length)]
    logits = torch.full((length, length), float("-inf"), dtype=torch.float64)
    for i in range(length):
        for j in range(i + 1):
            product = torch.eye(D, dtype=torch.float64)
            for t in range(j + 1, i + 1):
                product = product @ transforms[t]
            logits[i, j] = q[i] @ product @ k[j] / math.sqrt(D)
    return logits.softmax(-1)


def test_negative_controls_transforms_reversed_and_beta_zero() -> None:
    """The transforms in the other order give other weights; beta = 0 (every H_t the identity) gives plain attention,
    and the layer's own beta does not."""
    attn = layer()
    x = batch(6, sentences=1)
    _, weights = attn(x, need_weights=True)
    assert (weights[0, 0] - reversed_order_probs(attn, x[0])).abs().max() > 1e-3

    plain = posattn.SelfAttention(E, H, causal=True).double()
    plain.load_state_dict(attn.state_dict(), strict=False)
    assert (attn(x) - plain(x)).abs().max() > 1e-3
    with torch.no_grad():
        attn.content_term.beta_proj.weight.zero_()
        attn.content_term.beta_proj.bias.fill_(-1e4)  # 2 sigmoid(-1e4) = 0 in float64
    assert (attn(x) - plain(x)).abs().max() < 1e-12


def test_the_cache_holds_the_keys_carried_to_the_last_token() -> None:
    """After decoding, the cached keys are H_last ... H_{j+1} k_j (the loop's keys as the last query reads them): each
    step multiplied them by its token's transform."""
    attn, x = layer(), batch(6, sentences=2)
    cache = posattn.DecodingCache()
    attn(x[:, :3], cache=cache)
    for t in range(3, 6):
        attn(x[:, t:t + 1], cache=cache)
    for b in range(2):
        for h in range(H):
            rows = slice(h * D, (h + 1) * D)
            k = x[b] @ attn.k_proj.weight[rows].t() + attn.k_proj.bias[rows]
            last = _path(attn.content_term, x[b], h, k)[5]
            assert (cache.state["prev_key"][b, h] - torch.stack(last)).abs().max() < 1e-12


def test_path_fox_decodes_as_it_computes_in_full_with_beam_reordering() -> None:
    """PaTH-FoX step by step (a prompt, then one token at a time, the beams reordered midway) equals the full pass."""
    attn, x = layer(forget_gate=True), batch(8)
    order = torch.tensor([2, 0, 0])
    cache = posattn.DecodingCache()
    outs = [attn(x[:, :3], cache=cache)]
    for t in range(3, 8):
        if t == 5:
            cache.reorder(order)
            x, outs = x[order], [out[order] for out in outs]
        outs.append(attn(x[:, t:t + 1], cache=cache))
    assert (torch.cat(outs, dim=1) - attn(x)).abs().max() < 1e-12


def test_the_chunked_form_keeps_no_length_by_length_by_head_dim_tensor() -> None:
    """At 384 tokens, chunks of 64 and of 25 give the same output and gradients, and the backward pass keeps fewer
    numbers than 8 (L x L) matrices per head, a fourth of one (L x L x d_h) tensor at d_h = 32: no product of
    transforms per pair and no transformed key per pair is materialised."""
    method = posattn.position_method(2, 32, causal=True, path_attention=True)
    generator = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 384, 32, generator=generator, requires_grad=True) for _ in range(3))
    x = torch.randn(1, 384, 64, generator=generator)
    results = []
    for chunk in (64, 25):
        method.content_term.chunk = chunk
        saved: Dict[int, int] = {}  # numbers per storage (a tensor saved twice is kept once)

        def pack(t: Tensor) -> Tensor:
            saved.setdefault(t.untyped_storage().data_ptr(), t.numel())
            return t
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            out = posattn.position_attention(q, k, v, method, x=x)
        results.append((out, *torch.autograd.grad(out.square().sum(), (q, k, v))))
        assert sum(saved.values()) < 8 * 2 * 384 * 384
    for first, second in zip(*results):
        assert (first - second).abs().max() < 1e-4 * first.abs().max()


def test_a_bidirectional_side_and_the_flex_kernel_are_refused_in_one_line() -> None:
    with pytest.raises(posattn.UserError, match="causal-only.*path_attention"):
        posattn.SelfAttention(E, H, causal=False, path_attention=True)
    with pytest.raises(posattn.UserError, match="attention-kernel flex: --decoder-path-attention .* content logits"):
        posattn.SelfAttention(E, H, causal=True, path_attention=True, attention_kernel="flex")


@pytest.mark.skipif(optional_module(FLA_MODULE)[0] is not None, reason="flash-linear-attention is installed here: "
                                                                      "tests/test_library_kernels.py runs its path")
def test_without_flash_linear_attention_cuda_takes_the_explicit_path_and_says_why() -> None:
    """The library path's refusals, read from the path a CUDA call would take (no GPU needed to decide it): fla not
    installed, a head size its kernel does not take; a layer with another logit term besides PaTH has no library
    kernel (fla's kernel adds a gate only), and neither has stick-breaking."""
    cuda = torch.device("cuda")
    path, reason = posattn.SelfAttention(64, 4, causal=True, path_attention=True).path(False, cuda, decoding=False)
    assert path == EXPLICIT and "flash-linear-attention is not installed (pip install \".[fla]\")" in reason
    assert "heads of 16/32/64/128" in layer().library_term.library_refusal(cuda, torch.float32)  # heads of 8
    assert posattn.SelfAttention(64, 4, causal=True, path_attention=True, forget_gate=True).library_term is not None
    assert posattn.SelfAttention(64, 4, causal=True, path_attention=True, alibi=True).library_term is None
    assert posattn.SelfAttention(64, 4, causal=True, stick_breaking=True).library_term is None
