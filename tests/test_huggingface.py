"""posattn_huggingface: Llama, GPT-2 and BERT switched to a position method with one call (docs/huggingface.md).

Small models from configs (hidden 32, 2 layers, 4 heads, vocabulary 100), fp64 where equality is checked: with no
method the switched model computes what transformers computes (eager and SDPA, left and right padding); with a
method it is causal, padding-invariant, equal to ``posattn.position_attention`` and trains; ``generate()`` with the
cache equals it without and the full forward; a saved model loads with its method; what does not fit is refused.
"""

import copy
import json
from pathlib import Path
from typing import Any, Dict

import pytest
import torch

transformers = pytest.importorskip("transformers", reason="transformers is not installed (pip install '.[hf]')")

import posattn  # noqa: E402
import posattn_huggingface as hf  # noqa: E402
from program_helpers import run_python  # noqa: E402
from huggingface_helpers import (CAUSAL_METHODS, DECODERS, DECODING_METHODS, METHODS, MODELS,  # noqa: E402
                                 REFUSED_METHODS, STATEFUL_METHODS, VOCAB, assert_generation_with_the_cache_is_without_it,
                                 bert, built, gpt2, one_thread, output, padded_batch, switched)
from posattn_huggingface.compatibility import cache_keyword  # noqa: E402

#: the keyword of a model's forward that takes the cache (``past_key_values`` before transformers 5.24)
CACHE = cache_keyword()


# ----------------------------------------------------------------- (a) no method: transformers' own model
@pytest.mark.parametrize("kind", MODELS)
@pytest.mark.parametrize("implementation", ["eager", "sdpa"])
@pytest.mark.parametrize("side", ["left", "right"])
def test_with_no_method_the_switched_model_computes_what_transformers_computes(kind, implementation, side):
    """Equal to fp64 rounding; transformers' eager attention takes its softmax in fp32 (Llama's: to its rounding).
    At every token, and at the pads after a sequence (left: the pads before it see no token, and no mask agrees on
    what they compute)."""
    if (kind, implementation, side) == ("llama", "eager", "left"):
        pytest.skip("transformers' eager Llama gives NaN for every token of a left-padded sequence in a forward pass "
                    "(its fully masked padded rows)")
    model = built(kind, attn_implementation=implementation)
    batch = padded_batch(side)
    expected = output(model, batch["ids"], batch["mask"])
    hf.apply_position_method(model)
    assert model.config._attn_implementation == hf.IMPLEMENTATION
    compared = batch["mask"].bool() if side == "left" else torch.ones_like(batch["mask"], dtype=torch.bool)
    tolerance = 1e-6 if (kind, implementation) == ("llama", "eager") else 1e-12
    torch.testing.assert_close(output(model, batch["ids"], batch["mask"])[compared], expected[compared], rtol=0,
                               atol=tolerance)


# ----------------------------------------------------------------- (b) with a method
def test_a_method_turns_the_models_own_positions_off_and_keeps_them_when_asked(caplog):
    with caplog.at_level("INFO", logger="posattn_huggingface"):
        model = switched("gpt2", alibi=True)
    assert [record.message for record in caplog.records if "replaces the model's own positions" in record.message]
    assert model.transformer.wpe.weight.abs().max() == 0 and not model.transformer.wpe.weight.requires_grad
    assert switched("bert", alibi=True).embeddings.position_embeddings.weight.abs().max() == 0
    assert isinstance(switched("llama", alibi=True).model.rotary_emb, hf.UnrotatedPositions)
    kept = switched("gpt2", alibi=True, keep_model_positions=True)
    assert kept.transformer.wpe.weight.abs().max() > 0 and kept.transformer.wpe.weight.requires_grad


@pytest.mark.parametrize("kind", MODELS)
def test_every_layer_holds_its_method_built_from_one_side(kind):
    model = switched(kind, t5_relative_bias=8, t5_max_distance=16)
    methods = [module.position_method for module in model.modules() if hasattr(module, "position_method")]
    assert len(methods) == 2 and len({id(method.side_options) for method in methods}) == 1
    assert all(method.causal == (kind in DECODERS) for method in methods)
    assert any("position_method" in name for name in model.state_dict())


#: (model, method) of the checks on every method a model takes: the common ones, and on decoders the stateful ones
CASES = [(kind, method) for kind in MODELS for method in METHODS] + [
    (kind, method) for kind in DECODERS for method in STATEFUL_METHODS]
OPTIONS = METHODS | STATEFUL_METHODS


@pytest.mark.parametrize("kind, method", [(kind, method) for kind, method in CASES if kind in DECODERS])
def test_a_decoder_with_a_method_is_causal(kind, method):
    model = switched(kind, **OPTIONS[method])
    ids = torch.randint(1, VOCAB, (2, 9), generator=torch.Generator().manual_seed(2))
    changed = ids.clone()
    changed[:, 6:] = (changed[:, 6:] + 1) % VOCAB
    mask = torch.ones_like(ids)
    torch.testing.assert_close(output(model, changed, mask)[:, :6], output(model, ids, mask)[:, :6], rtol=0, atol=0)


@pytest.mark.parametrize("kind, method", CASES)
def test_a_method_is_invariant_to_padding(kind, method):
    model = switched(kind, **OPTIONS[method])
    side = "left" if kind in DECODERS else "right"
    batch = padded_batch(side)
    padded = output(model, batch["ids"], batch["mask"])
    real = batch["mask"][1].bool()
    alone = output(model, batch["ids"][1:2, real], torch.ones(1, int(real.sum()), dtype=torch.long))
    torch.testing.assert_close(padded[1, real], alone[0], rtol=0, atol=1e-12)


@pytest.mark.parametrize("kind", MODELS)
@pytest.mark.parametrize("method", METHODS)
def test_the_attention_function_is_position_attention(kind, method):
    model = switched(kind, **METHODS[method])
    module = next(module for module in model.modules() if hasattr(module, "position_method"))
    causal = kind in DECODERS
    mask = padded_batch("left" if causal else "right")["mask"].bool()
    q, k, v = torch.randn(3, 3, 4, 8, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    context = hf.batch_positions(3, 8, 8, attention_mask=mask, mask_function=(
        transformers.masking_utils.causal_mask_function if causal else
        transformers.masking_utils.bidirectional_mask_function))
    got, weights = hf.method_attention(module, q, k, v, context, scaling=8 ** -0.5)
    expected = posattn.position_attention(q, k, v, module.position_method, padding_mask=~mask, causal=causal)
    assert weights is None
    torch.testing.assert_close(got[mask], expected.transpose(1, 2)[mask], rtol=0, atol=1e-12)


def test_the_layer_input_reaches_a_token_difference_term():
    """FoX's gates read the attention module's input, which a forward pre-hook hands the attention function: a
    switched Llama's layer equals ``posattn.position_attention`` given that input."""
    model = switched("llama", forget_gate=True)
    module = model.model.layers[0].self_attn
    batch = padded_batch("left")
    captured = {}
    hooks = [module.register_forward_pre_hook(lambda _, args, kwargs: captured.update(kwargs), with_kwargs=True),
             module.register_forward_hook(lambda _, args, kwargs, out: captured.update(out=out[0]), with_kwargs=True)]
    output(model, batch["ids"], batch["mask"])
    for hook in hooks:
        hook.remove()
    x, mask = captured["hidden_states"], batch["mask"].bool()
    shape = (*x.shape[:2], -1, 8)
    q, k, v = (projection(x).view(shape).transpose(1, 2) for projection in (module.q_proj, module.k_proj,
                                                                            module.v_proj))
    k, v = (t.repeat_interleave(2, dim=1) for t in (k, v))
    expected = posattn.position_attention(q, k, v, module.position_method, padding_mask=~mask, causal=True, x=x)
    expected = module.o_proj(expected.transpose(1, 2).reshape(*x.shape[:2], -1))
    torch.testing.assert_close(captured["out"][mask], expected[mask], rtol=0, atol=1e-12)


@pytest.mark.parametrize("kind", ["llama", "bert"])
def test_output_attentions_returns_the_weights_that_multiply_v(kind):
    """Per layer ``(batch, heads, queries, keys)``: the explicit path's weights, after the 2d convolution (BERT) or
    the rows of a causal softmax (Llama); a call without them is not changed."""
    options = {"conv_attention": "2d"} if kind == "bert" else {"alibi": True}
    model = switched(kind, **options)
    batch = padded_batch("left" if kind in DECODERS else "right")
    with torch.no_grad():
        out = model(batch["ids"], attention_mask=batch["mask"], output_attentions=True)
    plain = output(model, batch["ids"], batch["mask"])
    hidden = out.logits if kind in DECODERS else out.last_hidden_state
    torch.testing.assert_close(hidden, plain, rtol=0, atol=0)
    weights, real = out.attentions[0], batch["mask"].bool()
    assert len(out.attentions) == 2 and weights.shape == (3, 4, 8, 8)
    on_pads = (weights * ~real[:, None, None, :]).sum(-1).transpose(1, 2)[real]
    assert torch.all(on_pads == 0)  # a token's weights on the pads (the convolution's included)
    if kind == "llama":
        rows = weights.sum(-1).transpose(1, 2)[real]
        torch.testing.assert_close(rows, torch.ones_like(rows), rtol=0, atol=1e-12)
        assert torch.all(weights.triu(diagonal=1) == 0)
        generated = model.generate(batch["ids"], attention_mask=batch["mask"], max_new_tokens=2, do_sample=False,
                                   pad_token_id=0, output_attentions=True, return_dict_in_generate=True)
        assert [step[0].shape for step in generated.attentions] == [(3, 4, 8, 8), (3, 4, 1, 9)]


def test_a_configuration_shared_by_two_models_switches_one():
    config = transformers.GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4)
    first = hf.apply_position_method(transformers.GPT2LMHeadModel(config), alibi=True)
    second = transformers.GPT2LMHeadModel(config)
    assert first.config is not config and first.transformer.h[0].attn.config is first.config
    assert config._attn_implementation != hf.IMPLEMENTATION and not hasattr(config, hf.CONFIG_RECORD)
    second(torch.tensor([[1, 2, 3]]))
    hf.apply_position_method(second, t5_relative_bias=8)


@pytest.mark.parametrize("kind", MODELS)
@pytest.mark.parametrize("method", ["t5-bias", "kerple-log", "direct-relative", "distance-aware"])
def test_gradients_reach_the_methods_parameters(kind, method):
    model = switched(kind, **METHODS[method]).train()
    batch = padded_batch("right")
    output(model, batch["ids"], batch["mask"]).square().sum().backward()
    learned = [parameter for module in model.modules() if hasattr(module, "position_method")
               for _, parameter in module.position_method.learned_position_parameters()]
    assert learned and all(p.grad is not None for p in learned)
    assert sum(p.grad.abs().sum() for p in learned) > 0


def test_an_encoder_takes_a_post_softmax_transform():
    model = switched("bert", conv_attention="2d")
    batch = padded_batch("right")
    assert torch.isfinite(output(model, batch["ids"], batch["mask"])).all()


# ----------------------------------------------------------------- (c) generation
@pytest.mark.parametrize("kind", DECODERS)
@pytest.mark.parametrize("method", DECODING_METHODS)
def test_generation_with_the_cache_equals_generation_without_it_and_the_full_forward(kind, method):
    """Left-padded prompts of 6 tokens and 5 new ones: with the cache as without it, and the full forward's argmax."""
    assert_generation_with_the_cache_is_without_it(switched(kind, **DECODING_METHODS[method]), padded_batch("left", 6))


def test_the_decoding_state_is_kept_in_the_cache_and_refused_where_it_cannot_be(tmp_path):
    """A method whose decoding keeps state turns the cache's layers into DecodingStateLayers that hold it (batch
    first, reordered with the keys); cutting it back (assisted decoding) and a cache filled without it are refused."""
    model = switched("llama", conv_attention="2d")
    batch = padded_batch("left", length=6)
    cache = transformers.DynamicCache(config=model.config)
    model(batch["ids"], attention_mask=batch["mask"], **{CACHE: cache}, use_cache=True)
    assert all(isinstance(layer, hf.DecodingStateLayer) and set(layer.state) == {"prev_attn_rows"}
               for layer in cache.layers)
    rows = cache.layers[0].state["prev_attn_rows"]
    cache.reorder_cache(torch.tensor([2, 0, 1]))
    assert torch.equal(cache.layers[0].state["prev_attn_rows"], rows[[2, 0, 1]])
    with pytest.raises(hf.HuggingFaceRefusal, match="no assisted, speculative or prompt-lookup decoding"):
        cache.crop(-1)
    filled = transformers.DynamicCache(config=model.config)
    built("llama")(batch["ids"], attention_mask=batch["mask"], **{CACHE: filled}, use_cache=True)
    with pytest.raises(hf.HuggingFaceRefusal, match="cannot hold the position method's decoding state"):
        model(batch["ids"][:, :1], attention_mask=torch.ones(3, 7, dtype=torch.long), **{CACHE: filled},
              use_cache=True)


def test_a_cut_cache_keeps_the_transformed_keys_and_continues_as_the_full_forward():
    """Assisted decoding cuts the cache back (``crop``): a rotation's transformed keys, the cache's keys, are cut,
    and the next step equals the full forward of the tokens kept."""
    model = switched("llama", rotary=True)
    batch = padded_batch("left", length=6)
    cache = transformers.DynamicCache(config=model.config)
    model(batch["ids"], attention_mask=batch["mask"], **{CACHE: cache}, use_cache=True)
    cache.crop(-2)
    assert cache.get_seq_length() == 4 and cache.layers[0].values.size(2) == 4
    with torch.no_grad():
        step = model(batch["ids"][:, 4:5], attention_mask=batch["mask"][:, :5], **{CACHE: cache}, use_cache=True).logits
    real = batch["mask"][:, 4].bool()
    full = output(model, batch["ids"][:, :5], batch["mask"][:, :5])[:, -1]
    torch.testing.assert_close(step[real, -1], full[real], rtol=0, atol=1e-12)


def greedy_prompt(**generation: Any) -> Dict[str, Any]:
    """``generate``'s arguments: the left-padded batch of 6 tokens, 5 new tokens, greedy; ``generation``: more."""
    batch = padded_batch("left", length=6)
    return {"input_ids": batch["ids"], "attention_mask": batch["mask"], "max_new_tokens": 5, "do_sample": False,
            "pad_token_id": 0, **generation}


def assert_same_generation(got: Any, expected: Any) -> None:
    """The same tokens, and the same scores at each step (fp64; Llama's norm computes in fp32)."""
    assert torch.equal(got.sequences, expected.sequences)
    for step, (score, reference) in enumerate(zip(got.scores, expected.scores, strict=True)):
        torch.testing.assert_close(score, reference, rtol=0, atol=1e-6, msg=f"step {step}")


@pytest.mark.parametrize("method", CAUSAL_METHODS)
def test_generation_with_a_static_cache_equals_the_dynamic_cache_or_is_refused_in_one_line(method):
    """``cache_implementation="static"`` (eager here; compiled below): every method a causal model takes, from the
    registry; refused, naming the term, where decoding continues from the last token's state (a post-softmax
    transform, a token-difference term, PaTH's carried keys), which a static cache's fixed buffers do not hold."""
    model = switched("llama", **CAUSAL_METHODS[method])
    prompt = greedy_prompt(output_scores=True, return_dict_in_generate=True)
    layer = model.model.layers[0].self_attn.position_method
    if (layer.post_softmax_term is not None or len(layer.token_difference_terms)
            or any(term.keeps_rows for term in layer.logit_matrix_terms) or layer.content_term is not None):
        with pytest.raises(hf.HuggingFaceRefusal, match="which a static cache does not hold") as refused:
            model.generate(**prompt, cache_implementation="static")
        assert "\n" not in str(refused.value)
        return
    assert_same_generation(model.generate(**prompt, cache_implementation="static"), model.generate(**prompt))


def test_a_static_cache_takes_one_token_prompts_and_beam_search():
    """A one-token prompt's first step is already a decoding step over the buffers (the transformed keys' buffer
    made there); beam search reorders the transformed keys with the cache's."""
    model = switched("llama", rotary=True, t5_relative_bias=8, t5_max_distance=16)
    ids = torch.tensor([[5], [7], [9]])
    one_token = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "max_new_tokens": 4, "do_sample": False,
                 "pad_token_id": 0, "output_scores": True, "return_dict_in_generate": True}
    assert_same_generation(model.generate(**one_token, cache_implementation="static"), model.generate(**one_token))
    beams = greedy_prompt(num_beams=3)
    assert torch.equal(model.generate(**beams, cache_implementation="static"), model.generate(**beams))


def test_generation_with_a_static_cache_compiled_equals_the_dynamic_cache():
    """transformers' fast generation path: a StaticCache and the decoding step compiled by ``torch.compile``
    (``compile_config``, on the CPU too), GPT-2 with the posattn rotation (transformed keys kept in the cache) and
    the T5 bias (learned), as one graph (``fullgraph``; a backend that records the graphs and runs them as
    captured: inductor's code generation is the GPU check's, docs/gpu_check.md). A second generation reuses it: no
    step recompiles."""
    graphs = []

    def recording_backend(graph: torch.fx.GraphModule, example_inputs: Any) -> Any:
        graphs.append(graph)
        return graph.forward

    model = switched("gpt2", rotary=True, t5_relative_bias=8, t5_max_distance=16)
    compiled = transformers.CompileConfig(fullgraph=True, backend=recording_backend, mode=None)
    compiled._compile_all_devices = True  # transformers compiles on accelerators only, unless told
    prompt = greedy_prompt(output_scores=True, return_dict_in_generate=True, cache_implementation="static",
                           compile_config=compiled)
    expected = model.generate(**greedy_prompt(output_scores=True, return_dict_in_generate=True))
    assert_same_generation(model.generate(**prompt), expected)
    assert len(graphs) == 1
    assert_same_generation(model.generate(**prompt), expected)
    assert len(graphs) == 1


@pytest.mark.parametrize("method", ["alibi", "rotary", "forget-gate", "conv-2d"])
def test_assisted_and_prompt_lookup_decoding_equal_greedy_decoding(method):
    """transformers 5.24's candidate decoding (one sequence): an assistant model (another switched Llama) and
    prompt lookup (``prompt_lookup_num_tokens``) propose tokens, the model keeps those it would have generated and
    cuts its cache back to them: the tokens of plain greedy decoding; a convolution, whose rows cannot be cut,
    refused in one line."""
    model, assistant = switched("llama", **DECODING_METHODS[method]), switched("llama", 1, **DECODING_METHODS[method])
    assistant.generation_config.num_assistant_tokens = 3  # candidates per round (transformers' default: 20)
    ids = torch.randint(1, VOCAB, (1, 8), generator=torch.Generator().manual_seed(4))
    ids[0, 4:] = ids[0, :4]  # a repeated n-gram: prompt lookup proposes its continuation
    prompt = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "max_new_tokens": 6, "do_sample": False,
              "pad_token_id": 0}
    greedy = model.generate(**prompt)
    for candidates in ({"assistant_model": assistant}, {"prompt_lookup_num_tokens": 3}):
        if method == "conv-2d":
            with pytest.raises(hf.HuggingFaceRefusal, match="cannot be cut back") as refused:
                model.generate(**prompt, **candidates)
            assert "\n" not in str(refused.value)
        else:
            assert torch.equal(model.generate(**prompt, **candidates), greedy), candidates


# ----------------------------------------------------------------- (d) saving, loading, refusals
@pytest.fixture(scope="module")
def saved_methods(tmp_path_factory) -> Dict[Path, Any]:
    """Every method a causal model takes (the registry's) in a Llama, with the model's own positions kept
    (``keep_model_positions``: a parameter-free method then changes no tensor of the model), its learned values
    moved off their initial ones; and BERT with ALiBi: each saved, by folder."""
    root, models = tmp_path_factory.mktemp("saved"), {}
    for kind, method, options in [*(("llama", method, options) for method, options in CAUSAL_METHODS.items()),
                                  ("bert", "alibi", {"alibi": True})]:
        model = switched(kind, keep_model_positions=True, **options)
        with torch.no_grad():
            for parameter in (p for p in model.parameters() if p.requires_grad):
                parameter.add_(0.01 * torch.randn_like(parameter))
        model.save_pretrained(root / f"{kind}-{method}")
        models[root / f"{kind}-{method}"] = model
    return models


#: a user's program that loads each folder with transformers alone (posattn_huggingface not imported)
PLAIN_LOAD = """
import transformers
for folder, auto_class in INPUTS["folders"].items():
    try:
        getattr(transformers, auto_class).from_pretrained(folder)
        OUTPUTS[folder] = "loaded"
    except Exception as error:
        OUTPUTS[folder] = f"{type(error).__name__}: {error}"
"""


def test_a_saved_method_refuses_a_plain_load_naming_the_front_end(saved_methods, tmp_path):
    """config.json names the attention implementation ``posattn_huggingface``: transformers' own
    ``from_pretrained`` in a fresh process, where nothing registered it, fails naming it (one line) instead of
    loading a model without its method."""
    folders = {str(folder): "AutoModel" if model.config.model_type == "bert" else "AutoModelForCausalLM"
               for folder, model in saved_methods.items()}
    for folder in folders:
        assert json.loads((Path(folder) / "config.json").read_text())["attn_implementation"] == hf.IMPLEMENTATION
    failures = run_python(PLAIN_LOAD, tmp_path, threads=1, folders=folders)
    for folder, failure in failures.items():
        assert 'attn_implementation="posattn_huggingface"' in failure and "\n" not in failure, (folder, failure)


def test_every_saved_method_loads_with_the_front_end_to_the_same_outputs(saved_methods):
    batch = padded_batch("left")
    for folder, model in saved_methods.items():
        model_class = type(model)
        loaded = hf.from_pretrained(model_class, str(folder), dtype=torch.float64).eval()
        assert loaded.config.posattn_position_method == model.config.posattn_position_method
        real = batch["mask"].bool()
        torch.testing.assert_close(output(loaded, batch["ids"], batch["mask"])[real],
                                   output(model, batch["ids"], batch["mask"])[real], rtol=0, atol=0, msg=str(folder))


def test_a_plain_load_where_the_front_end_is_imported_refuses_the_call(saved_methods):
    """Where ``posattn_huggingface`` is imported (it registers its implementation), transformers' own load of a
    saved folder succeeds but lacks the methods: its first call is refused, naming the front-end's loader."""
    folder = next(folder for folder in saved_methods if folder.name == "llama-alibi")
    plain = transformers.AutoModelForCausalLM.from_pretrained(folder)
    with pytest.raises(hf.HuggingFaceRefusal, match=r"posattn_huggingface\.from_pretrained") as refused:
        plain(torch.tensor([[1, 2, 3]]))
    assert "\n" not in str(refused.value)


@pytest.mark.parametrize("kind, method", [("llama", "t5-bias"), ("gpt2", "kerple-log"), ("bert", "distance-aware")])
def test_a_saved_model_loads_with_its_method_and_the_same_outputs(kind, method, tmp_path):
    model = switched(kind, **METHODS[method])
    with torch.no_grad():  # learned values, not the initial ones
        for parameter in (p for p in model.parameters() if p.requires_grad):
            parameter.add_(0.01 * torch.randn_like(parameter))
    model.save_pretrained(tmp_path)
    record = json.loads((tmp_path / "config.json").read_text())[hf.CONFIG_RECORD]
    assert record["options"] == METHODS[method]
    loaded = hf.from_pretrained(type(model), str(tmp_path), dtype=torch.float64).eval()
    batch = padded_batch("left" if kind in DECODERS else "right")
    real = batch["mask"].bool()
    torch.testing.assert_close(output(loaded, batch["ids"], batch["mask"])[real],
                               output(model, batch["ids"], batch["mask"])[real], rtol=0, atol=0)


def test_loading_as_another_method_or_without_one_is_refused(tmp_path):
    model = switched("llama", alibi=True)
    model.save_pretrained(tmp_path / "alibi")
    with pytest.raises(hf.HuggingFaceRefusal, match="saved with position options"):
        hf.from_pretrained(transformers.LlamaForCausalLM, str(tmp_path / "alibi"), expected_options={"rotary": True})
    plain = transformers.LlamaForCausalLM.from_pretrained(tmp_path / "alibi")
    with pytest.raises(hf.HuggingFaceRefusal, match="already has a position method"):
        hf.apply_position_method(plain, alibi=True)
    built("llama").save_pretrained(tmp_path / "plain")
    with pytest.raises(hf.HuggingFaceRefusal, match="saved without a position method"):
        hf.from_pretrained(transformers.LlamaForCausalLM, str(tmp_path / "plain"))


@pytest.mark.parametrize("kind, options, message", [
    ("bert", {"cope": 64}, "an option of causal models only"),
    ("bert", {"forget_gate": True}, "an option of causal models only"),
    ("gpt2", {"no_such_option": 1}, "no position option no_such_option"),
    ("llama", {"kerple": "cubic"}, "must be one of"),
    *(("llama", options, "rescales the projection weights") for options in REFUSED_METHODS.values()),
])
def test_a_method_that_does_not_fit_is_refused_in_one_line(kind, options, message):
    with pytest.raises(posattn.UserError, match=message) as refused:
        switched(kind, **options)
    assert "\n" not in str(refused.value)


def test_a_transform_reading_the_projected_query_is_refused_where_the_model_scales_otherwise():
    """PoPE undoes the queries' 1/sqrt(head_dim) to take softplus of the projected query: GPT-2 scaling its logits
    by the layer's number as well is refused at the call, in one line; the standard scale runs (the control)."""
    ids, mask = torch.tensor([[5, 6, 7, 8]]), torch.ones(1, 4, dtype=torch.long)
    standard = hf.apply_position_method(gpt2().double().eval(), polar=True)
    assert torch.isfinite(output(standard, ids, mask)).all()
    by_layer = hf.apply_position_method(gpt2(scale_attn_by_inverse_layer_idx=True).double().eval(), polar=True)
    with pytest.raises(hf.HuggingFaceRefusal, match="reads the projected query") as refused:
        output(by_layer, ids, mask)
    assert "\n" not in str(refused.value)


def test_an_unsupported_model_is_refused_naming_the_supported_ones():
    config = transformers.OPTConfig(vocab_size=VOCAB, hidden_size=32, ffn_dim=64, num_hidden_layers=1,
                                    num_attention_heads=4, word_embed_proj_dim=32)
    with pytest.raises(hf.HuggingFaceRefusal, match="takes the families Llama, GPT-2, BERT, "):
        hf.apply_position_method(transformers.OPTModel(config))
    decoder = copy.deepcopy(bert().config)
    decoder.is_decoder = True
    with pytest.raises(hf.HuggingFaceRefusal, match="bidirectional encoder"):
        hf.apply_position_method(transformers.BertModel(decoder))
