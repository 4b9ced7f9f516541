"""``posattn-inspect`` on tiny checkpoints trained by the real ``fairseq-train``: every plot kind is
drawn and opens, and the JSON numbers equal the models' own attention probabilities, recomputed here
from the layers' inputs (``return_all_hiddens``) and fairseq's own cross-attention output."""

import json
import os
from typing import Dict, List, Tuple

import matplotlib.image
import numpy as np
import pytest
import torch
from fairseq import checkpoint_utils

from cli_helpers import binarize_in_process, prepare_sample, preprocess_in_process, run
from fairseq_posattn.cli.inspect import build_parser
from fairseq_posattn.cli.inspect import main as inspect_main
from fairseq_posattn.inspect import plots
from fairseq_posattn.inspect.capture import Inspection, PositionalTrace, dataset_sample, inspect_model
from fairseq_posattn.modules.attention import PositionAwareMultiheadAttention
from posattn.position_context import PositionContext
from posattn.position_terms.quantities import CURVE, MATRIX
from posattn.position_terms.registry import REGISTRY, method_of
from model_helpers import REPO, USER_DIR, TinyTask, both_sides, build_lm, build_model, randomized, side_flags

LINES = 60
#: one encoder layer with every sequential term and structural positions (our kernel); decoder
#: layer 0 with direct positions (our kernel), layer 1 and cross-attention fairseq's own modules
TRAINED = [
    "--user-dir", USER_DIR, "--task", "translation_structural", "--arch", "transformer_posattn",
    "--encoder-layers", "1", "--decoder-layers", "2", "--encoder-embed-dim", "16", "--decoder-embed-dim", "16",
    "--encoder-ffn-embed-dim", "32", "--decoder-ffn-embed-dim", "32", "--encoder-attention-heads", "2",
    "--decoder-attention-heads", "2", "--max-source-positions", "128", "--max-target-positions", "128",
    "--share-all-embeddings",
    "--encoder-direct-position", "both", "--encoder-learnable-temperature", "--encoder-conv-attention", "2d",
    "--encoder-distance-aware", "--encoder-relative-positions", "4", "--encoder-structural-positions", "both",
    "--encoder-structural-clip", "3", "--decoder-direct-position", "both",
]
TRAINING = ["--optimizer", "adam", "--lr", "0.005", "--max-tokens", "2000", "--cpu", "--seed", "1",
            "--max-update", "3", "--no-epoch-checkpoints", "--no-last-checkpoints", "--log-format", "simple",
            "--required-batch-size-multiple", "1", "--num-workers", "0"]
#: built, not trained: the 1d convolution on both sides, causal DA and direct positions
BUILT = ["--encoder-layers", "1", "--decoder-layers", "1", "--encoder-conv-attention", "1d",
         "--encoder-distance-aware", "--decoder-conv-attention", "1d", "--decoder-distance-aware",
         "--decoder-direct-position", "relative"]
PTB = os.path.join(REPO, "data", "ptb_sample")
LSTM = ["--task", "language_modeling", "--user-dir", USER_DIR, "--arch", "positional_attentive_lstm_lm",
        "--decoder-embed-dim", "16", "--decoder-hidden-size", "16", "--positional-attention-hidden", "4",
        "--tokens-per-sample", "20", "--optimizer", "adam", "--lr", "0.005", "--batch-size", "20",
        "--max-update", "1", "--cpu", "--seed", "1", "--num-workers", "0", "--no-epoch-checkpoints",
        "--disable-validation", "--required-batch-size-multiple", "1"]

#: the files of each kind for the trained model
TRAINED_FILES = {
    "attention": ["encoder-layer0-attention.png", "decoder-layer0-attention.png", "decoder-layer1-attention.png",
                  "cross-layer0-attention.png", "cross-layer1-attention.png"],
    "direct-position": [f"{side}-layer0-direct-position-{what}.png" for side in ("encoder", "decoder")
                        for what in ("absolute", "relative")],
    "learnable-temperature": ["encoder-learnable-temperature-per-head.png"],
    "conv-attention": ["encoder-layer0-conv-attention-filters.png", "encoder-layer0-conv-attention-before-after.png",
                       "encoder-conv-attention-per-head.png"],
    "distance-aware": ["encoder-distance-aware-per-head.png", "encoder-layer0-distance-aware-coefficients.png"],
    "relative-positions": [f"encoder-layer0-relative-positions-{table}.png" for table in ("key", "value")],
    "structural-positions": [f"encoder-layer0-structural-positions-{table}.png" for table in ("key", "value")],
    "structure": ["structure.png"],
}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Dict[str, str]:
    """The first lines of the shipped Multi30k sample, binarized, with spaCy's parses as side data; prepared
    in this process (the preparation is not what this module checks)."""
    from fairseq_posattn.structure.binarize import write_side_data
    from fairseq_posattn.structure.parsers import SpacyParser
    from fairseq_posattn.tasks.translation_structural import structure_prefix

    root = str(tmp_path_factory.mktemp("inspect"))
    prepared = prepare_sample(root, lines=LINES)
    data_bin = os.path.join(root, "data-bin")
    binarize_in_process(prepared, data_bin)
    parser = SpacyParser()
    for split in ("train", "valid", "test"):
        with open(f"{prepared}/{split}.tok.en", encoding="utf-8") as f:
            parses = parser.parse([line.split() for line in f])
        write_side_data(((words, heads, k) for k, (words, heads, _) in enumerate(parses, start=1)),
                        f"{prepared}/{split}.bpe.en", structure_prefix(data_bin, split, "en", "de"))
    with open(f"{prepared}/test.bpe.en", encoding="utf-8") as f:
        sentence = f.readline().strip()
    return {"root": root, "data_bin": data_bin, "sentence": sentence}


@pytest.fixture(scope="module")
def trained(corpus) -> str:
    save_dir = os.path.join(corpus["root"], "checkpoints")
    run("fairseq-train", [corpus["data_bin"], *TRAINED, *TRAINING, "--save-dir", save_dir])
    return os.path.join(save_dir, "checkpoint_best.pt")


@pytest.fixture(scope="module")
def lstm_lm(tmp_path_factory) -> Tuple[str, str]:
    """A positional attentive LSTM LM trained on a PTB slice (binarized in this process)."""
    root = tmp_path_factory.mktemp("ptb")
    data_bin = str(root / "data-bin")
    preprocess_in_process(["--only-source", "--task", "language_modeling", "--workers", "1",
                           "--destdir", data_bin, "--trainpref", f"{PTB}/valid.txt",
                           "--validpref", f"{PTB}/valid.txt", "--testpref", f"{PTB}/test.txt"])
    run("fairseq-train", [data_bin, *LSTM, "--save-dir", str(root / "checkpoints")])
    return data_bin, str(root / "checkpoints" / "checkpoint_last.pt")


# ------------------------------------------------------------------------------------ checks
def assert_pictures(out: str, names: List[str]) -> None:
    """Each PNG exists, opens, and has a sane size."""
    for name in names:
        image = matplotlib.image.imread(os.path.join(out, name))
        height, width = image.shape[:2]
        assert 150 <= height <= 4000 and 200 <= width <= 4000, (name, image.shape)


def inspect_json(data_bin: str, checkpoint: str, out: str, *extra: str) -> Dict:
    inspect_main([data_bin, "--path", checkpoint, "--index", "3", "--format", "json", "--output-dir", out, *extra])
    with open(os.path.join(out, "inspection.json"), encoding="utf-8") as f:
        return json.load(f)


def load(checkpoint: str, data_bin: str):
    models, _cfg, task = checkpoint_utils.load_model_ensemble_and_task([checkpoint], arg_overrides={"data": data_bin})
    return models[0].eval(), task


def head_probabilities(module, x: torch.Tensor, mask, ctx: PositionContext) -> torch.Tensor:
    """heads x T x T self-attention probabilities of one layer for its input ``x`` (T x 1 x C)."""
    if isinstance(module, PositionAwareMultiheadAttention):
        return module(x, x, x, key_padding_mask=ctx, attn_mask=mask, need_head_weights=True)[1][:, 0]
    q = (module.q_proj(x) * module.scaling)[:, 0].view(len(x), module.num_heads, -1).transpose(0, 1)
    k = module.k_proj(x)[:, 0].view(len(x), module.num_heads, -1).transpose(0, 1)
    logits = q @ k.transpose(1, 2)
    return torch.softmax(logits if mask is None else logits + mask, dim=-1)


def own_attention(model, net_input: Dict[str, torch.Tensor]) -> Dict[Tuple[str, int], torch.Tensor]:
    """Self-attention per head from each layer's input; cross-attention averaged over heads, as
    fairseq's decoder returns it for its alignment layer."""
    src, prev = net_input["src_tokens"], net_input["prev_output_tokens"]
    structure = {"src_structure": net_input["src_structure"]} if "src_structure" in net_input else {}
    side_data = None
    if structure:
        depth, tin, tout = net_input["src_structure"].long().unbind(dim=1)
        side_data = {"depth": depth, "tin": tin, "tout": tout}
    expected = {}
    with torch.no_grad():
        encoder_out = model.encoder(src, net_input["src_lengths"], return_all_hiddens=True, **structure)
        ctx = PositionContext.from_tokens(src, model.encoder.padding_idx, False, side_data)
        for layer, module in enumerate(model.encoder.layers):
            expected["encoder", layer] = head_probabilities(
                module.self_attn, encoder_out["encoder_states"][layer], None, ctx)
        inner = model.decoder(prev, encoder_out=encoder_out)[1]["inner_states"]
        ctx = PositionContext.from_tokens(prev, model.decoder.padding_idx, right_padded=True, causal=True)
        for layer, module in enumerate(model.decoder.layers):
            causal = model.decoder.buffered_future_mask(inner[layer])
            expected["decoder", layer] = head_probabilities(module.self_attn, inner[layer], causal, ctx)
            aligned = model.decoder(prev, encoder_out=encoder_out, alignment_layer=layer)[1]["attn"][0]
            expected["cross", layer] = aligned[0]
    return expected


def assert_json_is_the_models_parameters(numbers: Dict, attn, n: int) -> None:
    """The trained encoder layer's parameters, as the model holds them (cropped to n positions)."""
    absolute, relative = (term.weight.detach() for term in attn.additive_terms)
    direct = numbers["direct-position"][0]
    assert (direct["side"], direct["layer"], direct["positions"]) == ("encoder", 0, n)
    assert torch.equal(torch.tensor(direct["absolute"]), absolute[:, :n, :n])
    zero = absolute.size(1) - 1  # a^r's index of i - j = 0
    assert torch.equal(torch.tensor(direct["relative"]), relative[:, zero - (n - 1) : zero + n])
    assert direct["presentation"]["relative"]["ticks"] == [list(range(1 - n, n))]
    assert direct["citation"] == "Dufter et al. 2020, section 2.3"  # the method's declaration names its paper
    gammas = numbers["learnable-temperature"][0]
    assert torch.equal(torch.tensor([gammas[f"gamma_{x}"] for x in "qkv"]), attn.projection_term.gamma.detach())
    da = numbers["distance-aware"][0]
    assert da["citation"] == "Wu et al. 2021, section 3"
    assert torch.equal(torch.tensor([da["w"], da["v"]]), torch.stack([attn.scaling_term.w, attn.scaling_term.v]))
    distance = (torch.arange(n)[:, None] - torch.arange(n)[None, :]).abs()
    w, v = attn.scaling_term.w.detach()[:, None, None], attn.scaling_term.v.detach()[:, None, None]
    expected = (1 + torch.exp(v)) / (1 + torch.exp(v - w * distance))  # Wu et al. eq. 6
    torch.testing.assert_close(torch.tensor(da["coefficients"]), expected)
    conv = numbers["conv-attention"][0]
    assert torch.equal(torch.tensor(conv["filters"]), attn.post_softmax_term.conv.weight[:, 0].detach())
    assert torch.equal(torch.tensor(conv["bias"]), attn.post_softmax_term.conv.bias.detach())
    shaw, structural = attn.key_value_terms
    for method, term in (("relative-positions", shaw), ("structural-positions", structural)):
        tables = numbers[method][0]
        assert torch.equal(torch.tensor(tables["key"]), term.key_table.detach())
        assert torch.equal(torch.tensor(tables["value"]), term.value_table.detach())
        assert tables["presentation"]["key"]["ticks"][0] == list(range(-term.clip, term.clip + 1))


def assert_json_is_the_models_attention(numbers: Dict, model, net_input: Dict[str, torch.Tensor]) -> None:
    assert numbers["source_ids"] == net_input["src_tokens"][0].tolist()
    assert numbers["decoder_ids"] == net_input["prev_output_tokens"][0].tolist()
    expected = own_attention(model.eval(), net_input)
    found = {(m["side"], m["layer"]): torch.tensor(m["probs"]) for m in numbers["attention"]}
    assert found.keys() == expected.keys()
    for (side, layer), probs in found.items():
        mine = probs.mean(dim=0) if side == "cross" else probs
        torch.testing.assert_close(mine, expected[side, layer], atol=1e-5, rtol=1e-4, msg=f"{side} {layer}")


# ------------------------------------------------------------------------------------ tests
@pytest.mark.slow
def test_every_kind_is_drawn_from_the_console_script(corpus, trained, tmp_path):
    """The installed console script on a sentence: the structural task parses it with spaCy, the
    decoder is fed the model's own translation."""
    out = str(tmp_path / "png")
    result = run("posattn-inspect", [corpus["data_bin"], "--path", trained, "--sentence", corpus["sentence"],
                                     "--output-dir", out])
    names = [name for kind in TRAINED_FILES.values() for name in kind]
    assert sorted(os.listdir(out)) == sorted(names)
    assert sorted(os.path.basename(p) for p in result.stdout.split()) == sorted(names)
    assert_pictures(out, names)


@pytest.mark.slow
def test_json_equals_the_models_own_attention(corpus, trained, tmp_path):
    numbers = inspect_json(corpus["data_bin"], trained, str(tmp_path), "--task", "translation_structural")
    assert set(TRAINED_FILES) < set(numbers) and numbers["decoder_input"] == "reference"
    model, task = load(trained, corpus["data_bin"])
    net_input = dataset_sample(task, "test", 3)["net_input"]
    assert_json_is_the_models_attention(numbers, model, net_input)
    before_after = torch.tensor(numbers["conv-attention"][0]["before-after"])  # heads x 2 x queries x keys
    assert before_after[:, 1].tolist() == numbers["attention"][0]["probs"]  # encoder layer 0, after
    torch.testing.assert_close(before_after[:, 0].sum(-1), torch.ones(2, before_after.size(2)))  # S: a softmax
    assert_json_is_the_models_parameters(numbers, model.encoder.layers[0].self_attn, len(numbers["source_ids"]))


@pytest.mark.slow
def test_a_kind_the_model_lacks_is_refused(corpus, trained, tmp_path):
    with pytest.raises(SystemExit, match="nothing to draw for lstm"):
        inspect_main([corpus["data_bin"], "--path", trained, "--index", "0", "--output-dir", str(tmp_path),
                      "--kinds", "structure", "lstm"])
    missing = os.path.join(str(tmp_path), "checkpoint_missing.pt")  # one line naming the file, status 1
    with pytest.raises(SystemExit, match=rf"^posattn-inspect: error: .*{missing}"):
        inspect_main([corpus["data_bin"], "--path", missing, "--index", "0", "--output-dir", str(tmp_path)])


@pytest.mark.slow
def test_positional_lstm_lm(lstm_lm, tmp_path):
    data_bin, checkpoint = lstm_lm
    inspect_main([data_bin, "--path", checkpoint, "--index", "0", "--output-dir", str(tmp_path)])
    assert os.listdir(tmp_path) == ["lstm-positional-attention.png"]
    assert_pictures(str(tmp_path), ["lstm-positional-attention.png"])
    numbers = inspect_json(data_bin, checkpoint, str(tmp_path))
    model, task = load(checkpoint, data_bin)
    src_tokens = dataset_sample(task, "test", 3)["net_input"]["src_tokens"]
    with torch.no_grad():
        weights = model.decoder.extract_features(src_tokens)[1]["memory_attention"][0]
    torch.testing.assert_close(torch.tensor(numbers["lstm"]["weights"]), weights)
    assert numbers["lstm"]["normalizer"] == 20 and numbers["decoder_input"] == "input"


def test_built_model_with_1d_convolutions_and_causal_terms(tmp_path):
    """No training: the 1d filter banks and the decoder's causal terms are captured and drawn, and
    the numbers are the model's own attention."""
    model = build_model("transformer_posattn", BUILT)
    net_input = {"src_tokens": torch.tensor([[4, 5, 6, 7, 8, 2]]), "src_lengths": torch.tensor([6]),
                 "prev_output_tokens": torch.tensor([[2, 9, 10, 11]])}
    inspection = inspect_model(model, TinyTask(), {"net_input": net_input}, "given")
    numbers = json.loads(json.dumps(inspection.to_json(inspection.available_kinds())))
    assert_json_is_the_models_attention(numbers, model, net_input)
    conv = {(c["side"], c["layer"]): c for c in numbers["conv-attention"]}
    assert np.shape(conv["encoder", 0]["filters"]) == (2, 3, 6, 6)  # heads x taps x output x input column
    assert np.shape(conv["decoder", 0]["filters"]) == (2, 3, 4, 4)
    term = model.decoder.layers[0].self_attn.post_softmax_term
    weight = term.conv.weight.detach().view(2, term.max_positions, term.max_positions, 3)
    assert torch.equal(torch.tensor(conv["decoder", 0]["filters"]), weight[:, :4, :4].permute(0, 3, 1, 2))
    paths = plots.draw(inspection, ["direct-position", "distance-aware", "conv-attention"], str(tmp_path))
    assert "decoder-layer0-conv-attention-filters.png" in os.listdir(tmp_path)
    assert_pictures(str(tmp_path), [os.path.basename(p) for p in paths])


def assert_shown_biases_are_added(numbers: Dict, module, side: str, length: int) -> None:
    """Each additive bias of a layer 0 shows what it adds to the logits of an unpadded sentence:
    its (query position, key position) matrix, or its curve over i - j on every diagonal i - j."""
    ctx = PositionContext.from_padding(torch.zeros(1, length, dtype=torch.bool), True)
    for term in module.additive_terms:
        bias = term(ctx, length, length)[0].detach()  # heads x queries x keys
        entry = next(e for e in numbers[method_of(term).name] if e["side"] == side and e["layer"] in (0, None))
        shown = [q for q in term.inspect(length) if q.layout in (MATRIX, CURVE)]
        assert shown, f"{type(term).__name__} shows no bias"
        for q in shown:
            values = torch.tensor(entry[q.name])
            if q.layout == MATRIX:
                torch.testing.assert_close(values, bias)
            for k, distance in enumerate(q.ticks[0] if q.layout == CURVE else ()):
                diagonal = bias.diagonal(offset=-distance, dim1=-2, dim2=-1)  # the entries with i - j = distance
                torch.testing.assert_close(values[:, k, None].expand_as(diagonal), diagonal)


#: the methods that learn nothing and draw no fixed pattern: nothing to show
SHOWS_NOTHING = {"selective": "its bias is the running sum of earlier queries' selections, data alone",
                 "stick-breaking": "no parameters; its weights are the logits' alone"}


def test_every_registered_method_is_shown(tmp_path):
    """Every method at once on both sides (random parameters): each is a kind of its own, from its
    terms' quantities; the biases shown over i - j are the ones the model adds (T5's shared table
    once per side), RoPE's pattern is its own rotation of equal contents, and every file draws."""
    flags = [*side_flags("encoder", "combined"), *side_flags("decoder", "combined")]
    model = randomized(build_model("transformer_posattn", flags))
    net_input = {"src_tokens": torch.tensor([[4, 5, 6, 7, 8, 2]]), "src_lengths": torch.tensor([6]),
                 "prev_output_tokens": torch.tensor([[2, 9, 10, 11, 12]])}
    inspection = inspect_model(model, TinyTask(), {"net_input": net_input}, "given")
    shown = [name for name in REGISTRY  # the structural positions need parses
             if name != "structural-positions" and REGISTRY[name].combined and name not in SHOWS_NOTHING]
    assert inspection.available_kinds() == ["attention", *shown]
    assert build_parser().parse_args(["data", "--path", "x", "--index", "0", "--kinds", *shown]).kinds == shown
    numbers = json.loads(json.dumps(inspection.to_json(inspection.available_kinds())))
    assert_json_is_the_models_attention(numbers, model, net_input)
    for side, length in (("encoder", 6), ("decoder", 5)):
        layer = getattr(model, side).layers[0].self_attn
        assert_shown_biases_are_added(numbers, layer, side, length)
        rotary = layer.query_key_terms[0]
        ones = torch.ones(1, 1, length, rotary.head_dim)
        q, k = rotary(ones, ones, PositionContext.from_padding(torch.zeros(1, length, dtype=torch.bool), True))
        logits = (q @ k.transpose(-1, -2))[0] / rotary.head_dim
        pattern = torch.tensor(next(e for e in numbers["rotary"] if e["side"] == side)["angle-pattern"])[0]
        for k, distance in enumerate(range(1 - length, length)):
            diagonal = logits.diagonal(offset=-distance, dim1=-2, dim2=-1)[0]
            torch.testing.assert_close(pattern[k].expand_as(diagonal), diagonal)
    assert [(e["side"], e["layer"]) for e in numbers["t5-relative-bias"]] == [("encoder", None), ("decoder", None)]
    paths = plots.draw(inspection, inspection.available_kinds(), str(tmp_path))
    names = {os.path.basename(p) for p in paths}
    assert {"encoder-t5-relative-bias-table.png", "decoder-layer1-alibi-bias.png",
            "encoder-layer1-rotary-angle-pattern.png", "decoder-learnable-temperature-per-head.png"} <= names
    assert sorted(names) == sorted(os.listdir(tmp_path))
    assert_pictures(str(tmp_path), sorted(names))


def test_a_side_shared_parameter_is_shown_once_for_the_side_and_its_bars_keep_the_heads_order(tmp_path):
    """KERPLE's r1 and r2 are one set per side: shown without a layer, labelled by head, r2's bars in r1's order."""
    model = randomized(build_lm("transformer_lm_posattn", ["--decoder-kerple", "log", "--decoder-attention-heads",
                                                           "4"]))
    net_input = {"src_tokens": torch.tensor([[2, 4, 5, 6, 7]]), "src_lengths": torch.tensor([5])}
    inspection = inspect_model(model, TinyTask(), {"net_input": net_input}, "input")
    (entry,) = [t for t in inspection.terms if t.method == "kerple"]
    assert entry.layer is None
    series = plots.per_head_series([entry])["decoder"]
    (r1_labels, r1), (r2_labels, _) = series.values()
    assert r1_labels == r2_labels == ["H0", "H1", "H2", "H3"]
    r1_order, r2_order = plots.bar_orders(series).values()
    assert list(r2_order) == list(r1_order) and list(r1[r1_order]) == sorted(r1, reverse=True)
    names = {os.path.basename(p) for p in plots.draw(inspection, ["kerple"], str(tmp_path))}
    assert names == {"decoder-kerple-bias.png", "decoder-kerple-per-head.png"}


def test_transformer_language_model_has_causal_decoder_maps():
    model = build_lm("transformer_lm_posattn", ["--decoder-direct-position", "both"])
    net_input = {"src_tokens": torch.tensor([[2, 4, 5, 6, 7]]), "src_lengths": torch.tensor([5])}
    inspection = inspect_model(model, TinyTask(), {"net_input": net_input}, "input")
    assert [(m.side, m.layer, m.kernel) for m in inspection.attention] == [
        ("decoder", 0, "posattn"), ("decoder", 1, "fairseq")]
    assert inspection.decoder_tokens == ["</s>", "w0", "w1", "w2", "w3"] and inspection.source_tokens == []
    for m in inspection.attention:
        assert torch.equal(m.probs.triu(diagonal=1), torch.zeros(2, 5, 5))
        torch.testing.assert_close(m.probs.sum(-1), torch.ones(2, 5))
    assert inspection.available_kinds() == ["attention", "direct-position"]


def test_long_sentences_label_every_kth_token_and_stay_bounded(tmp_path):
    """A 150-token sentence: at most MAX_TICKS labels per axis, the figure capped in size."""
    tokens = [f"w{i}" for i in range(150)]
    probs = torch.softmax(torch.randn(2, 150, 150), dim=-1)
    plots.heatmap_grid([plots.Panel(p.numpy(), f"head {h}", tokens, tokens) for h, p in enumerate(probs)],
                       "long", str(tmp_path / "long.png"))
    height, width = matplotlib.image.imread(str(tmp_path / "long.png")).shape[:2]
    assert width <= 2 * plots.PANEL_INCHES[1] * plots.DPI + 200 and height <= plots.PANEL_INCHES[1] * plots.DPI + 200


def test_lstm_plot_takes_the_documented_trace(tmp_path):
    """The LSTM picture needs only a PositionalTrace: mu, sigma (T) and weights (T x T)."""
    steps = 12
    weights = torch.tril(torch.rand(steps, steps), diagonal=-1)
    weights = weights / weights.sum(-1, keepdim=True).clamp(min=1e-9)
    trace = PositionalTrace([f"t{i}" for i in range(steps)], torch.linspace(0, 0.5, steps),
                            torch.full((steps,), 0.1), weights, 20.0)
    inspection = Inspection([], [], trace.tokens, list(range(steps)), "input", [], [], lstm=trace)
    assert inspection.available_kinds() == ["lstm"]
    paths = plots.draw(inspection, ["lstm"], str(tmp_path))
    assert_pictures(str(tmp_path), [os.path.basename(p) for p in paths])
    assert np.allclose(inspection.to_json(["lstm"])["lstm"]["weights"], weights.numpy())


@pytest.mark.parametrize("name", [name for name, method in REGISTRY.items()
                                  if not method.combined and name != "structural-positions"])  # needs parses
def test_every_method_outside_the_all_at_once_model_is_shown_alone(name, tmp_path):
    """A method that cannot join the others (it excludes a term they use) is a kind of its own in a model of its
    first variant, on every side that takes it, and draws; or, where it learns nothing and has no fixed pattern,
    shows nothing (``SHOWS_NOTHING``)."""
    variant = next(iter(REGISTRY[name].variants))
    model = randomized(build_model("transformer_posattn", both_sides(variant)))
    net_input = {"src_tokens": torch.tensor([[4, 5, 6, 7, 8, 2]]), "src_lengths": torch.tensor([6]),
                 "prev_output_tokens": torch.tensor([[2, 9, 10, 11, 12]])}
    inspection = inspect_model(model, TinyTask(), {"net_input": net_input}, "given")
    assert inspection.available_kinds() == ["attention"] + ([] if name in SHOWS_NOTHING else [name])
    paths = plots.draw(inspection, inspection.available_kinds(), str(tmp_path))
    assert_pictures(str(tmp_path), sorted(os.path.basename(p) for p in paths))
