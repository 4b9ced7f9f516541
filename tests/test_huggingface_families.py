"""posattn_huggingface on the families beyond Llama, GPT-2 and BERT (docs/huggingface.md, "Model families"): Qwen2,
Qwen3, Mistral, Gemma 2, Gemma 3 (text), Phi-3, OLMo-2, GPT-NeoX, SmolLM (a Llama configuration), RoBERTa and
ModernBERT, each from one small configuration (hidden 32, 2 layers, 4 heads, 2 key/value heads where the family
groups them, vocabulary 100; a sliding window of 4 tokens on one layer where the family has one), fp64, one thread.

For each family: with no method the switched model computes what transformers computes (eager and SDPA, padded left
and right); with ALiBi (a bias) and the posattn rotation (a query/key transform) it is causal and padding-invariant,
and generation with the cache equals generation without it (greedy and beam search, left padding) and the full
forward's argmax; a saved model loads with its method. And what the families bring: sliding windows composed with
the method, Gemma's logit soft-capping as transformers' eager attention computes it, GPT-NeoX's partial rotation
turned off or kept; what does not compose is refused in one line.
"""

from typing import Any, Callable, Dict

import pytest
import torch

transformers = pytest.importorskip("transformers", reason="transformers is not installed (pip install '.[hf]')")

import posattn  # noqa: E402
import posattn_huggingface as hf  # noqa: E402
from posattn.position_context import PositionContext  # noqa: E402
import huggingface_helpers as helpers  # noqa: E402
from huggingface_helpers import one_thread, output  # noqa: E402, F401 (one_thread: autouse)

VOCAB = helpers.VOCAB
#: the sizes every decoder family shares
SMALL = {"vocab_size": VOCAB, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
         "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 64, "bos_token_id": None,
         "eos_token_id": None, "pad_token_id": 0}
#: a sliding window of 4 tokens on the first layer, full attention on the second
WINDOWED = {"sliding_window": 4, "layer_types": ["sliding_attention", "full_attention"]}
#: Gemma's heads of 8 (its default is 256) and its scaling of the logits by them
GEMMA = {"head_dim": 8, "query_pre_attn_scalar": 8}


def _decoder(model_class: str, config_class: str, **config: Any) -> Callable[..., Any]:
    def build(**more: Any) -> Any:
        return getattr(transformers, model_class)(getattr(transformers, config_class)(**{**SMALL, **config, **more}))
    return build


def _roberta(**more: Any) -> Any:
    return transformers.RobertaModel(transformers.RobertaConfig(**{
        "vocab_size": VOCAB, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
        "num_attention_heads": 4, "max_position_embeddings": 66, "pad_token_id": 0, **more}))


def _modernbert(**more: Any) -> Any:
    """Global attention on the first layer, a local window of 4 (2 each side) on the second."""
    return transformers.ModernBertModel(transformers.ModernBertConfig(**{
        "vocab_size": VOCAB, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
        "num_attention_heads": 4, "max_position_embeddings": 64, "global_attn_every_n_layers": 2,
        "local_attention": 4, "pad_token_id": 0, "bos_token_id": None, "eos_token_id": None, "cls_token_id": 1,
        "sep_token_id": 2, **more}))


#: one small configuration per family, by name
FAMILIES: Dict[str, Callable[..., Any]] = {
    "qwen2": _decoder("Qwen2ForCausalLM", "Qwen2Config", use_sliding_window=True, **WINDOWED),
    "qwen3": _decoder("Qwen3ForCausalLM", "Qwen3Config", head_dim=8, use_sliding_window=True, **WINDOWED),
    "mistral": _decoder("MistralForCausalLM", "MistralConfig", sliding_window=4),
    "gemma2": _decoder("Gemma2ForCausalLM", "Gemma2Config", attn_logit_softcapping=1.0, **GEMMA, **WINDOWED),
    "gemma3": _decoder("Gemma3ForCausalLM", "Gemma3TextConfig", **GEMMA, **WINDOWED),
    "phi3": _decoder("Phi3ForCausalLM", "Phi3Config", sliding_window=4),
    "olmo2": _decoder("Olmo2ForCausalLM", "Olmo2Config"),
    "gpt_neox": _decoder("GPTNeoXForCausalLM", "GPTNeoXConfig", num_key_value_heads=None, rotary_pct=0.5),
    "smollm": _decoder("LlamaForCausalLM", "LlamaConfig", tie_word_embeddings=True),  # SmolLM's configuration
    "roberta": _roberta,
    "modernbert": _modernbert,
}
ENCODERS = ("roberta", "modernbert")
DECODERS = tuple(name for name in FAMILIES if name not in ENCODERS)
#: one bias and one query/key transform
METHODS: Dict[str, Dict[str, Any]] = {"alibi": {"alibi": True}, "rotary": {"rotary": True}}


def built(family: str, implementation: str = "", **config: Any) -> Any:
    """The family's model in fp64 (built so: its buffers computed in fp64, as a load in fp64 computes them), its
    weights drawn from seed 0; SDPA attention by default (eager for Gemma 2, which has no other in transformers)."""
    torch.manual_seed(0)
    dtype = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        model = FAMILIES[family](**config).eval()
    finally:
        torch.set_default_dtype(dtype)
    model.set_attn_implementation(implementation or ("eager" if family == "gemma2" else "sdpa"))
    return model


def switched(family: str, **options: Any) -> Any:
    return hf.apply_position_method(built(family), **options)


def padded_batch(side: str, length: int = 11) -> Dict[str, torch.Tensor]:
    """Three sequences of ``length`` (past the windows), ``length - 3`` and ``length - 1`` tokens, padded on ``side``."""
    return helpers.padded_batch(side, length)


# ----------------------------------------------------------------- no method: the family's own model
@pytest.mark.parametrize("family", FAMILIES)
def test_with_no_method_each_family_computes_what_transformers_computes(family):
    """At every token of a batch padded left and right, eager and SDPA (Gemma 2 has no SDPA in transformers): to
    fp64 rounding, to 1e-6 against eager attention (its softmax in fp32). Left padding under eager attention is not
    compared: transformers' eager decoders give NaN there before any switch (the rows of the pads before a
    sequence, fully masked). Every output of the switched model is finite, the pads' too."""
    compared = 0
    for implementation in ("eager", "sdpa"):
        for side in ("left", "right"):
            if implementation == "sdpa" and family == "gemma2":
                with pytest.raises(ValueError, match="does not support an attention implementation"):
                    built(family, implementation)
                continue
            model = built(family, implementation)
            batch = padded_batch(side)
            expected = output(model, batch["ids"], batch["mask"])
            if family in DECODERS and (implementation, side) == ("eager", "left"):
                assert expected.isnan().any()
                continue
            got = output(hf.apply_position_method(model), batch["ids"], batch["mask"])
            real = batch["mask"].bool()
            tolerance = 1e-6 if implementation == "eager" else 1e-12
            torch.testing.assert_close(got[real], expected[real], rtol=0, atol=tolerance, msg=implementation + side)
            assert got.isfinite().all()
            compared += 1
    assert compared == (1 if family == "gemma2" else 3 if family in DECODERS else 4)


# ----------------------------------------------------------------- with a method
@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("family", FAMILIES)
def test_a_method_is_causal_and_invariant_to_padding(family, method):
    """A sequence alone equals it in a padded batch (decoders padded on the left, encoders on the right, 11 tokens:
    past the windows); a decoder's outputs before a changed token do not change."""
    model = switched(family, **METHODS[method])
    layer = next(module.position_method for module in model.modules() if hasattr(module, "position_method"))
    assert layer.causal == (family in DECODERS)
    batch = padded_batch("right" if family in ENCODERS else "left")
    padded = output(model, batch["ids"], batch["mask"])
    real = batch["mask"][1].bool()
    alone = output(model, batch["ids"][1:2, real], torch.ones(1, int(real.sum()), dtype=torch.long))
    torch.testing.assert_close(padded[1, real], alone[0], rtol=0, atol=1e-12)
    if family in DECODERS:
        changed = batch["ids"].clone()
        changed[:, 8:] = changed[:, 8:] % (VOCAB - 1) + 1
        torch.testing.assert_close(output(model, changed, batch["mask"])[:, :8], padded[:, :8], rtol=0, atol=0)


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("family", DECODERS)
def test_generation_with_the_cache_equals_generation_without_it_and_the_full_forward(family, method):
    """Left-padded prompts of 6 tokens and 5 new ones (past the window of 4): greedy and beam search (3 beams) with
    the cache equal them without it, and greedy decoding is the full forward's argmax."""
    helpers.assert_generation_with_the_cache_is_without_it(switched(family, **METHODS[method]),
                                                           padded_batch("left", length=6))


@pytest.mark.parametrize("family", FAMILIES)
def test_a_saved_model_of_each_family_loads_with_its_method(family, tmp_path):
    """The T5 bias (learned, moved off its initial values): ``save_pretrained``, then
    ``posattn_huggingface.from_pretrained`` of the model's class to the same outputs (to fp64 rounding: Gemma, Phi-3,
    OLMo-2 and GPT-NeoX's loaded models differ by 1e-16 at a few entries from their first projection on, whose
    weights are equal: the matmul on the loaded storage; the others not at all)."""
    model = switched(family, t5_relative_bias=8, t5_max_distance=16)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "position_method" in name:
                parameter.add_(0.01 * torch.randn_like(parameter))
    model.save_pretrained(tmp_path)
    loaded = hf.from_pretrained(type(model), str(tmp_path), dtype=torch.float64).eval()
    batch = padded_batch("right" if family in ENCODERS else "left")
    real = batch["mask"].bool()
    torch.testing.assert_close(output(loaded, batch["ids"], batch["mask"])[real],
                               output(model, batch["ids"], batch["mask"])[real], rtol=0, atol=1e-12)


@pytest.mark.parametrize("family", FAMILIES)
def test_each_family_trains_its_method(family):
    """A few AdamW steps on one padded batch (the decoders' next-token loss, the encoders' a fixed target of their
    states): the loss falls, and the side-wide T5 table and each layer's FIRE MLP get gradients (the method is
    trained, not only run)."""
    model = switched(family, t5_relative_bias=8, t5_max_distance=16, fire=True, fire_hidden=4).train()
    batch = padded_batch("right")
    target = torch.randn(3, batch["ids"].size(1), 32, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    optimiser = torch.optim.AdamW(model.parameters(), lr=1e-2)

    def loss() -> torch.Tensor:
        if family in ENCODERS:
            states = output(model, batch["ids"], batch["mask"])
            return ((states - target) ** 2)[batch["mask"].bool()].mean()
        labels = batch["ids"].masked_fill(batch["mask"] == 0, -100)
        return model(input_ids=batch["ids"], attention_mask=batch["mask"], labels=labels).loss

    losses = []
    for _ in range(4):
        optimiser.zero_grad()
        value = loss()
        value.backward()
        if not losses:  # T5's table and FIRE's MLP (whose output bias has a zero gradient: the softmax cancels it)
            for part in ("t5", "mlp"):
                grads = [p.grad for name, p in model.named_parameters() if "position" in name and part in name]
                assert grads and all(g is not None for g in grads) and sum(g.abs().sum() for g in grads) > 0, part
        optimiser.step()
        losses.append(value.item())
    assert losses[-1] < losses[0], losses


# ----------------------------------------------------------------- what the families bring
@pytest.mark.parametrize("family, window, reach", [("mistral", {"sliding_window": 3}, 5),
                                                   ("modernbert", {"local_attention": 4, "layer_types": [
                                                       "sliding_attention", "sliding_attention"]}, 5)])
def test_a_sliding_window_composes_with_the_method(family, window, reach):
    """Every layer windowed (Mistral: a key up to 2 tokens before the query; ModernBERT: up to 2 either side),
    with ALiBi: the outputs from ``reach`` tokens on (two layers' windows) do not depend on the first token, and
    those before do (the negative control: the window's reach, and the same model without a window)."""
    model = hf.apply_position_method(built(family, **window), alibi=True)
    ids = torch.randint(3, VOCAB, (2, 9), generator=torch.Generator().manual_seed(5))
    changed = ids.clone()
    changed[:, 0] = changed[:, 0] % (VOCAB - 3) + 3
    mask = torch.ones_like(ids)
    first, second = output(model, ids, mask), output(model, changed, mask)
    torch.testing.assert_close(second[:, reach:], first[:, reach:], rtol=0, atol=0)
    assert (second[:, :reach] - first[:, :reach]).abs().amax(dim=-1).min() > 1e-6
    unwindowed = hf.apply_position_method(built(family), alibi=True)
    assert (output(unwindowed, changed, mask)[:, reach:] - output(unwindowed, ids, mask)[:, reach:]).abs().max() > 1e-6


def test_gemma_soft_caps_the_content_logits_before_the_methods_bias():
    """Gemma 2's layer with ALiBi: transformers' eager attention (``gemma2.modeling_gemma2.eager_attention_forward``:
    ``softcap * tanh(q k^T * scaling / softcap)``, then the mask), the method's bias added after the cap, transcribed
    in fp64 here; the cap applied to the logits with the bias differs (the negative control)."""
    model = switched("gemma2", alibi=True)
    module = model.model.layers[1].self_attn  # a full-attention layer
    q, k, v = torch.randn(3, 2, 4, 7, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    context = hf.batch_positions(2, 7, 7, mask_function=transformers.masking_utils.causal_mask_function)
    got, _ = hf.method_attention(module, q, k, v, context, scaling=module.scaling,
                                 softcap=module.attn_logit_softcapping)
    bias = module.position_method.additive_terms[0].bias(PositionContext.unpadded(7, q.device, causal=True), 7, 7)
    future = torch.ones(7, 7, dtype=torch.bool).triu(1)

    def attention(capped_with_bias: bool) -> torch.Tensor:
        cap, logits = 1.0, q @ k.transpose(-1, -2) * module.scaling
        logits = cap * torch.tanh((logits + bias) / cap) if capped_with_bias else cap * torch.tanh(logits / cap) + bias
        return (logits.masked_fill(future, float("-inf")).softmax(-1) @ v).transpose(1, 2)

    torch.testing.assert_close(got, attention(False), rtol=0, atol=1e-12)
    assert (got - attention(True)).abs().max() > 1e-3


def test_gemma_soft_capping_refuses_a_method_that_rescales_the_logits():
    with pytest.raises(hf.HuggingFaceRefusal, match="attn_logit_softcapping=1.0") as refused:
        switched("gemma2", distance_aware=True)
    assert "\n" not in str(refused.value)
    uncapped = hf.apply_position_method(built("gemma2", attn_logit_softcapping=None), distance_aware=True)
    assert uncapped.model.layers[0].self_attn.position_method.scaling_term is not None


def test_gpt_neox_partial_rotation_is_turned_off_or_kept(caplog):
    """A method turns GPT-NeoX's rotation of the first half of each head off (the identity over the whole head),
    saying so; ``keep_model_positions=True`` keeps it beside the method."""
    with caplog.at_level("INFO", logger="posattn_huggingface"):
        model = switched("gpt_neox", alibi=True)
    assert isinstance(model.gpt_neox.rotary_emb, hf.UnrotatedPositions)
    assert any("first 0.5 of each head" in record.message for record in caplog.records)
    kept = switched("gpt_neox", alibi=True, keep_model_positions=True)
    assert type(kept.gpt_neox.rotary_emb).__name__ == "GPTNeoXRotaryEmbedding"
    batch = padded_batch("left")
    assert (output(kept, batch["ids"], batch["mask"]) - output(model, batch["ids"], batch["mask"])).abs().max() > 1e-6


def test_what_does_not_compose_is_refused_in_one_line():
    """A static cache on a sliding-window layer (its buffers hold the window only), a causal family with
    bidirectional attention, a module whose soft-capping changed after the switch."""
    model = switched("mistral", alibi=True)
    batch = padded_batch("left", length=6)
    with pytest.raises(hf.HuggingFaceRefusal, match="sliding-window layer") as refused:
        model.generate(batch["ids"], attention_mask=batch["mask"], max_new_tokens=2, pad_token_id=0,
                       cache_implementation="static")
    assert "\n" not in str(refused.value)
    with pytest.raises(posattn.UserError, match="use_bidirectional_attention=False"):
        hf.apply_position_method(built("gemma3", use_bidirectional_attention=True), alibi=True)
    capped = switched("gemma2", alibi=True)
    for layer in capped.model.layers:
        layer.self_attn.attn_logit_softcapping = 2.0
    with pytest.raises(hf.HuggingFaceRefusal, match="soft-caps its logits at 2.0, its method at 1.0"):
        output(capped, batch["ids"], batch["mask"])
