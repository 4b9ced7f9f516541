"""The library on its own (``posattn``, torch alone): every registered variant through
:class:`posattn.SelfAttention` and :func:`posattn.position_attention` holds the invariants the fairseq plugin's
tests prove through fairseq (the reference equations, padding, causality, decoding = full forward with beam
reordering, every kernel path equal with gradients, checkpointed gradients, half precision), the options built
from Python are the command line's, and one layer's state dict is the same in both front-ends.

These tests import neither fairseq nor transformers: ``tests/test_core_install.py`` runs them in an environment
with torch alone (``pytest --noconftest``). The structural variants' reference reads the fairseq front-end's tree
functions and skips there."""

import importlib.util
import re

import pytest
import torch
from torch.utils.checkpoint import checkpoint

import posattn
from core_helpers import E, H, T_MAX, VARIANTS, batch, build_self_attention, on_side, reads_side_data, \
    side_cases, side_rows
from posattn.attention import SDPA
from posattn.position_options import SidePositionOptions, side_defaults
from posattn.position_terms.registry import methods_of
from reference_attention import randomize_, reference_attention

HAS_FAIRSEQ = importlib.util.find_spec("fairseq") is not None
BOTH_SIDES = [(False, "left"), (False, "right"), (True, "right"), (True, "left")]
CAUSAL = [(True, "right"), (True, "left")]


def batch_first(padding: str, lengths=(7, 4, 5)):
    """``(batch, length, E)`` fp64 inputs and their ``(batch, length)`` padding mask (all False: none)."""
    x, mask = batch(padding, lengths)
    x = x.transpose(0, 1).contiguous()
    return x, (torch.zeros(x.shape[:2], dtype=torch.bool) if mask is None else mask)


def attend(attn: posattn.SelfAttention, x: torch.Tensor, mask: torch.Tensor, **kwargs):
    return attn(x, padding_mask=mask, side_data=side_rows(mask), **kwargs)


@pytest.mark.parametrize("variant,causal,padding", side_cases(VARIANTS, BOTH_SIDES))
@torch.no_grad()
def test_every_variant_equals_the_reference_under_any_padding(variant, causal, padding):
    """Each sentence's real tokens, padded left or right in a batch, get what the loop-by-loop equations give
    the sentence alone: outputs and weights, no weight on a pad."""
    if reads_side_data(VARIANTS[variant], causal) and not HAS_FAIRSEQ:
        pytest.skip("the structural reference reads the fairseq front-end's tree functions")
    attn = build_self_attention(VARIANTS[variant], causal)
    x, mask = batch_first(padding)
    out, weights = attend(attn, x, mask, need_weights=True)
    for b in range(x.size(0)):
        real = ~mask[b]
        ref_out, ref_probs = reference_attention(attn, x[b, real], causal)
        torch.testing.assert_close(out[b, real], ref_out, rtol=1e-9, atol=1e-9)
        torch.testing.assert_close(weights[b][:, real][:, :, real], ref_probs, rtol=1e-9, atol=1e-9)
        assert not weights[b][:, real][:, :, ~real].any()


@pytest.mark.parametrize("variant,causal,padding", side_cases(VARIANTS, [(False, "left"), *CAUSAL]))
def test_every_kernel_path_gives_the_same_outputs_and_gradients(variant, causal, padding):
    """The path the terms choose (SDPA where they allow it) and the explicit one: equal outputs, and equal
    finite gradients of the input and of every parameter (a left-padded causal batch too, whose first padded
    rows see no real key); flex_attention (unfused on the CPU, no backward) equal outputs where every term has
    a pointwise form."""
    attn = build_self_attention(VARIANTS[variant], causal)
    x, mask = batch_first(padding)
    real = ~mask

    def run(kernel: str):
        inputs = x.clone().requires_grad_()
        out = posattn.position_attention(*projected(attn, inputs), attn, padding_mask=mask, x=inputs,
                                         side_data=side_rows(mask), kernel=kernel)
        out = out.transpose(1, 2)[real]
        grads = torch.autograd.grad(out.sum(), [inputs, *attn.parameters()], allow_unused=True)
        return out, [g for g in grads if g is not None]

    (auto, auto_grads), (explicit, explicit_grads) = run("auto"), run("explicit")
    torch.testing.assert_close(auto, explicit)
    for got, expected in zip(auto_grads, explicit_grads):
        torch.testing.assert_close(got, expected)
        assert torch.isfinite(expected).all()
    if attn.pointwise:
        with torch.no_grad():
            flex = posattn.position_attention(*projected(attn, x), attn, padding_mask=mask, x=x,
                                              side_data=side_rows(mask), kernel="flex")
        torch.testing.assert_close(flex.transpose(1, 2)[real], explicit.detach())


def projected(attn: posattn.SelfAttention, x: torch.Tensor):
    """``q, k, v`` ``(batch, heads, length, head_dim)`` of ``x`` by ``attn``'s projections (unscaled)."""
    q_w, k_w, v_w = attn.scale_projections(attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight)
    batch, length, _ = x.shape
    return [torch.nn.functional.linear(x, w, p.bias).view(batch, length, H, E // H).transpose(1, 2)
            for w, p in ((q_w, attn.q_proj), (k_w, attn.k_proj), (v_w, attn.v_proj))]


@pytest.mark.parametrize("variant,causal,padding", side_cases(VARIANTS, CAUSAL))
@torch.no_grad()
def test_a_causal_layer_never_reads_later_tokens(variant, causal, padding):
    attn = build_self_attention(VARIANTS[variant], causal)
    x, mask = batch_first(padding, lengths=(7, 7))
    changed = x.clone()
    changed[:, 4:] += 10.0
    torch.testing.assert_close(attend(attn, x, mask)[:, :4], attend(attn, changed, mask)[:, :4])


@pytest.mark.parametrize("variant,causal,padding", side_cases(VARIANTS, CAUSAL))
@torch.no_grad()
def test_decoding_with_the_cache_equals_the_full_forward_through_a_beam_reordering(variant, causal, padding):
    """A prompt of 3 tokens, then one token a step with a :class:`posattn.DecodingCache`, the hypotheses reordered
    after the fifth token as beam search reorders them: every step's output equals the full forward's row."""
    attn = build_self_attention(VARIANTS[variant], causal)
    x, mask = batch_first(padding, lengths=(7, 5, 6))
    order = torch.tensor([2, 0, 0])
    x_after, mask_after = x[order], mask[order]
    full_before, full_after = attend(attn, x, mask), attend(attn, x_after, mask_after)
    cache = posattn.DecodingCache()
    out = attend(attn, x[:, :3], mask[:, :3], cache=cache)
    torch.testing.assert_close(out[~mask[:, :3]], full_before[:, :3][~mask[:, :3]])
    for step in range(3, x.size(1)):
        if step == 5:
            cache.reorder(order)
        source, padding_mask, full = (x, mask, full_before) if step < 5 else (x_after, mask_after, full_after)
        out = attend(attn, source[:, step:step + 1], padding_mask[:, step:step + 1], cache=cache)
        real = ~padding_mask[:, step]
        torch.testing.assert_close(out[real, 0], full[real, step])
    assert cache.length == x.size(1)


@pytest.mark.parametrize("variant,causal,padding", side_cases(VARIANTS, [(False, "left"), (True, "right")]))
def test_checkpointed_gradients_equal_the_plain_ones(variant, causal, padding):
    attn = build_self_attention(VARIANTS[variant], causal).train()
    x, mask = batch_first(padding)
    rows = side_rows(mask)

    def gradients(checkpointed: bool):
        inputs = x.clone().requires_grad_()
        if checkpointed:
            out = checkpoint(attn, inputs, mask, None, None, rows, use_reentrant=False)
        else:
            out = attn(inputs, mask, side_data=rows)
        out[~mask].sum().backward()
        grads = [inputs.grad, *(p.grad.clone() for p in attn.parameters() if p.grad is not None)]
        attn.zero_grad(set_to_none=True)
        return grads

    for got, expected in zip(gradients(True), gradients(False)):
        torch.testing.assert_close(got, expected)


@pytest.mark.parametrize("variant,causal,padding", side_cases(VARIANTS, [(False, "left"), (True, "right")]))
def test_bf16_is_finite_and_close_to_fp32(variant, causal, padding):
    attn = build_self_attention(VARIANTS[variant], causal).float()
    x, mask = batch_first(padding)
    x = x.float()
    expected = attend(attn, x, mask)[~mask]
    attn_bf16 = attn.to(torch.bfloat16)
    inputs = x.to(torch.bfloat16).requires_grad_()
    out = attend(attn_bf16, inputs, mask)[~mask]
    out.float().sum().backward()
    assert torch.isfinite(out).all() and torch.isfinite(inputs.grad).all()
    assert all(torch.isfinite(p.grad).all() for p in attn_bf16.parameters() if p.grad is not None)
    assert (out.float() - expected).abs().max() <= 0.1 * expected.abs().max() + 0.05


def test_the_keywords_are_the_command_lines_options_with_their_defaults():
    """One source: every registered option of a side is a keyword of ``position_options``, named as the
    command-line option without its side, with the same default."""
    for causal, side in ((False, "encoder"), (True, "decoder")):
        options = posattn.position_options(causal)
        names = {option.name for method in methods_of(side) for option in method.options}
        assert names <= set(options.values) and options.values == side_defaults(side)
        assert not options.methods()


def test_a_combination_the_command_line_refuses_is_refused_with_its_message():
    """The command line's validation itself: its message names the flag (``fairseq-train`` prints the same)."""
    with pytest.raises(posattn.PositionOptionError) as refused:
        posattn.position_options(True, direct_position_init="zero")
    assert str(refused.value).startswith("--decoder-direct-position-init zero has no effect without")
    with pytest.raises(TypeError, match="is causal-only"):
        posattn.position_options(False, forget_gate=True)


def test_layers_built_from_one_options_share_a_side_wide_table_registered_once():
    options = posattn.position_options(True, T_MAX, t5_relative_bias=8, t5_max_distance=16)
    layers = torch.nn.ModuleList(posattn.SelfAttention(E, H, causal=True, options=options, layer_index=i)
                                 for i in range(3))
    tables = [name for name, _ in layers.named_parameters() if "position_shared" in name]
    assert tables == ["0.position_shared.t5_table.weight"]
    assert layers[1].additive_terms[0].side_modules()[0] is layers[0].position_shared["t5_table"]


@pytest.mark.skipif(not HAS_FAIRSEQ, reason="compares with the fairseq front-end, which is not installed")
@pytest.mark.parametrize("variant,causal,padding", side_cases(VARIANTS, [(False, "left"), (True, "right")]))
@torch.no_grad()
def test_the_fairseq_attention_has_the_same_state_dict_and_computes_the_same(variant, causal, padding):
    from core_helpers import context
    from fairseq_posattn.modules.attention import PositionAwareMultiheadAttention

    ours = build_self_attention(VARIANTS[variant], causal)
    options = posattn.position_options(causal, T_MAX, **on_side(VARIANTS[variant], causal))
    theirs = PositionAwareMultiheadAttention(E, H, options.build_terms(0, H, E // H)).double().eval()
    state = {name: value for name, value in ours.state_dict().items() if not name.startswith("position_shared.")}
    theirs.load_state_dict(state, strict=True)
    for name, module in options.shared.items():
        module.double().load_state_dict(ours.position_shared[name].state_dict())
    x, mask = batch_first(padding)
    time_first = x.transpose(0, 1)
    attn_mask = torch.triu(torch.full((x.size(1),) * 2, float("-inf"), dtype=x.dtype), 1) if causal else None
    expected, _ = theirs(time_first, time_first, time_first, key_padding_mask=context(mask, time_first, causal),
                         attn_mask=attn_mask, need_weights=False)
    torch.testing.assert_close(attend(ours, x, mask)[~mask], expected.transpose(0, 1)[~mask])


def test_a_sequence_longer_than_t_is_refused_naming_max_positions():
    attn = posattn.SelfAttention(E, H, causal=True, max_positions=4, direct_position="absolute")
    with pytest.raises(posattn.UserError, match="max_positions"):
        attn(torch.randn(1, 5, E))


def test_a_causal_method_on_a_bidirectional_call_is_refused():
    method = posattn.position_method(H, E // H, causal=True, alibi=True)
    q = torch.randn(1, H, 3, E // H)
    with pytest.raises(ValueError, match="causal"):
        posattn.position_attention(q, q, q, method, causal=False)


def test_the_function_equals_sdpa_without_a_method():
    """No option on: ``position_attention`` is ``scaled_dot_product_attention``, padding and causality
    included."""
    method = posattn.position_method(H, E // H, causal=True)
    q, k, v = torch.randn(3, 2, H, 6, E // H).unbind(0)
    mask = torch.zeros(2, 6, dtype=torch.bool)
    mask[1, 4:] = True
    allowed = torch.ones(6, 6, dtype=torch.bool).tril()[None, None] & ~mask[:, None, None, :]
    expected = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=allowed)
    got = posattn.position_attention(q, k, v, method, padding_mask=mask)
    torch.testing.assert_close(got[0], expected[0])
    torch.testing.assert_close(got[1, :, :4], expected[1, :, :4])
    assert method.path(False, q.device, False)[0] == SDPA


@pytest.mark.parametrize("variant", ["alibi", "t5-bias"])
def test_a_left_padded_causal_layer_in_training_passes_its_self_check(variant, caplog):
    """The fused path's self-check on the batch shaped as the call's (causal, left padding, training): its
    padded first rows see no real key, and every path stays finite and equal."""
    from posattn.kernel_self_check import forget_verdicts

    forget_verdicts()
    attn = build_self_attention(VARIANTS[variant], causal=True).float().train()
    x, mask = batch_first("left")
    with caplog.at_level("INFO", logger="posattn.kernel_self_check"):
        attend(attn, x.float(), mask).sum().backward()
    assert "self-check passed" in caplog.text and "disagrees" not in caplog.text


#: option values that a method would take and compute nothing of positions with: the side (causal), the refused
#: values, the start of the refusal, what the layer would equal (the layer of those options with the same
#: projections; None: itself on permuted tokens, permuted back) and the accepted neighbour, position-dependent
CHANGES_NOTHING = {
    "cope-1": (True, {"cope": 1}, "--decoder-cope must be 0 (off) or a number of positions of at least 2, got 1 "
               "(one position clips every count", {}, {"cope": 2}),
    "conv-2d-kernel-1": (False, {"conv_attention": "2d", "conv_attention_kernel": 1},
                         "--encoder-conv-attention-kernel must be at least 3 with --encoder-conv-attention 2d, got 1 "
                         "(a 1 x 1 filter", None, {"conv_attention": "2d", "conv_attention_kernel": 3}),
    "fire-threshold-past-float32": (False, {"fire": True, "fire_threshold": 10 ** 39},
                                    "--encoder-fire-threshold must be at most float32's largest value (3.4e38), got "
                                    f"{10 ** 39} (an infinite threshold", {},
                                    {"fire": True, "fire_threshold": int(torch.finfo(torch.float32).max)}),
    "xpos-without-decay": (True, {"xpos": True, "xpos_scale_base": 10 ** 9},
                           f"--decoder-xpos-scale-base must leave some decay over the {T_MAX} positions of "
                           "max_positions, got 1000000000 (zeta^(n/B) rounds to 1 in float32: xPos would be RoPE",
                           {"rotary": True}, {"xpos": True, "xpos_scale_base": 10 ** 7}),
}


def unchecked_layer(values: dict, causal: bool) -> posattn.SelfAttention:
    """A float32 layer of ``values`` as it would be built were they accepted, every parameter random."""
    options = SidePositionOptions("decoder" if causal else "encoder", causal, T_MAX, "max_positions", **values)
    attn = posattn.SelfAttention(E, H, causal=causal, options=options)
    randomize_(attn)
    return attn.float().eval()


@torch.no_grad()
def distance_from_nothing(values: dict, causal: bool, same_as) -> float:
    """The largest difference between the layer of ``values`` and what computes nothing of positions (see
    :data:`CHANGES_NOTHING`), on a batch of two sentences of 7 tokens."""
    generator = torch.Generator().manual_seed(2)
    attn, x = unchecked_layer(values, causal), torch.randn(2, 7, E, generator=generator)
    if same_as is None:
        perm = torch.randperm(7, generator=generator)
        return (attn(x[:, perm]) - attn(x)[:, perm]).abs().max().item()
    other = unchecked_layer(same_as, causal)
    for name in ("q_proj", "k_proj", "v_proj", "out_proj"):
        getattr(other, name).load_state_dict(getattr(attn, name).state_dict())
    return (attn(x) - other(x)).abs().max().item()


@pytest.mark.parametrize("case", sorted(CHANGES_NOTHING))
def test_a_method_option_that_would_change_nothing_is_refused(case):
    """A value with which the method would compute nothing of positions (or be another method) is refused in one
    line saying what it would do; built anyway, the layer equals what its message says, and the accepted value
    next to it is position-dependent."""
    causal, refused, message, same_as, neighbour = CHANGES_NOTHING[case]
    with pytest.raises(posattn.PositionOptionError, match=re.escape(message)):
        posattn.position_options(causal, T_MAX, **refused)
    assert distance_from_nothing(refused, causal, same_as) < 1e-5
    assert posattn.position_options(causal, T_MAX, **neighbour).methods()
    assert distance_from_nothing(neighbour, causal, same_as) > 0


@pytest.mark.parametrize("dtype,longest", [(torch.float32, 1074), (torch.float16, 82)])
def test_a_sequence_past_the_range_of_its_key_scales_is_refused_in_one_line(dtype, longest):
    """The largest key scale of the transform with a decay, zeta_0^(-m/B), is kept a hundredth below the
    dtype's largest value: beyond, one line instead of inf and NaN; up to it, finite outputs."""
    attn = posattn.SelfAttention(E, H, causal=True, xpos=True, xpos_scale_base=16).to(dtype).eval()
    with torch.no_grad():
        assert torch.isfinite(attn(torch.randn(1, longest, E, dtype=dtype))).all()
        with pytest.raises(posattn.UserError, match=f"pass the type's range from {longest + 1} tokens on"):
            attn(torch.randn(1, longest + 1, E, dtype=dtype))
