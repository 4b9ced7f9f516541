"""The SDPA path's forms (``PositionKernel.sdpa_form`` in posattn/attention.py): SDPA's causal kernel without a mask
on a causal full pass of a batch known to hold no pad, no mask where every key is seen, the bottom-right causal
boolean mask for several queries after cached keys, a boolean mask on a padded batch, and a float mask where a
layer adds biases, its parameter-free part summed once per batch. Each form equals the explicit path (fp64,
outputs and gradients) for no method and every registered variant whose layer takes the SDPA path, the forms of a
call are observed by a recording wrapper around ``torch.nn.functional.scaled_dot_product_attention`` that calls
the real one, and each form is self-checked on its first use (a wrong causal kernel is caught)."""

import logging
from typing import List, Optional

import pytest
import torch

import posattn
from core_helpers import E, H, VARIANTS, AllAtOnce, applies, build_self_attention, side_rows
from posattn.attention import BOOLEAN_MASK, FLOAT_MASK, IS_CAUSAL, NO_MASK, SDPA, MaskedBiases
from posattn.kernel_self_check import FusedKernelMismatch, forget_verdicts
from posattn.position_context import BlockedBias, CausalMask, IndexDifferences, VisibleEntries

CPU = torch.device("cpu")
REAL_SDPA = torch.nn.functional.scaled_dot_product_attention


def takes_sdpa(values: dict, causal: bool) -> bool:
    """The layer of ``values`` takes the SDPA path in a CPU training step."""
    return build_self_attention(values, causal).train().path(False, CPU, decoding=False)[0] == SDPA


def mask_free(values: dict, causal: bool) -> bool:
    """The layer of ``values`` changes no logit (projection scalings and query/key transforms only)."""
    return not build_self_attention(values, causal).score_terms()


#: no method, and every registered variant
METHODS = {"no-method": {}, **{name: values for name, values in VARIANTS.items() if not isinstance(values, AllAtOnce)}}
#: the ones (on each side that takes them) whose layer takes the SDPA path
CASES = [(name, causal) for name, values in METHODS.items() for causal in (True, False)
         if applies(values, causal) and takes_sdpa(values, causal)]
#: of those, the ones whose terms need no mask
MASK_FREE = [(name, causal) for name, causal in CASES if mask_free(METHODS[name], causal)]
#: a pad-free full pass; decoding with a cache (a prompt of 3, one token, 3 tokens, one token); padded batches
SHAPES = {True: ["full", "decoding", "right", "left"], False: ["full", "right", "left"]}
#: the forms each shape's calls take without a bias (a layer with one takes the float mask throughout)
FORMS = {(True, "full"): [IS_CAUSAL], (True, "decoding"): [IS_CAUSAL, NO_MASK, BOOLEAN_MASK, NO_MASK],
         (False, "full"): [NO_MASK], **{(causal, padding): [BOOLEAN_MASK] for causal in (True, False)
                                        for padding in ("right", "left")}}
STEPS = (3, 1, 3, 1)


class Recorder:
    """Stands where the kernel calls ``torch.nn.functional.scaled_dot_product_attention``, notes how it was
    called, and calls the real one (``shift``: what it adds to the output where ``is_causal`` is set, to play a
    wrong causal kernel)."""

    def __init__(self, shift: float = 0.0):
        self.calls: List[tuple] = []
        self.shift = shift

    def __call__(self, q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, **kwargs):
        self.calls.append((q.size(2), k.size(2), is_causal, attn_mask))
        out = REAL_SDPA(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal, scale=scale, **kwargs)
        return out + self.shift if is_causal else out

    def forms(self) -> List[str]:
        return [form_of(is_causal, mask) for _, _, is_causal, mask in self.calls]


def form_of(is_causal: bool, mask: Optional[torch.Tensor]) -> str:
    if is_causal:
        return IS_CAUSAL
    if mask is None:
        return NO_MASK
    return BOOLEAN_MASK if mask.dtype == torch.bool else FLOAT_MASK


@pytest.fixture
def recorder(monkeypatch) -> Recorder:
    recording = Recorder()
    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", recording)
    return recording


def inputs(shape: str):
    """``(batch, length, E)`` fp64 inputs that need their gradient, and the padding mask of ``shape`` (None: the
    call gives none)."""
    generator = torch.Generator().manual_seed(4)
    x = torch.randn(3, sum(STEPS), E, generator=generator, dtype=torch.double).requires_grad_()
    if shape in ("full", "decoding"):
        return x, None
    mask = torch.zeros(3, sum(STEPS), dtype=torch.bool)
    if shape == "right":
        mask[1, 5:], mask[2, 7:] = True, True
    else:
        mask[1, :3], mask[2, :1] = True, True
    return x, mask


def run(attn: posattn.SelfAttention, x: torch.Tensor, mask: Optional[torch.Tensor], shape: str) -> torch.Tensor:
    """The layer on ``x``: a full forward, or (``decoding``) the steps of :data:`STEPS` with one cache."""
    rows = {} if mask is None else side_rows(mask)
    if shape != "decoding":
        return attn(x, padding_mask=mask, side_data=rows)
    cache, start, outputs = posattn.DecodingCache(), 0, []
    for step in STEPS:
        outputs.append(attn(x[:, start:start + step], cache=cache))
        start += step
    return torch.cat(outputs, dim=1)


def outputs_and_gradients(attn: posattn.SelfAttention, shape: str):
    x, mask = inputs(shape)
    out = run(attn, x, mask, shape)
    weights = torch.randn(out.shape, generator=torch.Generator().manual_seed(5), dtype=out.dtype)
    gradients = torch.autograd.grad((out * weights).sum(), [x, *attn.parameters()], allow_unused=True)
    return out, [torch.zeros_like(p) if g is None else g for g, p in zip(gradients, [x, *attn.parameters()])]


@pytest.mark.parametrize("variant,causal,shape", [(name, causal, shape) for name, causal in CASES
                                                  for shape in SHAPES[causal]])
def test_each_form_equals_the_explicit_path_with_its_gradients(variant, causal, shape, recorder):
    values = METHODS[variant]
    fused = build_self_attention(values, causal).train()
    explicit = build_self_attention(values, causal, attention_kernel="explicit").train()
    outputs_and_gradients(fused, shape)  # the first use of each form: its self-check
    recorder.calls.clear()
    got, got_gradients = outputs_and_gradients(fused, shape)
    expected, expected_gradients = outputs_and_gradients(explicit, shape)
    assert recorder.forms() == (FORMS[causal, shape] if (variant, causal) in MASK_FREE
                                else [FLOAT_MASK] * len(FORMS[causal, shape]))
    assert torch.isfinite(expected).all()
    torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-12)
    for got_gradient, expected_gradient in zip(got_gradients, expected_gradients):
        torch.testing.assert_close(got_gradient, expected_gradient, rtol=1e-12, atol=1e-12)


def test_without_a_method_a_causal_full_forward_is_sdpas_causal_kernel_without_a_mask(recorder):
    """The vanilla layer of a plain PyTorch model: ``scaled_dot_product_attention(q, k, v, is_causal=True)``, nothing
    else; the same with a padding mask (even one of no pad, which would take a synchronisation to read) takes a
    boolean mask."""
    attn = posattn.SelfAttention(64, 4, causal=True)
    x = torch.randn(2, 50, 64)
    attn(x)  # its first use: the self-check too
    recorder.calls.clear()
    attn(x)
    (call,) = recorder.calls
    assert call[:3] == (50, 50, True) and call[3] is None
    recorder.calls.clear()
    attn(x, padding_mask=torch.zeros(2, 50, dtype=torch.bool))
    assert recorder.forms()[-1] == BOOLEAN_MASK


def test_a_context_built_without_a_padding_mask_keeps_every_layer_on_the_causal_kernel(recorder):
    """A model's layers sharing ``batch_context(None, ...)`` (RoPE: a query/key transform) run SDPA's causal kernel,
    and the batch builds no mask and no (length x length) distances at all."""
    options = posattn.position_options(True, rotary=True)
    layers = [posattn.SelfAttention(32, 4, causal=True, options=options, layer_index=i) for i in range(3)]
    x = torch.randn(2, 20, 32)
    layers[0](x)  # the first use: the self-check
    recorder.calls.clear()
    context = posattn.batch_context(None, True, 20, x.device)
    for layer in layers:
        x = x + layer(x, context=context)
    assert recorder.forms() == [IS_CAUSAL] * 3
    built = (CausalMask, VisibleEntries, BlockedBias, MaskedBiases, IndexDifferences)
    assert context.distances is None and not [key for key in context.memo if isinstance(key, built)]


def two_layers(values: dict) -> List[posattn.SelfAttention]:
    """Two causal layers of one model with the method of ``values``."""
    options = posattn.position_options(True, max_positions=16, **values)
    return [posattn.SelfAttention(E, H, causal=True, options=options, layer_index=i).train() for i in range(2)]


def biases_of(values: dict) -> Optional[str]:
    """``parameter-free`` where both layers of :func:`two_layers` add biases and every one declares its prepared
    form, ``learned`` where both add biases and one is computed in the call, else None (the layers add none, or
    one layer only)."""
    layers = two_layers(values)
    if not all(layer.additive_terms or layer.token_difference_terms for layer in layers):
        return None
    prepared = all(term.prepared_bias(4, 4) is not None for term in layers[0].additive_terms)
    return "parameter-free" if prepared and not layers[0].token_difference_terms else "learned"


#: the causal variants that take the SDPA path with biases in every layer, and how their biases are built
BIASED = {name: kind for name, causal in CASES if causal and (kind := biases_of(METHODS[name])) is not None}


@pytest.mark.parametrize("variant", sorted(BIASED))
def test_the_float_masks_batch_part_is_built_once_for_every_layer(variant, recorder):
    """Two layers sharing the batch's context: a parameter-free bias and the masks are one tensor, handed to
    both layers' SDPA (the bias is not summed per layer); a learned bias is added per layer to the batch's
    mask of blocked entries, built once."""
    layers = two_layers(VARIANTS[variant])
    x, mask = torch.randn(3, 12, E), torch.zeros(3, 12, dtype=torch.bool)
    mask[1, 9:] = True
    context = posattn.batch_context(mask, True, side_data=side_rows(mask))
    for layer in layers:
        layer(x, context=context).sum().backward()
    first, second = (call[3] for call in recorder.calls[-2:])
    assert recorder.forms()[-2:] == [FLOAT_MASK, FLOAT_MASK]
    assert len([key for key in context.memo if isinstance(key, MaskedBiases)]) == 1
    if BIASED[variant] == "parameter-free":
        assert first is second and not first.requires_grad
    else:
        assert first is not second and first.requires_grad


def test_each_new_form_is_self_checked_on_its_first_use(caplog):
    forget_verdicts()
    attn = posattn.SelfAttention(32, 4, causal=True).train()
    x = torch.randn(2, 9, 32)
    with caplog.at_level(logging.INFO, logger="posattn.kernel_self_check"):
        run(attn, x, None, "decoding")
        attn(x, padding_mask=torch.zeros(2, 9, dtype=torch.bool))
    passed = [record.getMessage() for record in caplog.records if "self-check passed" in record.getMessage()]
    assert [message.split(": ")[1].split(" against")[0] for message in passed] == [
        "the sdpa (is_causal) kernel", "the sdpa (no mask) kernel", "the sdpa (boolean mask) kernel",
        "the sdpa (boolean mask) kernel"]
    assert "(float32, causal, no pads, training" in passed[0]
    assert "no pads, the last token's query" in passed[1] and "no pads, queries after cached keys" in passed[2]
    assert "causal, left-padded, training" in passed[3]  # a padding mask of any side: positions from it
    forget_verdicts()


def test_a_wrong_causal_kernel_is_caught_by_the_self_check(monkeypatch, caplog):
    """A causal kernel whose values are off (played by a wrapper that shifts the real one's output): one warning,
    and the layer computes the explicit path's numbers; ``error`` stops instead. Negative control: the same layer
    with the real kernel passes (:func:`test_each_new_form_is_self_checked_on_its_first_use`)."""
    forget_verdicts()
    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", Recorder(shift=0.1))
    attn = posattn.SelfAttention(32, 4, causal=True).double().train()
    explicit = posattn.SelfAttention(32, 4, causal=True, attention_kernel="explicit").double().train()
    explicit.load_state_dict(attn.state_dict())
    x = torch.randn(2, 9, 32, dtype=torch.double)
    with caplog.at_level(logging.WARNING, logger="posattn.kernel_self_check"):
        got = attn(x)
    (warning,) = [record.getMessage() for record in caplog.records]
    assert "the sdpa (is_causal) kernel against the explicit path (float64, causal, no pads, training" in warning
    assert "disagrees" in warning
    torch.testing.assert_close(got, explicit(x), rtol=0, atol=0)
    forget_verdicts()
    strict = posattn.SelfAttention(32, 4, causal=True, attention_self_check="error").double().train()
    with pytest.raises(FusedKernelMismatch, match=r"sdpa \(is_causal\) kernel"):
        strict(x)
    forget_verdicts()
