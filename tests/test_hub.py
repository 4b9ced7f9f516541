"""Hub interfaces (``Model.from_pretrained``) of every model family against fairseq's and our command-line
tools: tiny models trained with the real fairseq-train on the shipped samples, the hub loaded in a fresh
Python process, its outputs compared with fairseq-interactive (translation, sequential and structural, on
raw text through ``--tokenizer posattn_moses --bpe posattn_subword_nmt``), fairseq-eval-lm (perplexity of
``transformer_lm_posattn`` and ``positional_attentive_lstm_lm``) and posattn-tag (the tagger)."""

import math
import os
import re
from typing import Dict, List

import pytest
import torch

from cli_helpers import (SAMPLE, add_structure_in_process, binarize_in_process, error_line, prepare_sample, run,
                         run_python,
                         run_failing)
from fairseq_posattn.data.tagged_corpus import read_tagged_conllu
from fairseq_posattn.data.tagging_binarize import prepare_tagging_data
from model_helpers import USER_DIR
from test_pos_tagging import EWT_DEV, EWT_TRAIN
from test_transformer_lm_cli import DATA as LM_DATA
from test_transformer_lm_cli import PTB, count_tokens
from test_transformer_lm_cli import checkpoint, data_bin  # noqa: F401  (fixtures: PTB binarized, a transformer LM)

pytestmark = pytest.mark.slow

LINES = 120
#: raw English: sample test sentences, and apostrophes, hyphens, numbers with units, literal "@@", an empty line
RAW = [
    *open(os.path.join(SAMPLE, "test.en"), encoding="utf-8").read().splitlines()[:3],
    "A man's well-known dog isn't running 5 km with 3.5kg -- 20% more!",
    "Two people @@ the beach, e-mail me at a@@b @@",
    "",
    "The children's mother-in-law doesn't like the 10-year-old's \"red\" car & its 2.5 m trailer.",
]
#: BPE-level input typed into fairseq-interactive without --tokenizer / --bpe: lines ending in "@@"
BPE_LINES = ["A man in a re@@", "Two dogs run .", "@@", "A @@ @@ b@@ @@", "A woman sits on a bench ."]
TRANSLATION = [
    "--user-dir", USER_DIR, "--arch", "transformer_posattn", "--encoder-layers", "1", "--decoder-layers", "1",
    "--encoder-embed-dim", "32", "--decoder-embed-dim", "32", "--encoder-ffn-embed-dim", "64",
    "--decoder-ffn-embed-dim", "64", "--encoder-attention-heads", "2", "--decoder-attention-heads", "2",
    "--share-all-embeddings", "--max-source-positions", "128", "--max-target-positions", "128",
    "--optimizer", "adam", "--lr", "0.003", "--max-tokens", "2000", "--max-update", "8", "--cpu", "--seed", "1",
    "--no-epoch-checkpoints", "--disable-validation", "--log-format", "simple", "--num-workers", "0",
    "--required-batch-size-multiple", "1",
]
FAMILIES = {
    "sequential": ["--task", "translation", "--encoder-direct-position", "both", "--encoder-learnable-temperature"],
    "structural": ["--task", "translation_structural", "--encoder-structural-positions", "both",
                   "--encoder-structural-fusion", "nonlinear", "--encoder-relative-positions", "4"],
}
GENERATION = {"beam": 3, "max_len_b": 12}
HUB_IMPORTS = """
import math, os
from fairseq.models import ARCH_MODEL_REGISTRY
import fairseq_posattn
from fairseq_posattn.data.tagged_corpus import read_tagged_conllu
OUTPUTS = {}
"""


def interactive_output(output: str) -> Dict[str, Dict[int, str]]:
    """fairseq-interactive's S / H / D lines by kind and id (H, D: ``score<TAB>text``)."""
    found: Dict[str, Dict[int, str]] = {"S": {}, "H": {}, "D": {}}
    for line in output.splitlines():
        match = re.match(r"([SHD])-(\d+)\t(.*)$", line)
        if match:
            found[match.group(1)][int(match.group(2))] = match.group(3)
    return found


# ------------------------------------------------------------------------------ models, and the hub's outputs
@pytest.fixture(scope="module")
def translation(tmp_path_factory):
    """The sample's first 120 lines prepared, binarized, the training side parsed; a sequential and a
    structural model trained on them."""
    root = tmp_path_factory.mktemp("hub_translation")
    prepared = prepare_sample(str(root), lines=LINES)
    destdir = str(root / "data-bin")
    binarize_in_process(prepared, destdir)
    add_structure_in_process(prepared, destdir, ["train"])
    for family, flags in FAMILIES.items():
        run("fairseq-train", [destdir, *TRANSLATION, *flags, "--save-dir", str(root / family)])
    return {"root": root, "prepared": prepared, "data_bin": destdir, "codes": f"{prepared}/bpe.codes"}


@pytest.fixture(scope="module")
def lstm_lm(data_bin, tmp_path_factory):  # noqa: F811
    """A tiny positional attentive LSTM LM on the PTB sample, sentence by sentence."""
    save_dir = str(tmp_path_factory.mktemp("hub_lstm_lm"))
    run("fairseq-train", [
        data_bin, "--user-dir", USER_DIR, "--task", "language_modeling", "--arch", "positional_attentive_lstm_lm",
        "--decoder-embed-dim", "32", "--decoder-hidden-size", "32", "--decoder-out-embed-dim", "32",
        "--decoder-layers", "1", *LM_DATA, "--optimizer", "adam", "--lr", "0.003", "--batch-size", "16",
        "--required-batch-size-multiple", "1", "--max-update", "4", "--cpu", "--seed", "1",
        "--no-epoch-checkpoints", "--disable-validation", "--num-workers", "0", "--save-dir", save_dir])
    return os.path.join(save_dir, "checkpoint_last.pt")


@pytest.fixture(scope="module")
def tagger(tmp_path_factory):
    """A tiny san_tagger trained on the EWT sample, and posattn-tag's output on the dev sample."""
    root = tmp_path_factory.mktemp("hub_tagger")
    data, save_dir, predicted = str(root / "data"), str(root / "ckpt"), str(root / "dev.pred.conllu")
    prepare_tagging_data({"train": [EWT_TRAIN], "valid": [EWT_DEV]}, data)  # what posattn-prepare-tagging runs
    run("fairseq-train", [
        data, "--user-dir", USER_DIR, "--task", "pos_tagging", "--criterion", "pos_tagging", "--arch", "san_tagger",
        "--word-embed-dim", "32", "--encoder-ffn-embed-dim", "64", "--char-cnn-filters", "32", "--encoder-layers", "1",
        "--optimizer", "adam", "--lr", "0.003", "--max-tokens", "1000", "--max-update", "15", "--cpu",
        "--save-dir", save_dir, "--no-epoch-checkpoints", "--disable-validation", "--num-workers", "0"])
    run("posattn-tag", [data, "--path", f"{save_dir}/checkpoint_last.pt", "--input", EWT_DEV,
                        "--output", predicted, "--cpu"])
    return {"data": data, "save_dir": save_dir, "predicted": predicted}


HUB_TRANSLATE = """
OUTPUTS["translation"] = {}
for family in ("sequential", "structural"):
    hub = ARCH_MODEL_REGISTRY["transformer_posattn"].from_pretrained(
        INPUTS["root"] + "/" + family, checkpoint_file="checkpoint_last.pt", data_name_or_path=INPUTS["data_bin"],
        tokenizer="posattn_moses", bpe="posattn_subword_nmt", bpe_codes=INPUTS["codes"])
    hypos = hub.generate([hub.encode(line) for line in INPUTS["raw"]], **INPUTS["generation"])
    typed = hub.generate([hub.binarize(line) for line in INPUTS["bpe_lines"]], **INPUTS["generation"])
    OUTPUTS["translation"][family] = {
        "interface": type(hub).__name__, "task": type(hub.task).__name__,
        "translations": hub.translate(INPUTS["raw"], **INPUTS["generation"]),
        "pieces": [hub.apply_bpe(hub.tokenize(line)) for line in INPUTS["raw"]],
        "sources": [hub.src_dict.string(hub.encode(line)) for line in INPUTS["raw"]],
        "scores": [h[0]["score"].item() / math.log(2) for h in hypos],
        "typed": [hub.tgt_dict.string(h[0]["tokens"]) for h in typed],
        "typed_scores": [h[0]["score"].item() / math.log(2) for h in typed],
    }
"""


HUB_PERPLEXITY = """
lines = open(INPUTS["lm_text"], encoding="utf-8").read().splitlines()
OUTPUTS["perplexity"] = {}
for arch, path in INPUTS["lm_models"].items():
    hub = ARCH_MODEL_REGISTRY[arch].from_pretrained(os.path.dirname(path), checkpoint_file=os.path.basename(path),
                                                    data_name_or_path=INPUTS["lm_data"])
    scored = hub.score(lines)
    OUTPUTS["perplexity"][arch] = {"interface": type(hub).__name__, "perplexity": hub.perplexity(lines),
                     "tokens": sum(len(s["tokens"]) for s in scored)}
"""


HUB_TAG = """
hub = ARCH_MODEL_REGISTRY["san_tagger"].from_pretrained(INPUTS["tagger"], checkpoint_file="checkpoint_last.pt",
                                                        data_name_or_path=INPUTS["tag_data"])
sentences = [s.words for s in read_tagged_conllu(INPUTS["tag_input"], hub.tag_column, require_tags=False)]
OUTPUTS["tagger"] = {"interface": type(hub).__name__, "tags": hub.tag(sentences, batch_size=7),
           "from_strings": hub.tag([" ".join(words) for words in sentences[:5]]),
           "one": hub.tag(" ".join(sentences[0]))}
"""


@pytest.fixture(scope="module")
def hub_outputs(translation, data_bin, checkpoint, lstm_lm, tagger, tmp_path_factory):  # noqa: F811
    """Every family through its hub interface, in one fresh Python process."""
    script = HUB_IMPORTS + HUB_TRANSLATE + HUB_PERPLEXITY + HUB_TAG
    return run_python(script, tmp_path_factory.mktemp("hub"),
                      root=str(translation["root"]), data_bin=translation["data_bin"], codes=translation["codes"],
                      raw=RAW, bpe_lines=BPE_LINES, generation=GENERATION,
                      lm_models={"transformer_lm_posattn": checkpoint, "positional_attentive_lstm_lm": lstm_lm},
                      lm_data=data_bin, lm_text=f"{PTB}/test.txt",
                      tagger=tagger["save_dir"], tag_data=tagger["data"], tag_input=EWT_DEV)


# ---------------------------------------------------------------------------------------------------- tests
def interactive(translation, family: str, lines: List[str], *flags: str) -> Dict[str, Dict[int, str]]:
    task = FAMILIES[family][1]
    out = run("fairseq-interactive", [
        translation["data_bin"], "--user-dir", USER_DIR, "--task", task, "--path",
        str(translation["root"] / family / "checkpoint_last.pt"), "--beam", str(GENERATION["beam"]),
        "--max-len-b", str(GENERATION["max_len_b"]), "--cpu", "--source-lang", "en", "--target-lang", "de", *flags,
    ], input="".join(line + "\n" for line in lines)).stdout
    found = interactive_output(out)
    assert sorted(found["H"]) == list(range(len(lines))), out[-3000:]  # every line translated, in order
    return found


@pytest.mark.parametrize("family", list(FAMILIES))
def test_hub_translates_raw_text_as_fairseq_interactive(translation, hub_outputs, family):
    """The documented encoders in fairseq-interactive and in the hub: the same source pieces (those
    posattn-prepare-translation gives these lines), the same translations and scores."""
    hub = hub_outputs["translation"][family]
    assert hub["interface"] == "GeneratorHubInterface"
    assert hub["task"] == ("TranslationStructuralTask" if family == "structural" else "TranslationTask")
    found = interactive(translation, family, RAW, "--tokenizer", "posattn_moses", "--bpe", "posattn_subword_nmt",
                        "--bpe-codes", translation["codes"], "--buffer-size", "3", "--batch-size", "3")
    assert [found["S"][i] for i in range(len(RAW))] == hub["sources"]
    assert "people @ @ the" in hub["pieces"][4]  # a literal "@@" is two "@" tokens, never a separator
    assert [found["D"][i].split("\t")[1] for i in range(len(RAW))] == hub["translations"]
    scores = [float(found["H"][i].split("\t")[0]) for i in range(len(RAW))]
    assert scores == pytest.approx(hub["scores"], abs=1e-4)
    assert len(set(hub["scores"])) == len(RAW)  # the scores do depend on the input


def test_typed_bpe_lines_ending_in_the_separator_are_translated(translation, hub_outputs):
    """BPE text typed into fairseq-interactive, one line per batch: a line ending in "@@" is read with
    the last piece ending the last word; it and every following line are translated, as in the hub."""
    found = interactive(translation, "structural", BPE_LINES, "--buffer-size", "1")
    hub = hub_outputs["translation"]["structural"]
    assert [found["H"][i].split("\t")[1] for i in range(len(BPE_LINES))] == hub["typed"]
    scores = [float(found["H"][i].split("\t")[0]) for i in range(len(BPE_LINES))]
    assert scores == pytest.approx(hub["typed_scores"], abs=1e-4)


def test_inference_structure_is_the_prepared_side_data(translation):
    """The task's inference path (words rebuilt from the token ids, parsed, aligned) gives the side data
    that posattn-prepare-structure wrote for the same sentences."""
    from fairseq import checkpoint_utils

    path = str(translation["root"] / "structural" / "checkpoint_last.pt")
    _models, _cfg, task = checkpoint_utils.load_model_ensemble_and_task(
        [path], arg_overrides={"data": translation["data_bin"]})
    task.load_dataset("train")
    dataset = task.datasets["train"]
    sources = [dataset.dataset.src[i] for i in range(40)]
    assert not any(task.source_dictionary.unk() in s.tolist() for s in sources)
    for k, side in enumerate(task.source_structure(sources, first_line=1)):
        assert torch.equal(side.long(), torch.as_tensor(dataset.structure[k]).long().view(3, -1)), k


def test_hub_perplexity_is_fairseq_eval_lm_s(data_bin, checkpoint, lstm_lm, hub_outputs):  # noqa: F811
    """``score`` / ``perplexity`` on the sentences of PTB's test.txt = fairseq-eval-lm on the binarized test
    split with --sample-break-mode eos: every word and every end of sentence, one sentence per sample."""
    for arch, path in {"transformer_lm_posattn": checkpoint, "positional_attentive_lstm_lm": lstm_lm}.items():
        result = run("fairseq-eval-lm", [data_bin, "--user-dir", USER_DIR, "--path", path, "--gen-subset", "test",
                                         *LM_DATA, "--max-tokens", "4000", "--cpu", "--num-workers", "0"])
        output = result.stdout + result.stderr
        loss, perplexity = re.search(r"Loss \(base 2\): (\S+), Perplexity: (\S+)", output).groups()
        tokens = int(re.search(r"Evaluated ([0-9,]+) tokens", output).group(1).replace(",", ""))
        hub = hub_outputs["perplexity"][arch]
        assert hub["interface"] == "LanguageModelHubInterface"
        assert hub["tokens"] == tokens
        assert math.log2(hub["perplexity"]) == pytest.approx(float(loss.rstrip(",")), abs=6e-5)
        # eval-lm prints two decimals; the two sums of fp32 losses differ in their order (~1e-6 relative)
        assert hub["perplexity"] == pytest.approx(float(perplexity), rel=1e-5, abs=6e-3)


def test_hub_tags_as_posattn_tag(tagger, hub_outputs):
    """``tag`` of the dev sample's words (lists of words, strings, one sentence) = the tags posattn-tag
    wrote into its CoNLL-U output."""
    hub = hub_outputs["tagger"]
    assert hub["interface"] == "TaggerHubInterface"
    from_cli = [s.tags for s in read_tagged_conllu(tagger["predicted"], "upos")]
    assert hub["tags"] == from_cli
    assert hub["from_strings"] == from_cli[:5] and hub["one"] == from_cli[0]
    assert len({tag for tags in from_cli for tag in tags}) > 1


def test_eval_lm_of_an_lstm_lm_at_evals_default_block_size_refuses_then_scores_every_token(data_bin, lstm_lm):  # noqa: F811
    """The positional attentive LSTM trained with 64 positions, evaluated at fairseq-eval-lm's default
    blocks of 1,024 tokens: fairseq alone scores 0 tokens and prints "Perplexity: 1.00"; the plugin
    refuses naming the override, which then scores every token (no parameter of the LSTM is tied to a length)."""
    common = [data_bin, "--user-dir", USER_DIR, "--path", lstm_lm, "--gen-subset", "test", "--max-tokens", "4000",
              "--cpu", "--num-workers", "0"]
    line = error_line(run_failing("fairseq-eval-lm", common), "fairseq-eval-lm")
    assert "would skip" in line and "64 positions" in line and "'max_target_positions': " in line, line
    output = run("fairseq-eval-lm", [*common, "--model-overrides", "{'max_target_positions': 1024}"])
    output = output.stdout + output.stderr
    scored = int(re.search(r"Evaluated ([0-9,]+) tokens", output).group(1).replace(",", ""))
    assert scored == count_tokens(f"{PTB}/test.txt"), output[-2000:]
    assert math.isfinite(float(re.search(r"Perplexity: (\S+)", output).group(1)))
