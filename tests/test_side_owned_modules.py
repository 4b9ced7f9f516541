"""A side owns what its layers share: T5's relative-bias table is registered once, on the side
(``{side}.position_shared.t5_table.weight``), every layer's term reads that one parameter, and weights
saved when each layer registered a copy load through the side's upgrade. And the kernel returns what
inspection needs (the softmax before the post-softmax transform) instead of keeping it on the module."""

from typing import Dict, List

import pytest
import torch
from torch import nn

from fairseq_posattn.models.position_side import SharedCopiesDifferError
from posattn.position_options import SidePositionOptions
from fairseq_posattn.modules.attention import AttentionWeights, PositionAwareMultiheadAttention
from posattn.position_terms.t5_bias import T5RelativeBias
from model_helpers import build_lm, build_model, side_flags
from reference_attention import randomize_, reference_attention, sentence_of
from test_attention_terms import E, H, T_MAX, VARIANTS, batch, causal_mask, context
from test_pos_tagging import build_tagger

T5_FLAGS = {side: side_flags(side, "t5-bias") for side in ("encoder", "decoder")}
#: the encoder's first layer also has the two direct terms, so T5's term is additive term 2 there, 0 in layer 1
TRANSLATION_FLAGS = [*T5_FLAGS["encoder"], "--encoder-direct-position", "both", *T5_FLAGS["decoder"]]
NET_INPUT = {"src_tokens": torch.tensor([[4, 5, 6, 7, 2], [1, 4, 5, 6, 2]]), "src_lengths": torch.tensor([5, 4]),
             "prev_output_tokens": torch.tensor([[2, 8, 9, 10], [2, 8, 9, 1]])}

#: the keys of T5's table in weights saved before the side owned it: a copy under every layer's term,
#: ``{side}.layers.{i}.self_attn.additive_terms.{j}.table`` (j: the term's place among the layer's
#: additive terms), as the code of commit 7fb887d saves ``TRANSLATION_FLAGS``' model
OLD_LAYOUT = {
    "encoder.position_shared.t5_table.weight": ["encoder.layers.0.self_attn.additive_terms.2.table",
                                                "encoder.layers.1.self_attn.additive_terms.0.table"],
    "decoder.position_shared.t5_table.weight": ["decoder.layers.0.self_attn.additive_terms.0.table",
                                                "decoder.layers.1.self_attn.additive_terms.0.table"],
}


def shared_tables(model: nn.Module) -> Dict[str, torch.Tensor]:
    return {key: value for key, value in model.state_dict().items() if "t5" in key or key.endswith(".table")}


def randomized_tables(model: nn.Module) -> nn.Module:
    """Random side tables (they start at zero) and direct terms, in eval mode."""
    for seed, (name, module) in enumerate(model.named_modules()):
        if name.endswith("position_shared") or name.endswith("additive_terms"):
            randomize_(module, seed)
    return model.eval()


def old_layout(state_dict: Dict[str, torch.Tensor], layout: Dict[str, List[str]]) -> Dict[str, torch.Tensor]:
    """A state dict of the current layout renamed to the one before the side owned its table: the
    side's one table copied under each layer's key of ``layout``, and the side's key dropped."""
    old = dict(state_dict)
    for key, copies in layout.items():
        table = old.pop(key)
        old.update((copy, table.clone()) for copy in copies)
    return old


def test_t5_table_is_in_the_state_dict_once_per_side_and_every_layer_reads_it():
    model = build_model("transformer_posattn", TRANSLATION_FLAGS)
    assert sorted(shared_tables(model)) == sorted(OLD_LAYOUT)
    for side in (model.encoder, model.decoder):
        table = side.position_shared.t5_table.weight
        terms = [t for layer in side.layers for t in layer.self_attn.additive_terms if isinstance(t, T5RelativeBias)]
        assert len(terms) == len(side.layers) and all(term.table is table for term in terms)
        assert all(not list(term.parameters()) for term in terms)
    lm = build_lm("transformer_lm_posattn", T5_FLAGS["decoder"])
    assert list(shared_tables(lm)) == ["decoder.position_shared.t5_table.weight"]


@torch.no_grad()
def test_weights_of_the_old_layout_load_through_the_upgrade_with_identical_outputs():
    model = randomized_tables(build_model("transformer_posattn", TRANSLATION_FLAGS))
    expected = model(**NET_INPUT)[0]
    old = old_layout(model.state_dict(), OLD_LAYOUT)
    assert not shared_tables(model).keys() & old.keys()
    loaded = build_model("transformer_posattn", TRANSLATION_FLAGS).eval()
    loaded.load_state_dict(old)  # fairseq's: upgrade_state_dict, then strict loading
    assert torch.equal(loaded(**NET_INPUT)[0], expected)
    for key, table in shared_tables(model).items():
        assert torch.equal(loaded.state_dict()[key], table)


def test_temperatures_saved_under_their_old_module_name_load_with_identical_outputs():
    """0.2.0 saved the learnable temperature as ``...self_attn.temperature.gamma``; the kernel now holds
    it as its projection scaling (``projection_term``), and fairseq's loading renames the key."""
    flags = [*side_flags("encoder", "temperature"), *side_flags("decoder", "temperature")]
    model = build_model("transformer_posattn", flags).eval()
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name.endswith("projection_term.gamma"):
                parameter.uniform_(0.5, 1.5)
    expected = model(**NET_INPUT)[0]
    old = {key.replace(".projection_term.", ".temperature."): value for key, value in model.state_dict().items()}
    assert sum(".temperature.gamma" in key for key in old) == 4  # two layers on each side
    loaded = build_model("transformer_posattn", flags).eval()
    loaded.load_state_dict(old)
    assert torch.equal(loaded(**NET_INPUT)[0], expected)


def test_old_layer_copies_that_differ_are_refused_naming_the_key():
    model = build_model("transformer_posattn", TRANSLATION_FLAGS)
    old = old_layout(model.state_dict(), OLD_LAYOUT)
    differing = OLD_LAYOUT["encoder.position_shared.t5_table.weight"][1]
    old[differing] = old[differing] + 1
    with pytest.raises(SharedCopiesDifferError, match=f"checkpoint's {differing} differs") as error:
        build_model("transformer_posattn", TRANSLATION_FLAGS).load_state_dict(old)
    assert "\n" not in str(error.value)


@torch.no_grad()
def test_tagger_owns_its_table_and_loads_the_old_layout(tmp_path):
    flags = ["--position-embedding", "none", *T5_FLAGS["encoder"]]
    _, model = build_tagger(tmp_path, *flags)
    layout = {"encoder.position_shared.t5_table.weight": [
        f"encoder.layers.{i}.self_attn.additive_terms.0.table" for i in range(len(model.encoder.layers))]}
    assert list(shared_tables(model)) == list(layout)
    randomized_tables(model)
    _, loaded = build_tagger(tmp_path, *flags)
    loaded.load_state_dict(old_layout(model.state_dict(), layout))
    assert torch.equal(loaded.encoder.position_shared.t5_table.weight, model.encoder.position_shared.t5_table.weight)


@torch.no_grad()
def test_incremental_decoding_builds_the_sides_bias_once_per_sequence():
    """Every layer adds the side's one bias: a decoded sequence keeps one T5 table, not one per layer."""
    model = randomized_tables(build_model("transformer_posattn", TRANSLATION_FLAGS))
    encoder_out = model.encoder(NET_INPUT["src_tokens"][:1], NET_INPUT["src_lengths"][:1])
    state: Dict[str, Dict[str, torch.Tensor]] = {}
    tokens = NET_INPUT["prev_output_tokens"][:1]
    steps = [model.decoder(tokens[:, : n + 1], encoder_out, incremental_state=state)[0] for n in range(tokens.size(1))]
    full = model.decoder(tokens, encoder_out)[0]
    torch.testing.assert_close(torch.cat(steps, dim=1), full)
    tables = model.decoder.get_incremental_state(state, "position_tables")
    assert [key[0] for key in tables if isinstance(key[0], nn.Module)] == [model.decoder.position_shared.t5_table]


class Side(nn.Module):
    """The smallest side: two layers' attention and the modules they share, registered once."""

    def __init__(self, causal: bool):
        super().__init__()
        options = SidePositionOptions(side="decoder" if causal else "encoder", causal=causal, max_positions=T_MAX,
                                      max_positions_option="--max-positions", **VARIANTS["t5-bias"])
        options.validate()
        self.layers = nn.ModuleList(PositionAwareMultiheadAttention(E, H, options.build_terms(i, H, E // H))
                                    for i in range(2))
        self.position_shared = nn.ModuleDict(options.shared)

    def forward(self, x: torch.Tensor, **call) -> torch.Tensor:
        return self.layers[1](self.layers[0](x, x, x, **call)[0], x, x, **call)[0]


@pytest.mark.parametrize("causal,padding", [(False, "left"), (True, "right")])
def test_layers_add_the_sides_table_and_its_gradient_is_theirs(causal, padding):
    """Each layer adds the side's (random) table as the reference computes it; finite differences
    check the gradient of the side's one parameter through both layers."""
    side = Side(causal).double().eval()
    randomize_(side, seed=3)
    x, mask = batch(padding, lengths=(5, 3))
    call = dict(key_padding_mask=context(mask, x, causal), attn_mask=causal_mask(x.size(0)) if causal else None)
    attn = side.layers[0]
    with torch.no_grad():
        _, probs = attn(x, x, x, need_head_weights=True, **call)
        for b in range(x.size(1)):
            real = ~mask[b]
            _, ref_probs = reference_attention(attn, sentence_of(x, b, mask), causal)
            torch.testing.assert_close(probs[:, b][:, real][:, :, real], ref_probs, rtol=1e-9, atol=1e-9)

    def through_both_layers(table: torch.Tensor) -> torch.Tensor:
        return torch.func.functional_call(side, {"position_shared.t5_table.weight": table}, (x,), call)

    table = side.position_shared.t5_table.weight.detach().clone().requires_grad_()
    assert torch.autograd.gradcheck(through_both_layers, (table,), eps=1e-6, atol=1e-5)


@torch.no_grad()
def test_inspection_call_returns_the_softmax_before_the_transform():
    """``return_softmax_before_transform``: the weights come back with S, in fairseq's layout; the
    module keeps nothing, and fairseq's own call still gets a tensor of weights."""
    options = SidePositionOptions(side="encoder", causal=False, max_positions=T_MAX,
                                  max_positions_option="--max-positions", **VARIANTS["conv-2d"])
    attn = PositionAwareMultiheadAttention(E, H, options.build_terms(0, H, E // H)).double()
    randomize_(attn, seed=1)
    attn.eval()
    x, mask = batch("left")
    ctx = context(mask, x)
    before = dict(vars(attn))
    out, returned = attn(x, x, x, key_padding_mask=ctx, need_head_weights=True, return_softmax_before_transform=True)
    assert vars(attn).keys() == before.keys()
    plain_out, weights = attn(x, x, x, key_padding_mask=ctx, need_weights=True, need_head_weights=True)
    assert isinstance(returned, AttentionWeights) and isinstance(weights, torch.Tensor)
    torch.testing.assert_close(out, plain_out, rtol=0, atol=0)
    torch.testing.assert_close(returned.weights, weights, rtol=0, atol=0)
    assert returned.softmax.shape == weights.shape  # heads x batch x queries x keys
    torch.testing.assert_close(returned.softmax.sum(-1), torch.ones_like(returned.softmax[..., 0]))
    assert not torch.allclose(returned.softmax, returned.weights)
    _, averaged = attn(x, x, x, key_padding_mask=ctx, return_softmax_before_transform=True)
    torch.testing.assert_close(averaged.softmax, returned.softmax.mean(dim=0))
