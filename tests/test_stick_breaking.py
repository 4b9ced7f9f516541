"""Stick-breaking attention (Tan et al. 2025, section 2; ``--decoder-stick-breaking``) against the paper's stick
process written as a loop, against a float64 transcription of the authors' reference implementation, with negative
controls (softmax attention, the break run from the farthest key, the remainder dropped), in bf16 and fp16 over
long sequences, decoded step by step, composed with other methods' logit terms, and its refusals.

The shared families (tests/test_core.py, test_attention_terms.py, test_model_invariants.py, ...) run the registered
variant through padding, causality, decoding with beam reordering, checkpointing and half precision against
``reference_attention.py``'s loop of the paper's product form."""

import math
from typing import Callable, Tuple

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor

import posattn
from core_helpers import batch, build_self_attention
from posattn.attention import PositionKernel
from posattn.position_terms.registry import PositionOptionError
from posattn.position_terms.stick_breaking import StickBreaking
from reference_attention import reference_attention

HEADS, HEAD_DIM = 2, 4
#: the authors' code read for the transcription: github.com/shawntan/stickbreaking-attention at this commit
AUTHORS_COMMIT = "3147a3841b025a31d271fc8f873120ff6fa0461b"


def method(**options) -> PositionKernel:
    return posattn.position_method(HEADS, HEAD_DIM, causal=True, **options).double()


def qkv(length: int, batch_size: int = 2, dtype: torch.dtype = torch.double, scale: float = 1.5,
        seed: int = 0) -> Tuple[Tensor, Tensor, Tensor]:
    generator = torch.Generator().manual_seed(seed)
    shape = (batch_size, HEADS, length, HEAD_DIM)
    return tuple((scale * torch.randn(shape, generator=generator, dtype=torch.double)).to(dtype) for _ in range(3))


def sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x))


def stick_process(logits: Tensor, nearest_first: bool = True, remainder: bool = True) -> Tensor:
    """The paper's process for one head's L x L logits, query by query: a stick of length 1, broken over the earlier
    keys from the nearest (or, as a negative control, the farthest) one; each key takes sigmoid(z) of what is left;
    what is left at the end goes to the query's own key (or is dropped)."""
    L = logits.size(0)
    weights = torch.zeros(L, L, dtype=torch.double)
    for i in range(L):
        left = 1.0
        for j in (range(i - 1, -1, -1) if nearest_first else range(i)):
            weights[i, j] = left * sigmoid(float(logits[i, j]))
            left -= float(weights[i, j])
        weights[i, i] = left if remainder else 0.0
    return weights


def loop_attention(q: Tensor, k: Tensor, v: Tensor, **process) -> Tensor:
    """``(length, head_dim)`` outputs of one sentence and head from its unscaled ``q, k, v`` and the stick process."""
    logits = q @ k.t() / math.sqrt(q.size(-1))
    return stick_process(logits, **process) @ v


def per_sentence(q: Tensor, k: Tensor, v: Tensor, mask: Tensor, attention: Callable[..., Tensor], **process) -> Tensor:
    """``attention`` on each sentence's real tokens alone, zero at pads: ``(batch, heads, length, head_dim)``."""
    out = torch.zeros_like(q)
    for b in range(q.size(0)):
        real = ~mask[b]
        for h in range(q.size(1)):
            out[b, h, real] = attention(q[b, h, real], k[b, h, real], v[b, h, real], **process)
    return out


def padding_mask(side: str, lengths=(7, 4)) -> Tensor:
    mask = torch.zeros(len(lengths), max(lengths), dtype=torch.bool)
    for b, n in enumerate(lengths):
        if side == "left":
            mask[b, : max(lengths) - n] = True
        else:
            mask[b, n:] = True
    return mask


@pytest.mark.parametrize("side", ["left", "right"])
def test_each_sentence_gets_the_papers_stick_process(side):
    """Outputs and weights of a padded batch = the stick process of each sentence alone, in fp64; no weight on a pad;
    every row of weights sums to 1 (the remainder on the query's own key)."""
    mask = padding_mask(side)
    q, k, v = qkv(mask.size(1))
    out, weights = posattn.position_attention(q, k, v, method(stick_breaking=True), padding_mask=mask, causal=True,
                                              need_weights=True)
    expected = per_sentence(q, k, v, mask, loop_attention)
    real = ~mask[:, None, :, None]
    assert (out - expected).masked_fill(~real, 0).abs().max() < 1e-12
    for b in range(mask.size(0)):
        keep = ~mask[b]
        assert not weights[b][:, keep][:, :, ~keep].any()
        torch.testing.assert_close(weights[b][:, keep].sum(-1), torch.ones(HEADS, int(keep.sum()), dtype=torch.double))


def authors_stickbreaking(q: Tensor, k: Tensor, v: Tensor, mask: Tensor, cum_weight: Tensor) -> Tuple[Tensor, Tensor]:
    """A float64 transcription of ``stickbreaking(q, k, v, mask, cum_weight)`` in the authors'
    ``stickbreaking_attention/sb_ref.py`` (:data:`AUTHORS_COMMIT`): log sigmoid of the logits, -1e5 where masked;
    log sigmoid of their negation, 0 where masked, summed over the later keys by a product with a strictly lower
    triangular matrix; returns the output and the remainder ``1 - sum_j A_ij``."""
    logits = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    log_z = F.logsigmoid(logits).masked_fill(mask, -1e5)
    log_beta = F.logsigmoid(-logits).masked_fill(mask, 0)
    re_cum_log_beta = torch.einsum("bhij,jk->bhik", log_beta, cum_weight.to(log_beta))
    att = (log_z + re_cum_log_beta).exp()
    return att @ v, 1 - att.sum(dim=-1)


def authors_forward(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """The authors' ``ref_fwd`` (``tests/test_attn.py``, :data:`AUTHORS_COMMIT`) with their kernel's default
    ``attend_current=False``: the keys before the query (mask ``triu(0)``), the later keys summed (``tril(-1)``),
    and the remainder times the query's own value added to the output."""
    length = q.size(2)
    cum_weight = torch.ones(length, length, dtype=q.dtype).tril(-1)
    mask = torch.ones(length, length).triu(0).bool()
    out, remainder = authors_stickbreaking(q, k, v, mask, cum_weight)
    return out + remainder[..., None] * v


def test_equals_the_authors_reference_implementation_with_gradients():
    q, k, v = (t.requires_grad_() for t in qkv(33, scale=2.0))
    ours = posattn.position_attention(q, k, v, method(stick_breaking=True), causal=True)
    theirs = authors_forward(q, k, v)
    assert (ours - theirs).abs().max() < 1e-12
    upstream = torch.randn(ours.shape, generator=torch.Generator().manual_seed(3), dtype=torch.double)
    for a, b in zip(torch.autograd.grad(ours, (q, k, v), upstream), torch.autograd.grad(theirs, (q, k, v), upstream)):
        assert (a - b).abs().max() < 1e-11


def test_negative_controls_differ():
    """The checks above can fail: softmax attention, the stick broken from the farthest key and the remainder
    dropped (flash-linear-attention's layer drops it) each give other outputs on the same batch."""
    mask = padding_mask("right")
    q, k, v = qkv(mask.size(1))
    ours = posattn.position_attention(q, k, v, method(stick_breaking=True), padding_mask=mask, causal=True)
    softmax = posattn.position_attention(q, k, v, method(), padding_mask=mask, causal=True)
    farthest_first = per_sentence(q, k, v, mask, loop_attention, nearest_first=False)
    dropped = per_sentence(q, k, v, mask, loop_attention, remainder=False)
    real = ~mask[:, None, :, None]
    for other in (softmax, farthest_first, dropped):
        assert (ours - other).masked_fill(~real, 0).abs().max() > 0.1


def test_the_written_out_gradient_equals_finite_differences_and_keeps_two_tensors():
    """The backward of the break (StickBreaking) against finite differences, on logits with keys hidden as pads and
    the future are (whole rows of them too), and what autograd keeps of it: the logits in their dtype and the fp32
    weights (6 bytes per entry in bf16, where autograd through the fp32 steps kept 20)."""
    length = 6
    distances = torch.arange(length)[:, None] - torch.arange(length)[None, :]
    hidden = (distances < 0) | (torch.rand(1, HEADS, length, length, generator=torch.Generator().manual_seed(2)) < 0.3)
    hidden[0, 0, 1] = True
    logits = torch.randn(1, HEADS, length, length, dtype=torch.double).masked_fill(hidden, float("-inf"))
    assert torch.autograd.gradcheck(lambda z: StickBreaking.apply(z, distances > 0, distances == 0),
                                    (logits.requires_grad_(),))
    length = 256
    distances = torch.arange(length)[:, None] - torch.arange(length)[None, :]
    logits = torch.randn(1, HEADS, length, length, dtype=torch.bfloat16, requires_grad=True)
    masked = logits.masked_fill(distances < 0, float("-inf"))
    kept = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: kept.append(t) or t, lambda t: t):
        StickBreaking.apply(masked, distances > 0, distances == 0)
    per_layer = sum(t.numel() * t.element_size() for t in kept if t.dtype != torch.bool)
    assert per_layer == masked.numel() * (2 + 4)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_is_finite_and_close_over_long_sequences(dtype):
    """1,024 tokens whose logits run from -30 to +40 (sticks broken at the nearest key, and sticks kept past many
    keys): the log-space break in fp32 gives finite outputs and gradients, close to fp32's on the same rounded
    inputs."""
    q, k, v = qkv(1024, batch_size=1, dtype=dtype, scale=2.0, seed=1)
    q = q + 1.0  # a positive mean: logits from -30 to +40
    layer = posattn.position_method(HEADS, HEAD_DIM, causal=True, stick_breaking=True)
    inputs = [t.detach().requires_grad_() for t in (q, k, v)]
    out = posattn.position_attention(*inputs, layer.to(dtype), causal=True)
    out.float().square().sum().backward()
    expected = posattn.position_attention(*(t.float() for t in (q, k, v)), layer.float(), causal=True)
    assert torch.isfinite(out).all() and all(torch.isfinite(t.grad).all() for t in inputs)
    assert (out.float() - expected).abs().max() <= 0.02 * expected.abs().max()


@pytest.mark.parametrize("side", ["left", "right"])
@torch.no_grad()
def test_decoding_step_by_step_equals_the_full_pass(side):
    """A prompt of 3 tokens, then one token a step with a DecodingCache of the keys and values alone: each step's row
    over the cached keys is the full pass's row."""
    mask = padding_mask(side, lengths=(7, 5))
    q, k, v = qkv(mask.size(1))
    layer = method(stick_breaking=True)
    full = posattn.position_attention(q, k, v, layer, padding_mask=mask, causal=True)
    cache = posattn.DecodingCache()
    steps = [posattn.position_attention(q[:, :, :3], k[:, :, :3], v[:, :, :3], layer, padding_mask=mask[:, :3],
                                        causal=True, cache=cache)]
    for t in range(3, mask.size(1)):
        steps.append(posattn.position_attention(q[:, :, t:t + 1], k[:, :, t:t + 1], v[:, :, t:t + 1], layer,
                                                padding_mask=mask[:, t:t + 1], causal=True, cache=cache))
    assert set(cache.state) == {"prev_key", "prev_value"}
    real = ~mask[:, None, :, None]
    assert (torch.cat(steps, dim=2) - full).masked_fill(~real, 0).abs().max() < 1e-12


@pytest.mark.parametrize("others", [{"alibi": True}, {"forget_gate": True, "rotary": True}, {"cope": 4},
                                    {"multi_token_attention": True, "mta_query_kernel": 2, "mta_key_kernel": 3,
                                     "mta_head_group": 1}, {"path_attention": True}])
@torch.no_grad()
def test_other_methods_logit_terms_compose_before_the_break(others):
    """ALiBi, FoX with RoPE, CoPE, MTA's key-query convolution, PaTH: their logits, then the break, = the
    loop-by-loop equations."""
    attn = build_self_attention({"stick_breaking": True, **others}, causal=True)
    x, mask = batch("left")
    x = x.transpose(0, 1).contiguous()
    out = attn(x, padding_mask=mask)
    for b in range(x.size(0)):
        real = ~mask[b]
        expected, _ = reference_attention(attn, x[b, real], causal=True)
        torch.testing.assert_close(out[b, real], expected, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("options,message", [
    ({"conv_attention": "2d"}, "--decoder-stick-breaking replaces the softmax whose matrix --decoder-conv-attention"),
    ({"multi_token_attention": True}, "whose weights --decoder-multi-token-attention mixes across heads; add "
                                      "--decoder-mta-head-group 1"),
    ({"attention_kernel": "flex"}, "--decoder-attention-kernel flex: --decoder-stick-breaking"),
])
def test_compositions_without_a_meaning_are_refused_naming_the_flags(options, message):
    with pytest.raises(PositionOptionError, match=message):
        posattn.position_options(True, stick_breaking=True, **options)


def test_a_bidirectional_side_is_refused_in_one_line():
    with pytest.raises(posattn.UserError, match="stick-breaking .* is causal-only") as refused:
        posattn.position_options(False, stick_breaking=True)
    assert "\n" not in str(refused.value)
