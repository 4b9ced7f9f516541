"""``posattn_huggingface`` with ``keep_model_positions=True`` on a Llama whose own RoPE is scaled (its config's
``rope_parameters`` of type yarn or llama3): the model's scaled rotation composes with a bias method.

Checked against an independent computation: the unswitched model (transformers' own SDPA attention, its own
scaled rotation, YaRN's attention scaling included) given the bias as a custom 4D additive mask, the causal mask
and the ALiBi bias ``-m_h (i - j)``, which transformers adds to ``q . k / sqrt(d)`` as the method does. Negative
controls: the same computation without the bias, or with the model's RoPE unscaled, differs. And generation with the
cache equals the full forward of the generated tokens.
"""

import pytest
import torch

transformers = pytest.importorskip("transformers")

import posattn_huggingface as hf  # noqa: E402
from huggingface_helpers import llama  # noqa: E402
from posattn.position_terms.alibi import alibi_slopes  # noqa: E402

#: the model's own rope_parameters: extended from 16 positions to 64 (its max_position_embeddings)
ROPE_PARAMETERS = {
    "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16, "rope_theta": 10000.0},
    "llama3": {"rope_type": "llama3", "factor": 4.0, "original_max_position_embeddings": 16, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "rope_theta": 10000.0},
}
LENGTH = 24  # beyond the original 16 positions


def built(rope_parameters: dict, seed: int = 0):
    torch.manual_seed(seed)
    model = llama(rope_parameters=dict(rope_parameters)).double().eval()
    model.set_attn_implementation("sdpa")  # eager's softmax runs in fp32
    return model


def alibi_mask(length: int, heads: int) -> torch.Tensor:
    """``(1, heads, length, length)``: ``-m_h (i - j)`` where key j is not after query i, ``-inf`` after."""
    distance = (torch.arange(length)[:, None] - torch.arange(length)[None, :]).double()
    bias = -alibi_slopes(heads)[:, None, None] * distance
    return bias.masked_fill(distance < 0, float("-inf"))[None]


def ids(length: int = LENGTH) -> torch.Tensor:
    return torch.randint(1, 100, (2, length), generator=torch.Generator().manual_seed(5))


@pytest.mark.parametrize("kind", sorted(ROPE_PARAMETERS))
@torch.no_grad()
def test_the_models_scaled_rope_composes_with_alibi(kind):
    tokens = ids()
    switched = hf.apply_position_method(built(ROPE_PARAMETERS[kind]), keep_model_positions=True, alibi=True)
    assert switched.model.rotary_emb.rope_type == kind
    got = switched(input_ids=tokens).logits
    reference = built(ROPE_PARAMETERS[kind])
    expected = reference(input_ids=tokens, attention_mask=alibi_mask(LENGTH, 4)).logits
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-10)
    without_bias = reference(input_ids=tokens).logits
    unscaled = built({"rope_type": "default", "rope_theta": 10000.0})
    unscaled.load_state_dict(reference.state_dict())
    plain_rope = unscaled(input_ids=tokens, attention_mask=alibi_mask(LENGTH, 4)).logits
    assert (without_bias - got).abs().max() > 1e-2 and (plain_rope - got).abs().max() > 1e-4


@pytest.mark.parametrize("kind,method", [("yarn", {"alibi": True}), ("llama3", {"alibi": True}),
                                         ("yarn", {"t5_relative_bias": 8, "t5_max_distance": 16})],
                         ids=["yarn-alibi", "llama3-alibi", "yarn-t5"])
@torch.no_grad()
def test_generation_with_the_cache_equals_the_full_forward(kind, method):
    """Greedy generation past the original 16 positions, with ALiBi or T5's bias: each step's scores are the full
    forward's logits of the tokens so far (the cached keys rotated by the model's own scaled rotation at their
    positions), up to the fp32 that generate returns scores in."""
    model = hf.apply_position_method(built(ROPE_PARAMETERS[kind]), keep_model_positions=True, **method)
    prompt = ids(12)
    generated = model.generate(input_ids=prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=10,
                               do_sample=False, pad_token_id=0, output_scores=True, return_dict_in_generate=True)
    full = model(input_ids=generated.sequences).logits
    for step, score in enumerate(generated.scores):
        torch.testing.assert_close(score, full[:, 11 + step].float(), rtol=0, atol=1e-6, msg=f"step {step}")
