"""RoPE's context extensions (``--{side}-rotary-scaling``: linear, ntk, dynamic, yarn, llama3), in the library's
rotation (posattn/position_terms/rotary.py):

- equal to transformers' ``ROPE_INIT_FUNCTIONS`` of the same type (``ntk``: transformers' ``dynamic`` at the length
  whose factor is s): the inverse frequencies, the attention scaling, and the logits ``q . k`` of queries and keys
  rotated by transformers' Llama rotation (which turns halves, ``(k, k + d/2)``, where ours turns neighbours, ``(2k,
  2k + 1)``: the logits are the same once the dimensions are permuted alike); skipped where transformers is absent;
- equal to a float64 loop of each source's equation (``tests/reference_attention.py``'s ``scaled_rope_angle``),
  the rotation and whole layers padded left and right, and not equal to it with another factor or unscaled;
- dynamic NTK: decoding with the cache equals the full pass (each token turns with the frequencies of its own
  length), which is transformers' generation token by token, and not its full forward of the whole sequence;
- the options reach fairseq's command line, and impossible values are refused in one line.

The variant ``rotary-yarn`` runs through the shared families (kernel paths, decoding, padding, precision).
"""

import math
from typing import Dict, Tuple

import pytest
import torch

import posattn
from core_helpers import E, H, T_MAX, batch, build_self_attention
from posattn.position_context import PositionContext
from posattn.position_terms.rotary import RotaryEmbedding, RotaryScaling
from reference_attention import REFERENCE_TRANSFORMS, reference_attention

#: realistic configurations (head size d, RotaryScaling) and the transformers rope parameters of each
REALISTIC: Dict[str, Tuple[int, RotaryScaling, dict]] = {
    "linear": (128, RotaryScaling("linear", 4.0), {"rope_type": "linear", "factor": 4.0}),
    "yarn": (128, RotaryScaling("yarn", 16.0, 4096),
             {"rope_type": "yarn", "factor": 16.0, "original_max_position_embeddings": 4096}),
    "llama3": (128, RotaryScaling("llama3", 8.0, 8192),
               {"rope_type": "llama3", "factor": 8.0, "original_max_position_embeddings": 8192,
                "low_freq_factor": 1.0, "high_freq_factor": 4.0}),
    "yarn-small": (16, RotaryScaling("yarn", 4.0, 32, beta_fast=16.0, beta_slow=2.0),
                   {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32, "beta_fast": 16.0,
                    "beta_slow": 2.0}),
    "llama3-small": (16, RotaryScaling("llama3", 4.0, 64, low_frequency_factor=2.0, high_frequency_factor=8.0),
                     {"rope_type": "llama3", "factor": 4.0, "original_max_position_embeddings": 64,
                      "low_freq_factor": 2.0, "high_freq_factor": 8.0}),
}


def llama_config(transformers, head_dim: int, parameters: dict, max_positions: int):
    return transformers.LlamaConfig(hidden_size=2 * head_dim, num_attention_heads=2, head_dim=head_dim,
                                    max_position_embeddings=max_positions,
                                    rope_parameters={"rope_theta": 10000.0, **parameters})


def longest(scaling: RotaryScaling) -> int:
    """The context a scaled model reads: s L (a thousand positions beyond it where there is no L)."""
    return int(scaling.factor * scaling.original_positions) or 1000


@pytest.fixture(scope="module")
def transformers():
    return pytest.importorskip("transformers")


@pytest.mark.parametrize("case", sorted(REALISTIC))
def test_frequencies_and_attention_scaling_equal_transformers(transformers, case):
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
    head_dim, scaling, parameters = REALISTIC[case]
    config = llama_config(transformers, head_dim, parameters, longest(scaling))
    expected, attention_scaling = ROPE_INIT_FUNCTIONS[parameters["rope_type"]](config, "cpu")
    got = scaling.frequencies(head_dim, torch.float32)
    torch.testing.assert_close(got, expected, rtol=1e-6, atol=0)
    assert scaling.attention_scaling == pytest.approx(attention_scaling, rel=1e-12)
    unscaled = RotaryScaling().frequencies(head_dim, torch.float32)
    assert (unscaled / expected - 1).abs().max() > 1  # the negative control: the scaling changes them


@pytest.mark.parametrize("length", [5, 32, 33, 48, 200])
def test_dynamic_and_ntk_frequencies_equal_transformers_dynamic(transformers, length):
    """Dynamic NTK of a sequence of ``length`` tokens is transformers' ``dynamic`` at ``seq_len=length`` (none up
    to L = 32); NTK-aware of factor s is it at the length n where s n / L - (s - 1) = s."""
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
    config = llama_config(transformers, 16, {"rope_type": "dynamic", "factor": 2.0}, 32)
    expected, attention_scaling = ROPE_INIT_FUNCTIONS["dynamic"](config, "cpu", seq_len=length)
    got = RotaryScaling("dynamic", 2.0, 32).frequencies(16, torch.float32, length=torch.tensor(length))
    torch.testing.assert_close(got, expected, rtol=1e-6, atol=0)
    assert attention_scaling == 1.0
    at_factor, _ = ROPE_INIT_FUNCTIONS["dynamic"](config, "cpu", seq_len=48)  # 2 * 48 / 32 - 1 = 2
    torch.testing.assert_close(RotaryScaling("ntk", 2.0).frequencies(16, torch.float32), at_factor, rtol=1e-6, atol=0)


def halves(x: torch.Tensor) -> torch.Tensor:
    """Our pair layout ``(2k, 2k + 1)`` permuted to transformers' ``(k, k + d/2)``."""
    return torch.cat([x[..., 0::2], x[..., 1::2]], dim=-1)


def our_logits(scaling: RotaryScaling, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """``q . k`` of ``(heads, length, d)`` queries and keys at positions 0 .. length - 1, rotated by the term."""
    term = RotaryEmbedding(q.size(-1), scaling)
    q, k = term(q[None], k[None], PositionContext.unpadded(q.size(1), q.device))
    return (q @ k.transpose(-1, -2))[0]


def transformers_logits(rotary, q: torch.Tensor, k: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor:
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb
    cos, sin = rotary(q, position_ids)
    q, k = apply_rotary_pos_emb(halves(q)[None], halves(k)[None], cos, sin)
    return (q @ k.transpose(-1, -2))[0]


def queries_and_keys(head_dim: int, length: int, seed: int = 0) -> Tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(2, 2, length, head_dim, generator=generator).unbind(0)


@pytest.mark.parametrize("case", ["linear", "yarn-small", "llama3-small"])
def test_rotated_logits_equal_transformers_llama_rotation(transformers, case):
    """Logits of queries and keys at every position of s L tokens, relative to their size: equal to transformers'
    (up to fp32's angles), and not to the unscaled rotation's."""
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding
    head_dim, scaling, parameters = REALISTIC[case]
    length = min(longest(scaling), 256)
    q, k = queries_and_keys(head_dim, length)
    rotary = LlamaRotaryEmbedding(llama_config(transformers, head_dim, parameters, longest(scaling)))
    expected = transformers_logits(rotary, q, k, torch.arange(length)[None])
    size = expected.abs().max()
    assert (our_logits(scaling, q, k) - expected).abs().max() / size < 1e-5
    assert (our_logits(RotaryScaling(), q, k) - expected).abs().max() / size > 1e-2


def test_dynamic_logits_equal_transformers_generation_token_by_token_not_its_full_forward(transformers):
    """Each token turns with the frequencies of its own length max(p + 1, L): what transformers' rotation gives
    when called a token at a time (its generation with a cache); its full forward of all 24 tokens (the
    frequencies of 24 for every token) differs, and that of the first L = 8 tokens equals ours."""
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding
    config = llama_config(transformers, 16, {"rope_type": "dynamic", "factor": 2.0}, 8)
    q, k = queries_and_keys(16, 24)
    rotary = LlamaRotaryEmbedding(config)
    turned = [rotary(q, torch.tensor([[p]])) for p in range(24)]  # generation: one position per call
    cos, sin = (torch.cat(parts, dim=1) for parts in zip(*turned))
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb
    q_t, k_t = apply_rotary_pos_emb(halves(q)[None], halves(k)[None], cos, sin)
    step_by_step = (q_t @ k_t.transpose(-1, -2))[0]
    ours = our_logits(RotaryScaling("dynamic", 2.0, 8), q, k)
    assert (ours - step_by_step).abs().max() / step_by_step.abs().max() < 1e-5
    full = transformers_logits(LlamaRotaryEmbedding(config), q, k, torch.arange(24)[None])
    assert (ours - full).abs().max() / full.abs().max() > 1e-2
    within = transformers_logits(LlamaRotaryEmbedding(config), q[:, :8], k[:, :8], torch.arange(8)[None])
    torch.testing.assert_close(ours[..., :8, :8], within, rtol=1e-5, atol=1e-5)


#: a RotaryScaling of each type for the tests' layers (head size 4, sentences of up to 7 tokens)
TYPES = {
    "linear": RotaryScaling("linear", 3.0),
    "ntk": RotaryScaling("ntk", 3.0),
    "dynamic": RotaryScaling("dynamic", 2.0, 4),
    "yarn": RotaryScaling("yarn", 4.0, 4),
    "llama3": RotaryScaling("llama3", 4.0, 16, low_frequency_factor=1.5, high_frequency_factor=5.0),
}


def variant_of(scaling: RotaryScaling) -> dict:
    fields = {"rotary_scaling_factor": scaling.factor}
    if scaling.kind in ("dynamic", "yarn", "llama3"):
        fields["rotary_original_positions"] = scaling.original_positions
    if scaling.kind == "llama3":
        fields["rotary_llama3_low_frequency_factor"] = scaling.low_frequency_factor
        fields["rotary_llama3_high_frequency_factor"] = scaling.high_frequency_factor
    return {"rotary": True, "rotary_scaling": scaling.kind, **fields}


@pytest.mark.parametrize("kind", sorted(TYPES))
@torch.no_grad()
def test_each_rotation_equals_its_equation_in_float64_and_not_with_another_factor(kind):
    """The rotation of 40 positions (d = 16) against the float64 loop of its source's equation: equal to 1e-12;
    the loop with the factor 10% larger, or unscaled, differs (the negative controls)."""
    scaling = TYPES[kind]
    generator = torch.Generator().manual_seed(3)
    vectors = torch.randn(40, 16, generator=generator, dtype=torch.float64)
    term = RotaryEmbedding(16, scaling)
    rotated, _ = term(vectors[None, None], vectors[None, None], PositionContext.unpadded(40, vectors.device))
    expected = REFERENCE_TRANSFORMS(term, vectors, True, 0)
    torch.testing.assert_close(rotated[0, 0], expected, rtol=0, atol=1e-12)
    for other in (RotaryEmbedding(16, RotaryScaling(**{**vars(scaling), "factor": scaling.factor * 1.1})),
                  RotaryEmbedding(16)):
        assert (REFERENCE_TRANSFORMS(other, vectors, True, 0) - rotated[0, 0]).abs().max() > 1e-2


@pytest.mark.parametrize("kind", sorted(TYPES))
@pytest.mark.parametrize("causal,padding", [(False, "left"), (True, "right"), (True, "left")])
@torch.no_grad()
def test_each_layer_equals_the_reference_under_any_padding(kind, causal, padding):
    """A whole layer (outputs and weights) of each type, sentences of 7, 4 and 5 tokens padded left or right,
    against the loop-by-loop reference of each sentence alone."""
    attn = build_self_attention(variant_of(TYPES[kind]), causal)
    x, mask = batch(padding)
    x = x.transpose(0, 1).contiguous()
    out, weights = attn(x, padding_mask=mask, need_weights=True)
    for b in range(x.size(0)):
        real = ~mask[b]
        ref_out, ref_probs = reference_attention(attn, x[b, real], causal)
        torch.testing.assert_close(out[b, real], ref_out, rtol=1e-9, atol=1e-9)
        torch.testing.assert_close(weights[b][:, real][:, :, real], ref_probs, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("padding", ["right", "left"])
@torch.no_grad()
def test_dynamic_ntk_decoding_with_the_cache_equals_the_full_pass(padding):
    """A prompt of 2 tokens, then a token a step past L = 3 (up to 9 tokens): every step's output equals the full
    pass's row, the cached keys keeping the rotation of their step."""
    attn = posattn.SelfAttention(E, H, causal=True, max_positions=T_MAX,
                                 **variant_of(RotaryScaling("dynamic", 2.0, 3))).double().eval()
    x, mask = batch(padding, lengths=(9, 6, 8))
    x = x.transpose(0, 1).contiguous()
    full = attn(x, padding_mask=mask)
    cache = posattn.DecodingCache()
    out = attn(x[:, :2], padding_mask=mask[:, :2], cache=cache)
    torch.testing.assert_close(out[~mask[:, :2]], full[:, :2][~mask[:, :2]])
    for step in range(2, x.size(1)):
        out = attn(x[:, step:step + 1], padding_mask=mask[:, step:step + 1], cache=cache)
        real = ~mask[:, step]
        torch.testing.assert_close(out[real, 0], full[real, step], rtol=1e-10, atol=1e-10)
    plain = posattn.SelfAttention(E, H, causal=True, max_positions=T_MAX, rotary=True).double().eval()
    plain.load_state_dict(attn.state_dict())
    assert (plain(x, padding_mask=mask) - full)[~mask].abs().max() > 1e-3  # beyond L it is not plain RoPE


REFUSED = {
    "without rotary": ({"rotary_scaling": "yarn"}, "--decoder-rotary-scaling yarn scales RoPE's frequencies: add "
                       "--decoder-rotary"),
    "factor 1": ({"rotary": True, "rotary_scaling": "yarn", "rotary_original_positions": 4},
                 "--decoder-rotary-scaling-factor must be above 1 with --decoder-rotary-scaling yarn, got 1.0 "
                 "(1 leaves RoPE unchanged"),
    "dynamic below 1": ({"rotary": True, "rotary_scaling": "dynamic", "rotary_scaling_factor": 0.5,
                         "rotary_original_positions": 4}, "must be at least 1 with --decoder-rotary-scaling dynamic"),
    "no original length": ({"rotary": True, "rotary_scaling": "llama3", "rotary_scaling_factor": 8.0},
                           "--decoder-rotary-scaling llama3 needs --decoder-rotary-original-positions"),
    "an option of another type": ({"rotary": True, "rotary_scaling": "linear", "rotary_scaling_factor": 2.0,
                                   "rotary_yarn_beta_fast": 16.0},
                                  "--decoder-rotary-yarn-beta-fast 16.0 has no effect with --decoder-rotary-scaling "
                                  "linear: it is read by yarn"),
    "betas crossed": ({"rotary": True, "rotary_scaling": "yarn", "rotary_scaling_factor": 2.0,
                       "rotary_original_positions": 4, "rotary_yarn_beta_slow": 40.0},
                      "must satisfy 0 < 40.0 < 32.0"),
    "not a choice": ({"rotary": True, "rotary_scaling": "ntk-by-parts"}, "--decoder-rotary-scaling must be one of"),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_impossible_values_are_refused_in_one_line(case):
    values, message = REFUSED[case]
    with pytest.raises(posattn.PositionOptionError, match=message.replace("(", r"\(").replace(".", r"\.")):
        posattn.position_options(True, T_MAX, **values)


def test_a_factor_of_one_would_be_plain_rope_as_its_refusal_says():
    generator = torch.Generator().manual_seed(4)
    vectors = torch.randn(1, 1, 9, 8, generator=generator, dtype=torch.float64)
    ctx = PositionContext.unpadded(9, vectors.device)
    for kind in ("linear", "ntk", "yarn", "llama3"):
        one, _ = RotaryEmbedding(8, RotaryScaling(kind, 1.0, 4))(vectors, vectors, ctx)
        torch.testing.assert_close(one, RotaryEmbedding(8)(vectors, vectors, ctx)[0], rtol=0, atol=1e-12)


def test_a_head_too_small_for_ntk_is_refused():
    with pytest.raises(posattn.PositionOptionError, match="the head size 2 must be at least 4"):
        posattn.SelfAttention(4, 2, causal=True, rotary=True, rotary_scaling="ntk", rotary_scaling_factor=2.0)


def test_the_options_reach_fairseqs_command_line():
    """One parse and build through fairseq-train's parser: each side's layers turn with the scaling asked."""
    pytest.importorskip("fairseq")
    from model_helpers import build_model
    model = build_model("transformer_posattn", [
        "--encoder-rotary", "--encoder-rotary-scaling", "linear", "--encoder-rotary-scaling-factor", "2",
        "--decoder-rotary", "--decoder-rotary-scaling", "llama3", "--decoder-rotary-scaling-factor", "8",
        "--decoder-rotary-original-positions", "16", "--decoder-rotary-llama3-high-frequency-factor", "6"])
    assert model.encoder.layers[1].self_attn.query_key_terms[0].scaling == RotaryScaling("linear", 2.0)
    assert model.decoder.layers[0].self_attn.query_key_terms[0].scaling == RotaryScaling(
        "llama3", 8.0, 16, high_frequency_factor=6.0)


def test_yarns_attention_temperature_multiplies_the_logits_by_its_square():
    """YaRN's sqrt(1/t) = 0.1 ln s + 1 multiplies q and k (transformers' cos and sin), so q . k by its square: at
    position 0 (no turn) the logit is q . k times (0.1 ln 4 + 1)^2."""
    q, k = queries_and_keys(8, 1)
    logit = our_logits(RotaryScaling("yarn", 4.0, 4), q, k)
    torch.testing.assert_close(logit, (q @ k.transpose(-1, -2)) * (0.1 * math.log(4.0) + 1) ** 2)
