"""A method per layer (``layer_methods``, issue 67): each layer of a side takes the methods its entry names, the
entries repeated as a period over the layers (Llama 4's RoPE / NoPE interleaving is ``rotary,rotary,rotary,none``),
on the three front-ends; the model equals one built layer by layer by hand, decodes step by step as it computes in
full, is recorded in fairseq's checkpoints and Hugging Face's config.json, and every misuse is refused in one line."""

from typing import List, Optional

import pytest
import torch
from torch import nn

import posattn
from posattn.position_terms.registry import method_of

PATTERN = "rotary,rotary,rotary,none"
E, H, VOCAB, LENGTH = 32, 4, 50, 9


class TinyLM(nn.Module):
    """Token embeddings, residual self-attention layers and a head: what separates the layers is only their
    position methods."""

    def __init__(self, layers: List[posattn.SelfAttention]):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, E)
        self.layers = nn.ModuleList(layers)
        self.head = nn.Linear(E, VOCAB)

    def forward(self, tokens: torch.Tensor, caches: Optional[List[posattn.DecodingCache]] = None) -> torch.Tensor:
        x = self.embed(tokens)
        for index, layer in enumerate(self.layers):
            x = x + layer(x, cache=None if caches is None else caches[index])
        return self.head(x)


def pattern_lm(layers: int = 4, **options) -> TinyLM:
    shared = posattn.position_options(True, 64, **options)
    torch.manual_seed(0)
    return TinyLM([posattn.SelfAttention(E, H, causal=True, options=shared, layer_index=i)
                   for i in range(layers)]).double().eval()


def methods_in(layer: posattn.SelfAttention) -> List[str]:
    return [method_of(term).name for term in layer.all_terms()]


def tokens(batch: int = 2) -> torch.Tensor:
    return torch.randint(0, VOCAB, (batch, LENGTH), generator=torch.Generator().manual_seed(1))


# ----------------------------------------------------------------- plain PyTorch
def test_each_layer_takes_its_entrys_methods_repeated_as_a_period():
    model = pattern_lm(6, rotary=True, layer_methods=PATTERN)
    assert [methods_in(layer) for layer in model.layers] == [["rotary"]] * 3 + [[]] + [["rotary"]] * 2
    joined = pattern_lm(3, alibi=True, forget_gate=True, layer_methods="alibi+forget-gate,forget-gate,none")
    assert [sorted(methods_in(layer)) for layer in joined.layers] == [["alibi", "forget-gate"], ["forget-gate"], []]
    everywhere = pattern_lm(2, rotary=True, alibi=True)  # the default: every method on in every layer
    assert [sorted(methods_in(layer)) for layer in everywhere.layers] == [["alibi", "rotary"]] * 2


@torch.no_grad()
def test_the_pattern_model_equals_one_built_layer_by_layer_and_not_the_all_rope_one():
    model = pattern_lm(rotary=True, layer_methods=PATTERN)
    by_hand = TinyLM([*(posattn.SelfAttention(E, H, causal=True, rotary=True, layer_index=i) for i in range(3)),
                      posattn.SelfAttention(E, H, causal=True)]).double().eval()
    by_hand.load_state_dict(model.state_dict())
    all_rope = pattern_lm(rotary=True)
    all_rope.load_state_dict(model.state_dict())
    sentence = tokens()
    torch.testing.assert_close(by_hand(sentence), model(sentence), rtol=0, atol=0)
    assert (all_rope(sentence) - model(sentence)).abs().max() > 1e-3  # the negative control: layer 3 matters


@torch.no_grad()
def test_incremental_decoding_equals_the_full_forward():
    model = pattern_lm(rotary=True, alibi=True, layer_methods="rotary,alibi,rotary+alibi,none")
    sentence = tokens()
    full = model(sentence)
    caches = [posattn.DecodingCache() for _ in model.layers]
    steps = [model(sentence[:, :4], caches)] + [model(sentence[:, i:i + 1], caches) for i in range(4, LENGTH)]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, rtol=1e-10, atol=1e-10)


def test_side_wide_modules_are_shared_by_the_layers_that_use_them():
    model = pattern_lm(3, t5_relative_bias=8, kerple="log", layer_methods="t5-relative-bias,kerple,t5-relative-bias")
    first, second, third = model.layers
    assert sorted(first.position_shared) == ["t5_table"] and sorted(second.position_shared) == ["kerple"]
    assert not third.position_shared  # the table is the first layer's, read, not registered again
    assert third.additive_terms[0].side_table is first.position_shared["t5_table"]
    assert methods_in(second) == ["kerple"]


# ----------------------------------------------------------------- refusals, one line each
REFUSED = {
    "empty entry": ({"rotary": True, "layer_methods": "rotary,,none"}, ["--decoder-layer-methods", "entry 1", "empty"]),
    "none joined": ({"rotary": True, "layer_methods": "rotary+none"}, ["entry 0", "joins none"]),
    "unknown name": ({"rotary": True, "layer_methods": "rotory,none"}, ["'rotory'", "nearest: rotary"]),
    "option name": ({"forget_gate": True, "layer_methods": "forget_gate"}, ["'forget_gate'", "nearest: forget-gate"]),
    "named twice": ({"alibi": True, "layer_methods": "alibi+alibi"}, ["entry 0", "names a method twice"]),
    "named but off": ({"rotary": True, "layer_methods": "rotary,alibi"}, ["names alibi, which is off",
                                                                          "--decoder-alibi"]),
    "on but unnamed": ({"rotary": True, "alibi": True, "layer_methods": "rotary,none"},
                       ["names alibi in no layer", "--decoder-alibi True", "unused"]),
}


@pytest.mark.parametrize("case", REFUSED)
def test_a_pattern_that_cannot_be_honoured_is_refused_in_one_line(case):
    options, words = REFUSED[case]
    with pytest.raises(posattn.PositionOptionError) as refused:
        posattn.position_options(True, 64, **options)
    assert all(word in str(refused.value) for word in words) and "\n" not in str(refused.value), refused.value


def test_what_cannot_be_per_layer_is_refused_in_one_line():
    with pytest.raises(posattn.PositionOptionError, match="forget-gate, a method of causal sides only"):
        posattn.position_options(False, 64, alibi=True, layer_methods="alibi,forget-gate")
    with pytest.raises(posattn.PositionOptionError,
                       match="--encoder-structural-positions absolute gives the side's input a position embedding"):
        posattn.position_options(False, 64, structural_positions="absolute", layer_methods="structural-positions")
    relative = posattn.position_options(False, 64, structural_positions="relative",
                                        layer_methods="structural-positions,none")  # a term per layer: taken
    assert [m.name for m in relative.methods_of_layer(1)] == []
    first_only = posattn.position_options(True, 64, direct_position="relative", layer_methods="direct-position")
    posattn.SelfAttention(E, H, causal=True, options=first_only, layer_index=0)
    with pytest.raises(posattn.PositionOptionError, match="names direct-position in layer 1, for which its own"):
        posattn.SelfAttention(E, H, causal=True, options=first_only, layer_index=1)
    with pytest.raises(posattn.OptionTypeError, match="layer_methods"):
        posattn.position_options(True, 64, rotary=True, layer_methods=["rotary", "none"])


def test_a_layer_without_its_index_or_a_method_only_past_the_last_layer_is_refused():
    options = posattn.position_options(True, 64, rotary=True, layer_methods=PATTERN)
    with pytest.raises(posattn.MisuseError, match="without its layer_index: give each layer its 0-based"):
        posattn.SelfAttention(E, H, causal=True, options=options)
    with pytest.raises(posattn.MisuseError, match="layer_index"):
        posattn.position_method(H, E // H, causal=True, rotary=True, layer_methods=PATTERN)
    assert methods_in(posattn.SelfAttention(E, H, causal=True, rotary=True)) == ["rotary"]  # no pattern: layer 0
    late = posattn.position_options(True, 64, rotary=True, alibi=True, layer_methods="rotary,rotary,alibi")
    late.check_layer_count(3)
    with pytest.raises(posattn.PositionOptionError, match="names alibi only past the side's 2 layers"):
        late.check_layer_count(2)


# ----------------------------------------------------------------- fairseq
def fairseq_lm(pattern: str, *extra: str):
    from model_helpers import build_lm

    torch.manual_seed(0)
    return build_lm("transformer_lm_posattn", ["--decoder-layers", "4", "--decoder-rotary",
                                               "--decoder-layer-methods", pattern, *extra]).eval()


@pytest.fixture(scope="module")
def fairseq_model():
    return fairseq_lm(PATTERN)


def test_fairseq_builds_the_pattern_from_its_option_and_records_it(fairseq_model):
    from fairseq.modules import MultiheadAttention

    from fairseq_posattn.modules.attention import PositionAwareMultiheadAttention

    layers = fairseq_model.decoder.layers
    assert all(isinstance(layer.self_attn, PositionAwareMultiheadAttention) for layer in layers[:3])
    assert [[method_of(term).name for term in layer.self_attn.all_terms()] for layer in layers[:3]] == [["rotary"]] * 3
    assert type(layers[3].self_attn) is MultiheadAttention  # no term: fairseq's own attention
    assert fairseq_model.decoder.position_record.values["decoder_layer_methods"] == PATTERN


@torch.no_grad()
def test_fairseq_decodes_step_by_step_as_in_full(fairseq_model):
    sentence = torch.randint(4, 20, (2, 10), generator=torch.Generator().manual_seed(1))
    full = fairseq_model.decoder(sentence)[0]
    state: dict = {}
    for step in range(sentence.size(1)):
        out = fairseq_model.decoder(sentence[:, : step + 1], incremental_state=state)[0]
        torch.testing.assert_close(out[:, -1], full[:, step], rtol=1e-5, atol=1e-5)


def test_fairseq_weights_of_another_pattern_or_too_few_layers_are_refused(fairseq_model):
    from model_helpers import build_lm

    same = fairseq_lm(PATTERN)
    same.load_state_dict(fairseq_model.state_dict())
    other = fairseq_lm("rotary,none")
    with pytest.raises(posattn.PositionOptionError,
                       match=r"--decoder-layer-methods: rotary,rotary,rotary,none in the checkpoint, rotary,none here"):
        other.load_state_dict(fairseq_model.state_dict())
    with pytest.raises(posattn.PositionOptionError, match="names alibi only past the side's 2 layers"):
        build_lm("transformer_lm_posattn", ["--decoder-rotary", "--decoder-alibi",
                                            "--decoder-layer-methods", "rotary,rotary,alibi"])


# ----------------------------------------------------------------- Hugging Face
@pytest.fixture(scope="module")
def huggingface():
    pytest.importorskip("transformers")
    import posattn_huggingface
    from huggingface_helpers import llama

    return posattn_huggingface, llama


def switched_llama(huggingface, layers: int = 4, **options):
    hf, llama = huggingface
    torch.manual_seed(0)
    return hf.apply_position_method(llama(num_hidden_layers=layers).double().eval(), **options)


def test_huggingface_saves_the_pattern_reloads_it_and_generates_the_same_tokens(huggingface, tmp_path):
    import transformers

    hf, _ = huggingface
    options = {"rotary": True, "layer_methods": PATTERN}
    model = switched_llama(huggingface, **options)
    kernels = [module.position_method for module in model.modules() if hasattr(module, "position_method")]
    assert [[method_of(term).name for term in kernel.all_terms()] for kernel in kernels] == [["rotary"]] * 3 + [[]]
    prompt = {"input_ids": torch.randint(3, 100, (2, 5), generator=torch.Generator().manual_seed(2)),
              "max_new_tokens": 6, "do_sample": False}
    generated = model.generate(**prompt)
    all_rope = switched_llama(huggingface, rotary=True)
    assert not torch.equal(all_rope(prompt["input_ids"]).logits, model(prompt["input_ids"]).logits)
    model.save_pretrained(tmp_path)
    loaded = hf.from_pretrained(transformers.LlamaForCausalLM, str(tmp_path), dtype=torch.float64).eval()
    assert torch.equal(loaded.generate(**prompt), generated)
    with pytest.raises(hf.HuggingFaceRefusal, match="layer_methods='rotary,rotary,rotary,none'"):
        hf.from_pretrained(transformers.LlamaForCausalLM, str(tmp_path),
                           expected_options={"rotary": True, "layer_methods": "rotary,none"})


def test_huggingface_refuses_a_method_named_only_past_the_models_layers(huggingface):
    with pytest.raises(posattn.PositionOptionError, match="names alibi only past the side's 2 layers"):
        switched_llama(huggingface, 2, rotary=True, alibi=True, layer_methods="rotary,rotary,alibi")
