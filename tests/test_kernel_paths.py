"""The kernel's paths (fairseq_posattn/modules/attention.py): every term's ``score_mod`` form, evaluated
densely over the whole index grid, against the explicit path's logits and their gradients (exactly, in
fp32 and fp64); each additive term's declared dense form against the one derived from its ``score_mod``;
flex_attention's CPU implementation against the explicit path; the path each layer takes."""

import logging

import pytest
import torch

from posattn.position_options import PositionOptionError, SidePositionOptions
from fairseq_posattn.modules.attention import PositionAwareMultiheadAttention
from posattn.attention import EXPLICIT, FLEX, SDPA, PositionTerms
from posattn.position_context import PositionContext, SequenceTables
from posattn.position_terms.base import AdditiveLogitBias, apply_densely
from posattn.position_terms.registry import REGISTRY
from core_helpers import COMBINED
from test_attention_terms import E, H, T_MAX, VARIANTS, AllAtOnce, applies, batch, build_attention, causal_mask, \
    context, side_cases

#: every variant whose terms all have a score_mod form, and all of them at once (keys-only Shaw)
FUSABLE = {name: values for name, values in VARIANTS.items()
           if build_attention(values, causal=not applies(values, False)).fusable()}
#: the options, in the all-at-once model, of the methods none of whose variants is fusable (they need the matrix)
MATRIX_OPTIONS = {name for method in REGISTRY.values() if not any(v in FUSABLE for v in method.variants)
                  for name in method.combined}
FUSABLE["all-fusable-at-once"] = AllAtOnce({k: v for k, v in COMBINED.items() if k not in MATRIX_OPTIONS},
                                           relative_positions_keys_only=True)
CASES = [(False, "left"), (False, "right"), (True, "right"), (True, "decoding")]
CPU, CUDA = torch.device("cpu"), torch.device("cuda")


def projected(attn, x, ctx):
    """Scaled queries and keys after the query/key transforms, as the kernel computes them."""
    q, k, _ = attn._project(x)
    for term in attn.query_key_terms:
        q, k = term(q, k, ctx)
    return q, k


def case_inputs(attn, causal: bool, padding: str, dtype: torch.dtype):
    """q, k, the context and the causal mask of a padded batch; ``decoding``: the last query only."""
    x, mask = batch("right" if padding == "decoding" else padding)
    x = x.to(dtype).requires_grad_()
    ctx = context(mask, x, causal)
    q, k = projected(attn, x, ctx)
    attn_mask = causal_mask(x.size(0)).to(dtype) if causal else None
    if padding == "decoding":
        q, attn_mask = q[:, :, -1:], None
    return x, q, k, ctx, attn_mask


@pytest.mark.parametrize("variant,causal,padding", side_cases(FUSABLE, CASES))
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_score_mod_equals_explicit_logits_and_their_gradients(variant, causal, padding, dtype):
    attn = build_attention(FUSABLE[variant], causal).to(dtype)
    x, q, k, ctx, attn_mask = case_inputs(attn, causal, padding, dtype)
    values = attn.token_values(x, ctx)
    explicit = attn.explicit_logits(q, k, ctx, attn_mask, values)
    dense = apply_densely(attn.score_mod(ctx, q, k.size(2), values), torch.matmul(q, k.transpose(-1, -2)))
    seen = torch.isfinite(explicit)
    assert seen.any() and torch.isfinite(dense).all()
    tolerance = dict(rtol=0, atol=0) if dtype == torch.float64 else dict(rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(dense[seen], explicit[seen].to(dense.dtype), **tolerance)

    weights = torch.randn(seen.shape, generator=torch.Generator().manual_seed(3), dtype=dtype)
    inputs = [x, *attn.parameters()]

    def grads(logits):
        used = torch.autograd.grad((logits[seen] * weights[seen]).sum(), inputs, retain_graph=True,
                                   allow_unused=True)
        return [torch.zeros_like(p) if g is None else g for g, p in zip(used, inputs)]
    for got, expected in zip(grads(dense), grads(explicit)):
        torch.testing.assert_close(got, expected, rtol=1e-12 if dtype == torch.float64 else 1e-5,
                                   atol=1e-12 if dtype == torch.float64 else 1e-5)


#: every registered variant with an additive term that has a pointwise form
ADDITIVE = {name: values for name, values in VARIANTS.items() if not isinstance(values, AllAtOnce)
            and any(term.has_score_mod() for term in build_attention(values, not applies(values, False)).additive_terms)}


@pytest.mark.parametrize("variant,causal,padding", side_cases(ADDITIVE, CASES))
def test_each_additive_terms_dense_form_equals_the_one_derived_from_its_score_mod(variant, causal, padding):
    """AdditiveLogitBias's rule, term by term: the dense form a term declares (its ``forward``) is the one
    derived from its ``score_mod`` (AdditiveLogitBias.forward), exactly in fp64, with the same gradients; a
    decoding step's query reads its row from the sequence's table (its ``bias``)."""
    attn = build_attention(ADDITIVE[variant], causal)
    x, mask = batch("right" if padding == "decoding" else padding)
    length = x.size(0)
    tgt_len = 1 if padding == "decoding" else length
    for term in (term for term in attn.additive_terms if term.has_score_mod()):
        term.num_heads = H  # what the derived form evaluates the score_mod over (a declared form need not say)
        ctx = context(mask, x, causal)
        declared, derived = term(ctx, tgt_len, length), AdditiveLogitBias.forward(term, ctx, tgt_len, length)
        assert derived.dtype == torch.float64 and derived.shape == declared.shape
        torch.testing.assert_close(derived, declared, rtol=0, atol=0)
        used = [p for module in (term, *term.side_modules()) for p in module.parameters()]
        if used:
            weights = torch.randn(derived.shape, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
            grads = [torch.autograd.grad((bias * weights).sum(), used) for bias in (derived, declared)]
            for got, expected in zip(*grads):
                torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-12)
        if padding == "decoding":
            with torch.no_grad():
                tables = SequenceTables(T_MAX, {})
                step = PositionContext.from_padding(torch.zeros(x.size(1), length, dtype=torch.bool), True,
                                                    tables=tables, causal=causal)
                torch.testing.assert_close(term.bias(step, 1, length), derived, rtol=0, atol=0)
                assert not term.positions_only or term.table_key() in tables.tables  # the sequence's table


@pytest.mark.parametrize("variant,causal,padding", side_cases(FUSABLE, CASES[:3]))
def test_flex_attention_equals_the_explicit_path_on_the_cpu(variant, causal, padding):
    """flex_attention's own CPU implementation (unfused), fp64: the module's output without gradients
    (torch has no flex backward on the CPU for queries, keys and values that need one), and the
    gradients of the terms' parameters through flex_attention with q, k, v held fixed."""
    attn = build_attention(FUSABLE[variant], causal)
    x, mask = batch(padding)
    real = (~mask if mask is not None else torch.ones(x.shape[1], x.shape[0], dtype=torch.bool))[:, None, :, None]
    call = dict(attn_mask=causal_mask(x.size(0)) if causal else None, need_weights=False)
    with torch.no_grad():
        outputs = {}
        for kernel in ("flex", "explicit"):
            attn.kernel = kernel
            assert attn.path(False, CPU, decoding=False)[0] == (FLEX if kernel == "flex" else EXPLICIT)
            outputs[kernel] = attn(x, x, x, key_padding_mask=context(mask, x, causal), **call)[0]
    torch.testing.assert_close(outputs["flex"], outputs["explicit"], rtol=1e-10, atol=1e-10)

    ctx = context(mask, x, causal)
    q, k = (t.detach() for t in projected(attn, x, ctx))
    v = attn._project(x)[2].detach()
    used = [p for term in attn.score_terms() for p in term.parameters()]
    if not used:  # ALiBi
        return
    grads = []
    for out in (attn._attend_flex(q, k, v, ctx, attn.token_values(x, ctx)),
                attn._attend_explicitly(q, k, v, ctx, call["attn_mask"], None, attn.token_values(x, ctx))[0]):
        grads.append(torch.autograd.grad(out.masked_fill(~real, 0).square().sum(), used))
    for got, expected in zip(*grads):
        torch.testing.assert_close(got, expected, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("variant,cpu,cuda", [
    ("rotary", SDPA, SDPA), ("alibi", SDPA, SDPA), ("temperature", SDPA, SDPA),
    ("direct-relative", SDPA, FLEX), ("t5-bias", SDPA, FLEX), ("distance-aware", EXPLICIT, FLEX),
    ("shaw-keys-only", EXPLICIT, FLEX), ("shaw", EXPLICIT, EXPLICIT), ("conv-2d", EXPLICIT, EXPLICIT),
])
def test_each_layer_takes_the_path_its_terms_declare(variant, cpu, cuda):
    """auto: the CPU keeps its paths; on CUDA every fusable layer that learns or rescales logits takes
    flex_attention. Weights asked for, a decoding step and --*-attention-kernel explicit take the explicit
    path."""
    attn = build_attention(VARIANTS[variant], causal=True).train()
    assert attn.path(False, CPU, decoding=False)[0] == cpu
    assert attn.path(False, CUDA, decoding=False)[0] == cuda
    assert attn.path(True, CUDA, decoding=False)[0] == EXPLICIT
    assert attn.path(False, CUDA, decoding=True)[0] in (SDPA, EXPLICIT)
    attn.kernel = "explicit"
    assert attn.path(False, CUDA, decoding=False)[0] == EXPLICIT


class LearnedDenseBias(AdditiveLogitBias):
    """A learned bias with a dense form only (no ``score_mod``)."""

    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(H))

    def forward(self, ctx, tgt_len, src_len):
        return self.weight[None, :, None, None]


def test_a_learned_bias_without_a_score_mod_stays_off_flex_attention():
    terms = PositionTerms()
    terms.add(LearnedDenseBias())
    attn = PositionAwareMultiheadAttention(E, H, terms).train()
    assert attn.learned_bias and not attn.fusable()
    assert attn.path(False, CUDA, decoding=False)[0] == SDPA


def test_attention_dropout_keeps_training_off_flex_attention():
    attn = build_attention(VARIANTS["distance-aware"], causal=False).train()
    attn.dropout_module.p = 0.1
    assert attn.path(False, CUDA, decoding=False)[0] == EXPLICIT
    assert attn.eval().path(False, CUDA, decoding=False)[0] == FLEX


@pytest.mark.parametrize("variant", [{"conv_attention": "2d"}, {"relative_positions": 2}])
def test_flex_kernel_is_refused_for_terms_that_need_the_matrix(variant):
    options = SidePositionOptions("encoder", False, 16, "--max-source-positions",
                                  attention_kernel="flex", **variant)
    options.validate()
    with pytest.raises(PositionOptionError, match="--encoder-attention-kernel flex"):
        options.build_terms(0, 2, 4)


def test_the_log_names_each_layers_path_once(caplog):
    attn = build_attention(FUSABLE["distance-aware"], causal=False)
    attn.where = "encoder self-attention, layer 3"
    x, mask = batch("left")
    with caplog.at_level(logging.INFO, logger="fairseq_posattn.modules.attention"):
        for _ in range(2):
            attn(x, x, x, key_padding_mask=context(mask, x), need_weights=False)
    assert [r.getMessage() for r in caplog.records] == [
        "encoder self-attention, layer 3: explicit kernel "
        "(a term rescales the logits and flex_attention is not used here)"]

