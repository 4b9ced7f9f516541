"""Misuse of the plain-PyTorch front-end (``posattn``) refused in one line, and the right results where the use is
right (issue 65): options from Python with the command line's types, every object a user holds (a cache, an
options object, a method, a context) refused where it does not belong, ``kernel=`` checked, every table in the
dtype asked, shapes and sizes named instead of raw tracebacks, the option listing reachable from Python.

Each refusal is a :class:`posattn.UserError` whose message names the argument or object, what was expected and the
right use; beside each, the good input still works and gives the right numbers. Like ``tests/test_core.py``, these
tests import neither fairseq nor transformers."""

import math
from typing import Callable, Dict, List, Tuple

import pytest
import torch

import posattn
from core_helpers import E, H, T_MAX, VARIANTS, applies, build_self_attention, on_side, side_rows
from posattn.position_options import side_options
from posattn.position_terms.registry import REGISTRY
from reference_attention import reference_attention

#: a layer's sizes for the refusals (heads of size 4)
HEAD_DIM = E // H


def layer(causal: bool = True, **options) -> posattn.SelfAttention:
    """A float32 layer of the tests' sizes (no kernel self-check: these tests look at refusals)."""
    return posattn.SelfAttention(E, H, causal=causal, max_positions=T_MAX, attention_self_check="off",
                                 **options).eval()


def refused(error: type, words: List[str], call: Callable[[], object]) -> str:
    """Run ``call``, which must raise ``error`` (a :class:`posattn.UserError`) in one line holding every one of
    ``words``; return the message."""
    with pytest.raises(error) as raised:
        call()
    message = str(raised.value)
    assert isinstance(raised.value, posattn.UserError) and "\n" not in message, message
    missing = [word for word in words if word not in message]
    assert not missing, f"{missing} not in: {message}"
    return message


# ----------------------------------------------------------------------------- 1. options with the command line's types
def wrong_values(default: object, choices: Tuple[str, ...]) -> List[object]:
    """Values of another type than an option's (its default's; a choice's strings), as Python code gives them."""
    if choices:
        return [1, None, True]
    if isinstance(default, bool):
        return ["False", "no", 1, 0, None]
    if isinstance(default, int):
        return [2.5, "8", True, None]
    if isinstance(default, str):  # a text option (layer_methods)
        return [1, None, ["x"]]
    return ["x", None]


def option_cases() -> List[Tuple[bool, str, object]]:
    """``(causal, option, wrong value)`` for every option of both sides, from the registry's declarations."""
    return [(side == "decoder", option.name, value) for side in ("encoder", "decoder")
            for option in side_options(side) for value in wrong_values(option.default, option.choices)]


@pytest.mark.parametrize("causal,name,value", option_cases())
def test_an_option_of_another_type_than_the_command_lines_is_refused(causal, name, value):
    """Every option of every registered method (and the side's own) takes the command line's type: a flag True or
    False (a truthy "False" would switch the method on), an integer an int, a choice one of its strings."""
    refused(posattn.OptionTypeError, [f"{name}={value!r}", name],
            lambda: posattn.position_options(causal, **{name: value}))
    with pytest.raises(TypeError):  # code catching the built-in kind still catches it
        posattn.position_options(causal, **{name: value})


def test_a_flag_given_a_string_builds_nothing_and_the_right_values_compute_the_method():
    """``alibi="False"`` is refused instead of building ALiBi; ``alibi=False`` is no method and ``alibi=True``
    ALiBi, whose output differs from it (the negative control)."""
    refused(posattn.OptionTypeError, ["alibi='False'", "True or False"],
            lambda: posattn.SelfAttention(64, 4, causal=True, alibi="False"))
    refused(posattn.ArgumentError, ["causal", "True or False"], lambda: posattn.SelfAttention(64, 4, causal="yes"))
    assert not posattn.position_options(True, alibi=False).methods()
    x = torch.randn(1, 6, E)
    plain, alibi = layer(alibi=False), layer(alibi=True)
    alibi.load_state_dict(plain.state_dict())
    with torch.no_grad():
        assert not torch.allclose(plain(x), alibi(x))
    assert posattn.position_options(True, relative_positions=4).relative_positions == 4


# ----------------------------------------------------------------------------- 2. objects where they do not belong
def prompt(batch: int = 2, length: int = 3) -> torch.Tensor:
    return torch.randn(batch, length, E, generator=torch.Generator().manual_seed(batch * 10 + length))


def used_cache(attn: posattn.SelfAttention, batch: int = 2) -> posattn.DecodingCache:
    cache = posattn.DecodingCache()
    attn(prompt(batch), cache=cache)
    return cache


def shared_t5(sizes: Tuple[int, int], second_index: int) -> None:
    """Two layers built from one T5 options object: layer 0 of ``H`` heads, then layer ``second_index`` of
    ``sizes``."""
    options = posattn.position_options(True, T_MAX, t5_relative_bias=8)
    posattn.SelfAttention(E, H, causal=True, options=options, layer_index=0)
    posattn.SelfAttention(sizes[0] * sizes[1], sizes[0], causal=True, options=options, layer_index=second_index)


def context_call(padding: torch.Tensor, causal: bool, x: torch.Tensor) -> None:
    layer(alibi=True)(x, context=posattn.batch_context(padding, causal))


def method_call(heads: int, head_dim: int, dtype: torch.dtype = torch.float32, **call) -> None:
    """``position_attention`` of a causal ALiBi method of the tests' sizes (float32) on ``heads`` of ``head_dim``."""
    method = posattn.position_method(H, HEAD_DIM, causal=True, alibi=True)
    q = torch.randn(2, heads, 5, head_dim, dtype=dtype)
    posattn.position_attention(q, q, q, method, **call)


def cache_of_another_batch(attn: posattn.SelfAttention) -> None:
    attn(prompt(3, 1), cache=used_cache(attn))


def cache_of_another_method() -> None:
    """One cache given to two methods' ``position_attention``."""
    cache, q = posattn.DecodingCache(), torch.randn(2, H, 1, HEAD_DIM)
    for _ in range(2):
        posattn.position_attention(q, q, q, posattn.position_method(H, HEAD_DIM, causal=True, rotary=True),
                                   cache=cache)


def unmatched_call(q_shape: Tuple[int, ...], k_shape: Tuple[int, ...], **call) -> None:
    """``position_attention`` of a causal method without terms on ``q`` and ``k`` (and ``v``) of these shapes."""
    q, k = torch.randn(q_shape), torch.randn(k_shape)
    posattn.position_attention(q, k, k, posattn.position_method(H, HEAD_DIM, causal=True), **call)


#: the object misused, the words its refusal holds, the call
MISUSES: Dict[str, Tuple[List[str], Callable[[], object]]] = {
    "a cache on a bidirectional layer": (["DecodingCache", "bidirectional", "causal=True", "whole sequence"],
                                         lambda: layer(False, alibi=True)(prompt(), cache=posattn.DecodingCache())),
    "a cache with another layer": (["DecodingCache", "another module", "one cache per layer"],
                                   lambda: layer(alibi=True)(prompt(2, 1), cache=used_cache(layer(alibi=True)))),
    "a cache with another batch size": (["DecodingCache", "holds 2 sequences", "gives 3", "reorder"],
                                        lambda: cache_of_another_batch(layer(alibi=True))),
    "a cache with position_attention of another method": (["DecodingCache", "another module"],
                                                          cache_of_another_method),
    "encoder options given to a causal layer": (["options built for a bidirectional side", "causal=False"],
                                                lambda: posattn.SelfAttention(E, H, causal=True, options=posattn
                                                                              .position_options(False, alibi=True))),
    "decoder options given to a bidirectional layer": (["options built for a causal side", "causal=True"],
                                                       lambda: posattn.position_method(H, HEAD_DIM, options=posattn
                                                                                       .position_options(True))),
    "options and keywords together": (["options=", "not both"],
                                      lambda: posattn.SelfAttention(E, H, causal=True, alibi=True,
                                                                    options=posattn.position_options(True))),
    "options with another max_positions": (["max_positions=64", "max_positions=9", "leave max_positions out"],
                                           lambda: posattn.SelfAttention(E, H, causal=True, max_positions=64, options=
                                                                         posattn.position_options(True, T_MAX))),
    "options of side-wide modules in a second model": (["already built layer 0", "t5_table", "another model"],
                                                       lambda: shared_t5((H, HEAD_DIM), 0)),
    "options of side-wide modules for layers of other sizes": (["t5_table", "2 heads of size 4", "4 of size 2"],
                                                               lambda: shared_t5((4, 2), 1)),
    "a context of another batch": (["context", "3 sequences", "call is of 2 sequences", "batch_context"],
                                   lambda: context_call(torch.zeros(3, 5, dtype=torch.bool), True, prompt(2, 5))),
    "a context of another length": (["context", "of 5 tokens", "of 4 tokens", "batch_context"],
                                    lambda: context_call(torch.zeros(2, 5, dtype=torch.bool), True, prompt(2, 4))),
    "a context of the other side": (["context", "bidirectional side", "causal side", "batch_context"],
                                    lambda: context_call(torch.zeros(2, 5, dtype=torch.bool), False, prompt(2, 5))),
    "a method of another head count": (["built for 2 heads of size 4", "1 heads of size 8"], lambda: method_call(1, 8)),
    "a method of another head size": (["built for 2 heads of size 4", "2 heads of size 8"], lambda: method_call(2, 8)),
    "a float32 method with float64 queries": (["float64", "torch.float32", "method.double()"],
                                              lambda: method_call(H, HEAD_DIM, dtype=torch.double)),
    "causal=False to a causal method": (["built for a causal side", "causal=False"],
                                        lambda: method_call(H, HEAD_DIM, causal=False)),
}


@pytest.mark.parametrize("case", sorted(MISUSES))
def test_an_object_used_where_it_does_not_belong_is_refused(case):
    words, call = MISUSES[case]
    refused(posattn.MisuseError, words, call)


@torch.no_grad()
def test_the_right_uses_of_the_same_objects_compute_the_full_forward():
    """The negative controls of the refusals above: one cache per causal layer and batch, reordered as beam search
    does, equals the full forward; a context of the call's batch equals the call without one; options shared by
    the layers of one model (each index once, one size) build; a bidirectional layer's full forward is not its
    steps' (why a cache is refused there)."""
    attn = build_self_attention(VARIANTS["alibi"], causal=True, attention_self_check="off")
    x = prompt(3, 6).double()
    order = torch.tensor([2, 0, 0])
    cache = posattn.DecodingCache()
    steps = [attn(x[:, :3], cache=cache)]
    cache.reorder(order)
    steps += [attn(x[order, i:i + 1], cache=cache) for i in range(3, 6)]
    full = attn(x[order])
    torch.testing.assert_close(torch.cat([steps[0][order], *steps[1:]], dim=1), full)
    padding = torch.zeros(3, 6, dtype=torch.bool)
    torch.testing.assert_close(attn(x, context=posattn.batch_context(padding, True)), attn(x))
    options = posattn.position_options(True, T_MAX, t5_relative_bias=8)
    layers = [posattn.SelfAttention(E, H, causal=True, options=options, layer_index=i) for i in range(3)]
    assert list(layers[0].position_shared) == ["t5_table"] and not layers[1].position_shared
    encoder = build_self_attention(VARIANTS["alibi"], causal=False, attention_self_check="off")
    assert not torch.allclose(encoder(x[:, :3])[:, :1], encoder(x[:, :1]))


# ----------------------------------------------------------------------------- 3. kernel=
@pytest.mark.parametrize("kernel", ["flash", "sdpa", "AUTO", ""])
def test_an_unknown_kernel_is_refused_naming_the_choices(kernel):
    method = posattn.position_method(H, HEAD_DIM, causal=True, alibi=True)
    q = torch.randn(1, H, 4, HEAD_DIM)
    refused(posattn.ArgumentError, ["kernel", repr(kernel), "'auto', 'explicit', 'flex'"],
            lambda: posattn.position_attention(q, q, q, method, kernel=kernel))


@torch.no_grad()
def test_under_autocast_an_input_of_the_autocast_dtype_is_taken():
    """The dtype refusal's other side: under torch.autocast (the CPU's bfloat16 here) a bfloat16 x reaches fp32
    weights as in any autocast model (the projections cast both), and gives the fp32 input's output within
    bfloat16's precision."""
    attention = layer(alibi=True)
    x = torch.randn(1, 5, E)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        mixed = attention(x.bfloat16())
    torch.testing.assert_close(mixed.float(), attention(x), atol=5e-2, rtol=5e-2)


@torch.no_grad()
def test_every_known_kernel_gives_the_same_result():
    method = posattn.position_method(H, HEAD_DIM, causal=True, alibi=True, attention_self_check="off").double()
    q, k, v = torch.randn(3, 2, H, 5, HEAD_DIM, dtype=torch.double).unbind(0)
    outputs = [posattn.position_attention(q, k, v, method, kernel=kernel) for kernel in ("auto", "explicit", "flex")]
    for out in outputs[1:]:
        torch.testing.assert_close(out, outputs[0])


# ----------------------------------------------------------------------------- 4. every table in the dtype asked
def paper_slopes(heads: int) -> List[float]:
    """ALiBi's slopes as Press et al. define them (section 3 and their code), in Python's floats (float64)."""
    def geometric(n: int) -> List[float]:
        return [2.0 ** (-8.0 * h / n) for h in range(1, n + 1)]
    power = 2 ** int(math.floor(math.log2(heads)))
    return geometric(power) + geometric(2 * power)[0::2][: heads - power]


def alibi_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, slopes: torch.Tensor) -> torch.Tensor:
    """Causal ALiBi attention written from the paper, in the dtype of its inputs."""
    index = torch.arange(q.size(2))
    distance = (index[:, None] - index[None, :]).to(q.dtype)
    bias = (-slopes[:, None, None] * distance).masked_fill(distance < 0, float("-inf"))
    return torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(q.size(-1)) + bias, dim=-1) @ v


@pytest.mark.parametrize("kernel", ["auto", "explicit", "flex"])
@torch.no_grad()
def test_alibi_in_a_float64_model_equals_a_float64_reference(kernel):
    """12 heads (slopes that float32 rounds) in float64: every kernel path within 1e-13 of the paper's equations in
    float64; the same equations with float32's slopes (the error the library had) are 1e-8 away, which the check
    sees (the negative control)."""
    heads = 12
    method = posattn.position_method(heads, 4, causal=True, alibi=True, attention_self_check="off").double()
    q, k, v = torch.randn(3, 2, heads, 20, 4, dtype=torch.double, generator=torch.Generator().manual_seed(3)).unbind(0)
    got = posattn.position_attention(q, k, v, method, kernel=kernel)
    exact = torch.tensor(paper_slopes(heads), dtype=torch.double)
    assert (got - alibi_reference(q, k, v, exact)).abs().max() < 1e-13
    rounded = exact.float().double()
    assert (got - alibi_reference(q, k, v, rounded)).abs().max() > 1e-9
    assert method.additive_terms[0].slopes.dtype == torch.double


def fixed_table_variants() -> List[str]:
    """The registered variants whose terms learn nothing: each computes its tables (slopes, ratios, frequencies)
    from a formula, in a dtype of its choosing."""
    fixed = []
    for name, variant in sorted(VARIANTS.items()):
        causal = applies(variant, True)
        terms = posattn.position_method(H, HEAD_DIM, causal=causal, **on_side(variant, causal)).all_terms()
        if terms and not any(True for term in terms for module in (term, *term.side_modules())
                             for _ in module.parameters()):
            fixed.append(name)
    return fixed


@pytest.mark.parametrize("variant", fixed_table_variants())
@torch.no_grad()
def test_every_fixed_table_in_a_float64_layer_of_12_heads_equals_the_reference(variant):
    """Every variant that learns nothing, in float64 with 12 heads (slopes, ratios, frequencies that float32 would
    round): within 1e-12 of the loop-by-loop reference in float64."""
    heads, head_dim, causal = 12, 2, applies(VARIANTS[variant], True)
    attn = posattn.SelfAttention(heads * head_dim, heads, causal=causal, max_positions=T_MAX,
                                 attention_self_check="off", **on_side(VARIANTS[variant], causal)).double().eval()
    x = torch.randn(1, 5, heads * head_dim, dtype=torch.double, generator=torch.Generator().manual_seed(4))
    expected, _ = reference_attention(attn, x[0], causal)
    assert (attn(x)[0] - expected).abs().max() < 1e-12


# ----------------------------------------------------------------------------- 5. one line instead of a traceback
def padded_call(mask: torch.Tensor) -> None:
    layer(alibi=True)(prompt(2, 5), padding_mask=mask)


BAD_INPUTS: Dict[str, Tuple[type, List[str], Callable[[], object]]] = {
    "padding_mask (B,)": (posattn.ArgumentError, ["padding_mask", "(2, 5)", "(2,)"],
                          lambda: padded_call(torch.zeros(2, dtype=torch.bool))),
    "padding_mask (B, L+1)": (posattn.ArgumentError, ["padding_mask", "(2, 5)", "(2, 6)"],
                              lambda: padded_call(torch.zeros(2, 6, dtype=torch.bool))),
    "padding_mask (L, B)": (posattn.ArgumentError, ["padding_mask", "(2, 5)", "(5, 2)"],
                            lambda: padded_call(torch.zeros(5, 2, dtype=torch.bool))),
    "padding_mask 4-D": (posattn.ArgumentError, ["padding_mask", "(2, 5)", "(2, 1, 1, 5)"],
                         lambda: padded_call(torch.zeros(2, 1, 1, 5, dtype=torch.bool))),
    "padding_mask of 0/1 integers": (posattn.ArgumentError, ["padding_mask must be bool", "torch.int64",
                                                             "attention_mask == 0"],
                                     lambda: padded_call(torch.ones(2, 5, dtype=torch.long))),
    "padding_mask of floats": (posattn.ArgumentError, ["padding_mask must be bool", "torch.float32"],
                               lambda: padded_call(torch.zeros(2, 5))),
    "batch_context of a float mask": (posattn.ArgumentError, ["padding_mask must be bool"],
                                      lambda: posattn.batch_context(torch.zeros(2, 5), True)),
    "x of rank 2": (posattn.ArgumentError, ["x must be (batch, length, 8)", "(5, 8)", "x[None]"],
                    lambda: layer(alibi=True)(torch.randn(5, E))),
    "x of another width": (posattn.ArgumentError, ["x must be (batch, length, 8)", "(1, 5, 6)"],
                           lambda: layer(alibi=True)(torch.randn(1, 5, 6))),
    "x in another dtype": (posattn.ArgumentError, ["torch.float64", "torch.float32", "layer.to(x)"],
                           lambda: layer(alibi=True)(torch.randn(1, 5, E, dtype=torch.double))),
    "k longer than q": (posattn.ArgumentError, ["q, k and v must have one shape", "(1, 2, 4, 4)", "(1, 2, 5, 4)"],
                        lambda: unmatched_call((1, H, 4, HEAD_DIM), (1, H, 5, HEAD_DIM))),
    "q of rank 3": (posattn.ArgumentError, ["q must be a floating tensor (batch, 2, length, 4)", "(2, 4, 4)"],
                    lambda: unmatched_call((H, 4, HEAD_DIM), (H, 4, HEAD_DIM))),
    "x of position_attention of another length": (
        posattn.ArgumentError, ["x must be the layer input (1, 4, 8)", "(1, 5, 8)"],
        lambda: unmatched_call((1, H, 4, HEAD_DIM), (1, H, 4, HEAD_DIM), x=torch.randn(1, 5, E))),
    "SelfAttention(64, 0)": (posattn.ArgumentError, ["num_heads must be a positive integer", "0"],
                             lambda: posattn.SelfAttention(64, 0)),
    "SelfAttention(0, 4)": (posattn.ArgumentError, ["embed_dim must be a positive integer"],
                            lambda: posattn.SelfAttention(0, 4)),
    "SelfAttention(-8, 2)": (posattn.ArgumentError, ["embed_dim must be a positive integer", "-8"],
                             lambda: posattn.SelfAttention(-8, 2)),
    "SelfAttention(64, 3)": (posattn.ArgumentError, ["embed_dim (64) must be a multiple of num_heads (3)"],
                             lambda: posattn.SelfAttention(64, 3)),
    "SelfAttention(64, 4.0)": (posattn.ArgumentError, ["num_heads must be a positive integer", "4.0"],
                               lambda: posattn.SelfAttention(64, 4.0)),
    "dropout 1.5": (posattn.ArgumentError, ["dropout must be a probability in [0, 1)", "1.5"],
                    lambda: posattn.SelfAttention(64, 4, dropout=1.5)),
    "layer_index -1": (posattn.ArgumentError, ["layer_index", "-1"],
                       lambda: posattn.SelfAttention(64, 4, layer_index=-1)),
    "position_method(0, 8)": (posattn.ArgumentError, ["num_heads must be a positive integer"],
                              lambda: posattn.position_method(0, 8)),
    "position_method(2, 0)": (posattn.ArgumentError, ["head_dim must be a positive integer"],
                              lambda: posattn.position_method(2, 0)),
    "max_positions 2.5": (posattn.ArgumentError, ["max_positions must be a positive integer", "2.5"],
                          lambda: posattn.position_options(True, 2.5, direct_position="absolute")),
    "a cache that is not one": (posattn.ArgumentError, ["cache must be a posattn.DecodingCache", "dict"],
                                lambda: layer(alibi=True)(prompt(), cache={})),
    "reorder out of range": (posattn.ArgumentError, ["order selects sequences [0, 5]", "holds 2"],
                             lambda: used_cache(layer(alibi=True)).reorder(torch.tensor([0, 5]))),
    "reorder by a list": (posattn.ArgumentError, ["order must be a 1-D integer tensor", "list"],
                          lambda: used_cache(layer(alibi=True)).reorder([1, 0])),
    "an unknown option": (posattn.OptionTypeError, ["no decoder position option 'alibbi'", "nearest: alibi",
                                                    "describe_options('decoder')"],
                          lambda: posattn.position_options(True, alibbi=True)),
}


@pytest.mark.parametrize("case", sorted(BAD_INPUTS))
def test_a_bad_argument_is_refused_in_one_line(case):
    error, words, call = BAD_INPUTS[case]
    refused(error, words, call)


def causal_only_options() -> List[str]:
    """The first option of every registered method that takes causal sides only."""
    return [method.options[0].name for method in REGISTRY.values() if method.sides == ("decoder",)]


@pytest.mark.parametrize("name", causal_only_options())
def test_a_causal_only_method_on_a_bidirectional_layer_says_it_is_causal_only(name):
    value = True if isinstance(posattn.position_options(True).values[name], bool) else 8
    refused(posattn.OptionTypeError, [name, "is causal-only", "causal=True"],
            lambda: posattn.SelfAttention(E, H, **{name: value}))
    assert posattn.SelfAttention(E, H, causal=True, **{name: value}).all_terms()


def test_the_length_refusal_gives_plain_pytorchs_remedy_and_the_right_length_computes():
    """Advice for a torch-only user (a larger max_positions, or a cropped input), not fairseq's option; at t
    tokens the layer computes."""
    attn = layer(direct_position="absolute")
    message = refused(posattn.SequenceTooLongError, [f"{T_MAX + 1} tokens", f"larger max_positions (at least "
                                                     f"{T_MAX + 1})", f"crop the input to at most {T_MAX} tokens"],
                      lambda: attn(torch.randn(1, T_MAX + 1, E)))
    assert "skip-invalid-size" not in message and "--" not in message
    cache = posattn.DecodingCache()
    attn(torch.randn(1, T_MAX - 1, E), cache=cache)
    refused(posattn.SequenceTooLongError, [f"{T_MAX + 1} tokens"], lambda: attn(torch.randn(1, 2, E), cache=cache))
    with torch.no_grad():
        assert torch.isfinite(attn(torch.randn(1, T_MAX, E))).all()


@torch.no_grad()
def test_a_right_padding_mask_gives_each_sequence_its_result_alone():
    """The negative control of the padding refusals: a (batch, length) bool mask, True at pads, padded left and
    right, gives each sequence what it gets alone."""
    attn = build_self_attention(VARIANTS["alibi"], causal=False, attention_self_check="off")
    x = prompt(2, 5).double()
    mask = torch.tensor([[False] * 5, [True, True, False, False, False]])
    out = attn(x, padding_mask=mask)
    torch.testing.assert_close(out[1, 2:], attn(x[1:, 2:])[0])
    torch.testing.assert_close(out[0], attn(x[:1])[0])


# ----------------------------------------------------------------------------- 7. the options from Python
@pytest.mark.parametrize("side", ["encoder", "decoder"])
def test_describe_options_lists_every_registered_option_with_its_default(side):
    listing = posattn.describe_options(side)
    for option in side_options(side):
        assert f"    {option.name}: " in listing and f"default {option.default!r}" in listing, option.name
    for method in REGISTRY.values():
        assert (f"  {method.name} ({method.citation})" in listing) == (side in method.sides), method.name
    assert f"--{side}-" not in listing  # Python's keywords, not the command line's flags
    assert posattn.describe_options() == posattn.describe_options("encoder") + "\n\n" + listing if side == "decoder" \
        else posattn.describe_options().startswith(listing)
    assert "describe_options" in posattn.position_options.__doc__
    refused(posattn.ArgumentError, ["side must be one of"], lambda: posattn.describe_options("causal"))
