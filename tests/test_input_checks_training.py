"""Nothing silently wrong in training and evaluation, round two (issue 46; docs/input_checks.md).

Each case runs the situation of the issue through the real tool on the shipped samples and checks the one-line
refusal (``COMMAND: error: ...``, exit status 1, no traceback) or the result: a resume that changes what the
model computes (every family: the record of the options), ``--amp`` and ``--fp16`` on a CPU, a recipe told to
use GPUs that torch does not see (every recipe), a tagger whose positions are shorter than the data's sentence
pieces, advice that works for the command that was run, and the plugin's refusals under
``fairseq-hydra-train`` and for data that does not fit (structural side data, labels without a class).

A process start costs about 5 s here, so the models are trained once for the module in one process that calls
fairseq-train's own entry point (``fairseq_cli.train.cli_main``, what the console script runs) for each, and the
console commands whose refusals are checked run two at a time; the variants of a case that only need the
refusal's message run through the entry points in one more process (:func:`entry_points`).
"""

import json
import os
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import pytest
import torch
from fairseq import tasks
from fairseq.data import Dictionary
from fairseq.dataclass.utils import convert_namespace_to_omegaconf

from cli_helpers import (BIN, add_structure_in_process, binarize_in_process, error_line, prepare_sample,
                         preprocess_in_process)
from fairseq_posattn.data.sentence_classification import split_corpus
from fairseq_posattn.data.tagging_binarize import prepare_tagging_data
from fairseq_posattn.models import building
from posattn.position_options import PositionOptionError
from fairseq_posattn.models.position_record import encode
from model_helpers import REPO, USER_DIR

PTB = os.path.join(REPO, "data", "ptb_sample")
EWT = os.path.join(REPO, "data", "ud_ewt_sample")
EWT_TRAIN = os.path.join(EWT, "en_ewt-ud-train.sample.conllu")
EWT_DEV = os.path.join(EWT, "en_ewt-ud-dev.sample.conllu")
SST2 = os.path.join(REPO, "data", "sst2_sample")
ENV = dict(os.environ, PATH=BIN + os.pathsep + os.environ["PATH"], OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")

COMMON = ["--user-dir", USER_DIR, "--cpu", "--seed", "1", "--num-workers", "0", "--log-format", "simple",
          "--no-epoch-checkpoints", "--required-batch-size-multiple", "1", "--optimizer", "adam", "--lr", "0.001"]
TRANSLATION = ["--task", "translation_structural", "--arch", "transformer_posattn", "--encoder-layers", "1",
               "--decoder-layers", "1", "--encoder-embed-dim", "16", "--decoder-embed-dim", "16",
               "--encoder-ffn-embed-dim", "32", "--decoder-ffn-embed-dim", "32", "--encoder-attention-heads", "2",
               "--decoder-attention-heads", "2", "--share-all-embeddings", "--max-tokens", "2000"]
LSTM = ["--task", "language_modeling", "--arch", "positional_attentive_lstm_lm", "--decoder-embed-dim", "16",
        "--decoder-hidden-size", "16", "--decoder-layers", "1", "--positional-attention-hidden", "4",
        "--batch-size", "16"]
TAGGER = ["--task", "pos_tagging", "--criterion", "pos_tagging", "--arch", "san_tagger", "--word-embed-dim", "16",
          "--encoder-layers", "1", "--encoder-ffn-embed-dim", "32", "--char-embed-dim", "8", "--char-cnn-filters",
          "16", "--encoder-attention-heads", "2", "--max-tokens", "1000"]
CLASSIFIER = ["--task", "sentence_prediction", "--criterion", "sentence_prediction", "--num-classes", "2",
              "--max-positions", "64", "--arch", "transformer_posattn_classifier", "--encoder-layers", "1",
              "--encoder-embed-dim", "16", "--encoder-ffn-embed-dim", "32", "--encoder-attention-heads", "2",
              "--batch-size", "32"]
SETUP = ["--max-update", "2", "--disable-validation"]
LM = ["--task", "language_modeling", "--arch", "transformer_lm_posattn", "--decoder-layers", "1",
      "--decoder-embed-dim", "16", "--decoder-ffn-embed-dim", "32", "--decoder-attention-heads", "2",
      "--tokens-per-sample", "16", "--batch-size", "16"]
NO_POSITIONS = ["--no-token-positional-embeddings"]
#: the language models whose method is fine-tuned into another (``--decoder-reset-position-options``)
LM_METHODS = {"sinusoidal": [], "cope8": ["--decoder-cope", "8", *NO_POSITIONS],
              "sandwich": ["--decoder-sandwich", "8", *NO_POSITIONS],
              "xpos": ["--decoder-xpos", "--decoder-xpos-scale-base", "16", "--max-target-positions", "2048",
                       *NO_POSITIONS]}
#: the longest sequence xPos at scale base 16 reaches in float32 (its largest key scale a hundredth below the max)
XPOS_LONGEST = 1074
FOX = ["--decoder-forget-gate", *NO_POSITIONS, "--decoder-reset-position-options"]
COPE = "decoder.layers.0.self_attn.row_term.embeddings"


# ------------------------------------------------------------------------------------------ data and models
@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Dict[str, str]:
    """The shipped samples prepared in this process (what the cases read, not what they check): 40 Multi30k
    sentence pairs with spaCy parses of the train and valid sources (none of test), PTB, the EWT sample as
    sentence pieces of at most 60 and of at most 20 words, and SST-2 whose first dev label is one the training
    labels do not have, binarized by fairseq-preprocess as a user would."""
    root = tmp_path_factory.mktemp("training_checks")
    prepared = prepare_sample(str(root), lines=40, bpe_merges=200)
    binarize_in_process(prepared, f"{root}/translation")
    add_structure_in_process(prepared, f"{root}/translation", ["train", "valid"])
    preprocess_in_process(["--only-source", "--task", "language_modeling", "--trainpref", f"{PTB}/train.txt",
                           "--validpref", f"{PTB}/valid.txt", "--testpref", f"{PTB}/test.txt",
                           "--destdir", f"{root}/ptb", "--workers", "1"])
    for length in (60, 20):
        prepare_tagging_data({"train": [EWT_TRAIN], "valid": [EWT_DEV]}, f"{root}/tags{length}", max_length=length)
    return {"root": str(root), "translation": f"{root}/translation", "ptb": f"{root}/ptb",
            "tags60": f"{root}/tags60", "tags20": f"{root}/tags20", "sst2": classification_with_a_new_label(root)}


def classification_with_a_new_label(root: Path) -> str:
    """SST-2's sentence_prediction directories, with dev label 1 turned into '2' before fairseq-preprocess."""
    text, data_bin = root / "sst2-text", root / "sst2"
    split_corpus({"train": f"{SST2}/stsa.binary.train", "valid": f"{SST2}/stsa.binary.dev"}, str(text),
                 labels=["0", "1"])
    labels = (text / "valid.label").read_text(encoding="utf-8").splitlines()
    (text / "valid.label").write_text("\n".join(["2", *labels[1:]]) + "\n", encoding="utf-8")
    for field in ("input0", "label"):
        preprocess_in_process(["--only-source", "--trainpref", text / f"train.{field}", "--validpref",
                               text / f"valid.{field}", "--destdir", data_bin / field, "--workers", "1"])
    return str(data_bin)


ENTRY_POINTS = """
import json, sys
from fairseq_cli import eval_lm, generate, train
from fairseq_posattn.user_errors import user_error_in
MAINS = {"fairseq-train": train.cli_main, "fairseq-generate": generate.cli_main, "fairseq-eval-lm": eval_lm.cli_main}
inputs, outputs, results = sys.argv[1], sys.argv[2], []
for tool, args in json.load(open(inputs)):
    sys.argv = [tool, *args]
    try:
        MAINS[tool]()
        results.append(None)
    except Exception as error:
        cause = user_error_in(error)
        results.append(str(cause) if cause else "no one-line refusal: " + repr(error))
json.dump(results, open(outputs, "w"))
"""


def entry_points(runs: Sequence[Tuple[str, List[str]]], folder: str) -> List[Optional[str]]:
    """Each ``(tool, args)`` through the tool's own entry point (``cli_main``), one after the other in one fresh
    process; the refusal of each (a :class:`UserError`'s message), or None where it ran through."""
    inputs, outputs = os.path.join(folder, "runs.json"), os.path.join(folder, "results.json")
    with open(inputs, "w", encoding="utf-8") as f:
        json.dump(runs, f)
    result = subprocess.run([sys.executable, "-c", ENTRY_POINTS, inputs, outputs], capture_output=True, text=True,
                            env=ENV, cwd=folder)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    with open(outputs, encoding="utf-8") as f:
        return json.load(f)


@pytest.fixture(scope="module")
def trained(data) -> Dict[str, str]:
    """A structural-task translation baseline, a positional attentive LSTM LM with --tokens-per-sample 35 and a
    tagger with --max-source-positions 20 on pieces of 20 words, 2 updates each, in one process."""
    root = data["root"]
    save = {name: os.path.join(root, name) for name in ("translation", "lstm", "tagger20", *LM_METHODS)}
    runs = [("fairseq-train", [data["translation"], *TRANSLATION, *COMMON, *SETUP, "--save-dir", save["translation"]]),
            ("fairseq-train", [data["ptb"], *LSTM, "--tokens-per-sample", "35", *COMMON, *SETUP,
                               "--save-dir", save["lstm"]]),
            ("fairseq-train", [data["tags20"], *TAGGER, "--max-source-positions", "20", *COMMON, *SETUP,
                               "--save-dir", save["tagger20"]])]
    runs += [("fairseq-train", [data["ptb"], *LM, *flags, *COMMON, *SETUP, "--save-dir", save[name]])
             for name, flags in LM_METHODS.items()]
    assert entry_points(runs, root) == [None] * len(runs)
    return {name: os.path.join(folder, "checkpoint_last.pt") for name, folder in save.items()}


def console_runs(data: Dict[str, str], trained: Dict[str, str]) -> Dict[str, Tuple[str, List[str]]]:
    """The console commands of the cases, by case: each is refused."""
    lstm_resume = [data["ptb"], *LSTM, *COMMON, *SETUP, "--save-dir", os.path.dirname(trained["lstm"])]
    return {
        "resume without token positions": ("fairseq-train", [
            data["translation"], *TRANSLATION, *COMMON, *SETUP, "--max-update", "4",
            "--encoder-no-token-positional-embeddings", "--save-dir", os.path.dirname(trained["translation"])]),
        "resume with another N": ("fairseq-train", [*lstm_resume, "--tokens-per-sample", "70", "--max-update", "4"]),
        "amp on a CPU": ("fairseq-train", [data["tags60"], *TAGGER, *COMMON, "--amp", "--no-save"]),
        "fp16 on a CPU": ("fairseq-train", [data["tags60"], *TAGGER, *COMMON, "--fp16", "--no-save"]),
        "tagger shorter than its pieces": ("fairseq-train", [
            data["tags60"], *TAGGER, *COMMON, "--max-source-positions", "20", "--skip-invalid-size-inputs-valid-test",
            "--no-save"]),
        "partial tagging accuracy": ("fairseq-validate", [
            data["tags60"], "--user-dir", USER_DIR, "--task", "pos_tagging", "--path", trained["tagger20"], "--cpu",
            "--max-tokens", "2000", "--skip-invalid-size-inputs-valid-test", "--num-workers", "0"]),
        "override at generation": ("fairseq-generate", [
            data["translation"], "--user-dir", USER_DIR, "--task", "translation_structural", "--path",
            trained["translation"], "--gen-subset", "valid", "--cpu", "--model-overrides", "{'encoder_alibi': True}"]),
        "sentences beyond N": ("fairseq-eval-lm", [
            data["ptb"], "--user-dir", USER_DIR, "--path", trained["lstm"], "--cpu", "--sample-break-mode", "eos",
            "--tokens-per-sample", "35", "--num-workers", "0"]),
        "xPos past its range": ("fairseq-eval-lm", [
            data["ptb"], "--user-dir", USER_DIR, "--path", trained["xpos"], "--cpu", "--num-workers", "0",
            "--tokens-per-sample", str(XPOS_LONGEST + 1)]),
        "a validation split without side data": ("fairseq-train", [
            data["translation"], *TRANSLATION, *COMMON, "--max-update", "1", "--valid-subset", "valid,test",
            "--no-save"]),
        "a label without a class": ("fairseq-train", [data["sst2"], *CLASSIFIER, *COMMON, "--no-save"]),
        "hydra": ("fairseq-hydra-train", [
            "--config-dir", os.path.join(USER_DIR, "configs", "pos_tagging"), "--config-name", "ud_pe_add",
            f"task.data={data['tags60']}", f"common.user_dir={USER_DIR}", "common.cpu=true",
            "+model.max_source_positions=20", f"checkpoint.save_dir={data['root']}/hydra"]),
    }


def entry_point_runs(data: Dict[str, str], trained: Dict[str, str]) -> Dict[str, Tuple[str, List[str]]]:
    """The variants of the cases whose messages are checked, through the entry points (each resume reads the
    trained checkpoint with ``--restore-file`` and writes its own ``--save-dir``)."""
    root = data["root"]
    lstm = [data["ptb"], *LSTM, *COMMON, *SETUP, "--restore-file", trained["lstm"]]
    return {
        "resume with the sentence normaliser": ("fairseq-train", [
            *lstm, "--tokens-per-sample", "35", "--positional-attention-normalizer", "sentence", "--max-update", "3",
            "--save-dir", f"{root}/sentence"]),
        "another N, meant": ("fairseq-train", [
            *lstm, "--tokens-per-sample", "70", "--decoder-reset-position-options", "--max-update", "3",
            "--save-dir", f"{root}/meant"]),
        "another N, recorded since": ("fairseq-train", [
            data["ptb"], *LSTM, *COMMON, *SETUP, "--tokens-per-sample", "70", "--max-update", "4",
            "--save-dir", f"{root}/meant"]),
        "override at evaluation": ("fairseq-eval-lm", [
            data["ptb"], "--user-dir", USER_DIR, "--path", trained["lstm"], "--cpu", "--tokens-per-sample", "35",
            "--num-workers", "0", "--model-overrides", "{'positional_attention_normalizer': 'sentence'}"]),
        "meant at evaluation": ("fairseq-eval-lm", [
            data["ptb"], "--user-dir", USER_DIR, "--path", trained["lstm"], "--cpu", "--tokens-per-sample", "35",
            "--num-workers", "0", "--model-overrides",
            "{'positional_attention_normalizer': 'sentence', 'decoder_reset_position_options': True}"]),
        "sinusoidal to FoX, resumed": ("fairseq-train", [
            data["ptb"], *LM, *FOX, *COMMON, *SETUP, "--max-update", "3", "--restore-file", trained["sinusoidal"],
            "--save-dir", f"{root}/fox"]),
        "sinusoidal to FoX, as advised": ("fairseq-train", [
            data["ptb"], *LM, *FOX, "--reset-optimizer", *COMMON, *SETUP, "--max-update", "3", "--restore-file",
            trained["sinusoidal"], "--save-dir", f"{root}/fox"]),
        **{case: ("fairseq-train", [data["ptb"], *LM, *flags, "--decoder-reset-position-options", *COMMON, *SETUP,
                                    "--lr", "0", "--finetune-from-model", source, "--save-dir", f"{root}/{case}"])
           for case, (source, flags) in fine_tunings(root, trained).items()},
        "FoX at evaluation": ("fairseq-eval-lm", [
            data["ptb"], "--user-dir", USER_DIR, "--path", trained["sinusoidal"], "--cpu", "--tokens-per-sample", "16",
            "--num-workers", "0", "--model-overrides",
            "{'decoder_forget_gate': True, 'decoder_reset_position_options': True}"]),
        "amp on a CPU, LSTM": ("fairseq-train", [data["ptb"], *LSTM, "--tokens-per-sample", "35", *COMMON, "--amp",
                                                 "--no-save"]),
        "amp on a CPU, structural": ("fairseq-train", [data["translation"], *TRANSLATION, *COMMON, "--amp",
                                                       "--no-save"]),
        "generate without side data": ("fairseq-generate", [
            data["translation"], "--user-dir", USER_DIR, "--task", "translation_structural", "--path",
            trained["translation"], "--gen-subset", "test", "--cpu"]),
        "the other direction": ("fairseq-train", [
            data["translation"], *TRANSLATION, *COMMON, "-s", "de", "-t", "en", "--no-save"]),
    }


def fine_tunings(root: str, trained: Dict[str, str]) -> Dict[str, Tuple[str, List[str]]]:
    """Each ``--finetune-from-model`` of one method into another: case -> (the checkpoint, the new method's flags);
    at learning rate 0, so that the weights saved are the ones loaded."""
    return {"FoX to none": (f"{root}/fox/checkpoint_last.pt", NO_POSITIONS),
            "CoPE 8 to 16": (trained["cope8"], ["--decoder-cope", "16", *NO_POSITIONS]),
            "Sandwich to KERPLE": (trained["sandwich"], ["--decoder-kerple", "log", *NO_POSITIONS])}


def run_console(tool: str, args: List[str], cwd: str) -> subprocess.CompletedProcess:
    """A console script of the virtualenv, as a user runs it (one thread: the cores are shared)."""
    return subprocess.run([os.path.join(BIN, tool), *args], capture_output=True, text=True, env=ENV, cwd=cwd)


@pytest.fixture(scope="module")
def outcomes(data, trained) -> Dict[str, object]:
    """Every case's outcome, two processes at a time: the console runs' ``CompletedProcess`` and the entry
    points' refusals, by case; with the bytes of the trained checkpoints before them."""
    before = {name: Path(path).read_bytes() for name, path in trained.items()}
    console, variants = console_runs(data, trained), entry_point_runs(data, trained)
    with ThreadPoolExecutor(max_workers=2) as pool:
        in_one_process = pool.submit(entry_points, list(variants.values()), data["root"])
        started = {case: pool.submit(run_console, tool, args, data["root"]) for case, (tool, args) in console.items()}
        results = {case: future.result() for case, future in started.items()}
        results.update(zip(variants, in_one_process.result()))
    results["checkpoints before"] = before
    return results


def refusal(outcomes: Dict[str, object], case: str, tool: str) -> str:
    """The one line ``TOOL: error: MESSAGE`` of a console case, which exited with status 1 and no traceback."""
    result = outcomes[case]
    assert result.returncode == 1, result.stdout[-2000:] + result.stderr[-3000:]
    return error_line(result, tool)


# ------------------------------------------------------------------------------ 1. a resume as another model
@pytest.mark.slow
def test_a_resume_that_changes_the_function_is_refused(outcomes, trained):
    """Wang et al.'s Table 1 row 4 resumed as row 1, and the positional LSTM resumed with another N or its
    sentence normaliser: refused before anything trains or is written, naming each difference and the flag
    that makes the change explicit; with that flag it trains on, and is then recorded as the new model."""
    line = refusal(outcomes, "resume without token positions", "fairseq-train")
    assert "--encoder-no-token-positional-embeddings: off in the checkpoint, on here" in line
    assert "add --encoder-reset-position-options to fine-tune it" in line
    line = refusal(outcomes, "resume with another N", "fairseq-train")
    assert "--tokens-per-sample (the positional attention's N): 35 in the checkpoint, 70 here" in line
    assert "--decoder-reset-position-options" in line
    assert "--positional-attention-normalizer: block in the checkpoint, sentence here" in outcomes[
        "resume with the sentence normaliser"]
    assert outcomes["another N, meant"] is None and outcomes["another N, recorded since"] is None
    for name, path in trained.items():
        assert Path(path).read_bytes() == outcomes["checkpoints before"][name], name
        assert not [f for f in os.listdir(os.path.dirname(path)) if f.endswith(".tmp")]


@pytest.mark.slow
def test_fine_tuning_one_method_into_another_follows_the_advice(outcomes, data, trained):
    """--decoder-reset-position-options as the refusals advise it: the weights both methods hold load, the new
    method's keep their initialisation, the old one's are dropped (sinusoidal to FoX, FoX to none, CoPE 8 to 16,
    Sandwich to KERPLE; a resume, --finetune-from-model, eval-lm's --model-overrides); a resume that would restore
    the optimizer state into other parameters is refused in one line naming --reset-optimizer."""
    line = outcomes["sinusoidal to FoX, resumed"]
    assert line.startswith("--decoder-reset-position-options: the new method's parameters differ") and (
        "add --reset-optimizer" in line)
    root = data["root"]
    cases = ["sinusoidal to FoX, as advised", *fine_tunings(root, trained), "FoX at evaluation"]
    assert [outcomes[case] for case in cases] == [None] * len(cases)
    saved = {case: (torch.load(source, weights_only=False)["model"],
                    torch.load(f"{root}/{case}/checkpoint_last.pt", weights_only=False)["model"])
             for case, (source, _) in fine_tunings(root, trained).items()}
    for case, (old, new) in saved.items():
        kept = {key for key in set(old) & set(new) if "self_attn." not in key or "_proj." in key}
        assert kept and all(torch.equal(old[key], new[key]) for key in kept - {"decoder.position_record.flags"}), case
    old, new = saved["FoX to none"]
    assert [key for key in old if "token_difference_terms" in key] and not [key for key in new if "self_attn." in key
                                                                          and "_proj." not in key]
    old, new = saved["CoPE 8 to 16"]
    assert old[COPE].shape[-1] == 8 and new[COPE].shape[-1] == 16
    old, new = saved["Sandwich to KERPLE"]
    assert not [key for key in old if "kerple" in key] and [key for key in new if "kerple" in key]


TINY_TRANSLATION = ["--encoder-layers", "1", "--decoder-layers", "1", "--encoder-embed-dim", "16",
                    "--decoder-embed-dim", "16", "--encoder-ffn-embed-dim", "32", "--decoder-ffn-embed-dim", "32",
                    "--encoder-attention-heads", "2", "--decoder-attention-heads", "2"]
TINY_LM = ["--task", "language_modeling", "--decoder-layers", "1", "--decoder-embed-dim", "16",
           "--decoder-ffn-embed-dim", "32", "--decoder-attention-heads", "2", "--tokens-per-sample", "16"]
TINY_LSTM = ["--task", "language_modeling", "--decoder-embed-dim", "16", "--decoder-hidden-size", "16",
             "--decoder-layers", "1", "--tokens-per-sample", "16"]
TINY_CLASSIFIER = ["--task", "sentence_prediction", "--criterion", "sentence_prediction", "--num-classes", "2",
                   "--encoder-layers", "1", "--encoder-embed-dim", "16", "--encoder-ffn-embed-dim", "32",
                   "--encoder-attention-heads", "2"]
TINY_TAGGER = ["--word-embed-dim", "16", "--encoder-layers", "1", "--encoder-ffn-embed-dim", "32",
               "--char-embed-dim", "8", "--char-cnn-filters", "16", "--encoder-attention-heads", "2"]
#: family -> (arch and tiny sizes, a change of what the model computes, the side whose record refuses it); the
#: attentive and baseline LSTMs have no such option that keeps the weights' shapes: their change is refused too,
#: in one line where PyTorch's "size mismatch" traceback was
FAMILIES = {
    "translation encoder": (["--arch", "transformer_posattn", *TINY_TRANSLATION],
                            ["--encoder-no-token-positional-embeddings"], "encoder"),
    "translation decoder": (["--arch", "transformer_posattn", *TINY_TRANSLATION], ["--decoder-alibi"], "decoder"),
    "translation, model-wide": (["--arch", "transformer_posattn", *TINY_TRANSLATION], ["--activation-fn", "gelu"],
                                "encoder"),
    "language model": (["--arch", "transformer_lm_posattn", *TINY_LM], ["--activation-fn", "gelu"], "decoder"),
    "classifier": (["--arch", "transformer_posattn_classifier", *TINY_CLASSIFIER], ["--classifier-pooling", "first"],
                   "encoder"),
    "tagger": (["--task", "pos_tagging", "--arch", "san_tagger", *TINY_TAGGER], ["--activation-fn", "gelu"],
               "encoder"),
    "positional LSTM": (["--arch", "positional_attentive_lstm_lm", *TINY_LSTM],
                        ["--positional-attention-normalizer", "sentence"], "decoder"),
    "Salton's LSTM": (["--arch", "attentive_lstm_lm", *TINY_LSTM], ["--decoder-layers", "2"], "decoder"),
    "baseline LSTM": (["--arch", "baseline_lstm_lm", *TINY_LSTM], ["--decoder-layers", "2"], "decoder"),
}
OTHER_SHAPES = ("Salton's LSTM", "baseline LSTM")


def build(argv: List[str], data: Dict[str, str]) -> torch.nn.Module:
    """A model as fairseq-train builds it (fairseq's parser, the hydra config, ``models.build_model``); the
    tagger for the EWT sample's task, every other model for a dictionary of 20 words."""
    if "pos_tagging" in argv:
        args = building.parse_model_args(argv)
        args.data = data["tags60"]
        cfg = convert_namespace_to_omegaconf(args)
        return tasks.setup_task(cfg.task).build_model(cfg.model)
    words = Dictionary()
    for i in range(20):
        words.add_symbol(f"w{i}")
    return building.build_model(argv, building.DictionaryTask(words, words))


@pytest.mark.parametrize("family", FAMILIES)
def test_every_family_records_what_it_computes(family, data):
    """Weights load into the model they were trained as, whatever changes only the training (dropout, the
    attention kernel, activation checkpointing), and into another one only with ``--{side}-reset-position-options``;
    weights saved before the record load as before."""
    base, change, side = FAMILIES[family]
    weights = build(base, data).state_dict()
    with pytest.raises(PositionOptionError) as refused:
        build([*base, *change], data).load_state_dict(weights)
    assert f"the checkpoint's {side} was trained with other options" in str(refused.value)
    assert f"{change[0]}: " in str(refused.value) and f"'{side}_reset_position_options': True" in str(refused.value)
    changed = base if family in OTHER_SHAPES else [*base, *change]
    if family not in OTHER_SHAPES:
        build([*changed, f"--{side}-reset-position-options"], data).load_state_dict(weights)
    build([*base, "--dropout", "0.3", "--checkpoint-activations"], data).load_state_dict(weights)
    before_the_record = {key: value for key, value in weights.items() if "position_record" not in key}
    build(changed, data).load_state_dict(before_the_record)


def test_weights_with_the_first_record_compare_its_position_flags(data):
    """The record's first form, the side's non-default position flags, is compared as it was; options it did
    not hold are not."""
    base = ["--arch", "transformer_posattn", *TINY_TRANSLATION]
    weights = build(base, data).state_dict()
    weights["encoder.position_record.flags"] = encode("--encoder-alibi")
    weights["decoder.position_record.flags"] = encode("")
    with pytest.raises(PositionOptionError, match="position options '--encoder-alibi' in the checkpoint, "
                                                  "'[(]none[)]' here"):
        build(base, data).load_state_dict(weights)
    build([*base, "--encoder-alibi", "--activation-fn", "gelu"], data).load_state_dict(weights)


# ------------------------------------------------------------------------------------------ 2. --amp on a CPU
@pytest.mark.slow
def test_amp_and_fp16_are_refused_on_a_cpu(outcomes):
    """--amp is CUDA's autocast and scaler, off without CUDA: the tagger, the LSTM LM and the structural
    transformer would train in fp32 with a checkpoint that says amp. --fp16's refusal is one line too."""
    line = refusal(outcomes, "amp on a CPU", "fairseq-train")
    assert "--amp needs a CUDA GPU" in line and "use --bf16" in line
    for family in ("LSTM", "structural"):
        assert outcomes[f"amp on a CPU, {family}"].startswith("--amp needs a CUDA GPU"), family
    assert "--fp16 / --memory-efficient-fp16 need a CUDA GPU" in refusal(outcomes, "fp16 on a CPU", "fairseq-train")


# -------------------------------------------------------------------------- 3. GPUs that torch does not see
RECIPES = sorted(str(path.relative_to(REPO)) for path in Path(REPO, "examples").glob("*/run*.sh"))


def recipe_arguments(recipe: str, tmp_path: Path) -> List[str]:
    """What each recipe needs to get as far as its device (its dry run, where it has one)."""
    if recipe.endswith("run_ud_treebanks.sh"):
        treebank = tmp_path / "ud" / "UD_English-GUM"
        treebank.mkdir(parents=True)
        for split, source in (("train", EWT_TRAIN), ("dev", EWT_DEV)):
            shutil.copy(source, treebank / f"en_gum-ud-{split}.conllu")
        return [str(tmp_path / "ud")]
    if recipe.endswith(("evidence/run.sh", "run_wikitext.sh")):
        return []
    return {"examples/pos_tagging/run.sh": ["--dry-run", EWT_TRAIN, EWT_DEV],
            "examples/sentence_classification/run.sh": ["--dry-run", SST2]}.get(recipe, ["--dry-run"])


@pytest.mark.parametrize("recipe", RECIPES)
def test_every_recipe_refuses_gpus_that_torch_does_not_see(recipe, tmp_path):
    """GPUS=2 where torch sees none (here; one more than it sees elsewhere) trained on one device with half the
    batch the recipe printed: every recipe stops first, in one line, printing and writing nothing. The devices
    torch sees are given as the shared check exports them after its probe (test_the_device_probe_refuses...)."""
    seen = torch.cuda.device_count() if torch.cuda.is_available() else 0
    out = tmp_path / "out"
    env = dict(ENV, GPUS=str(seen + 1), CUDA_DEVICES_SEEN=str(seen), OUT=str(out), OUT_ROOT=str(out),
               EVIDENCE_OUT=str(out), TREEBANKS="English-GUM")
    result = subprocess.run(["bash", os.path.join(REPO, recipe), *recipe_arguments(recipe, tmp_path)],
                            capture_output=True, text=True, env=env, cwd=REPO)
    assert result.returncode == 2, result.stdout[-2000:] + result.stderr[-2000:]
    assert len(result.stderr.splitlines()) == 1, result.stderr
    assert f": GPUS={seen + 1}" in result.stderr and "torch sees" in result.stderr
    assert "+ " not in result.stdout and "==> device" not in result.stdout
    assert not out.exists()


@pytest.mark.slow
def test_the_device_probe_refuses_gpus_that_torch_does_not_see(tmp_path):
    """The check's own probe (torch in a fresh process), in the recipe of the issue."""
    seen = torch.cuda.device_count() if torch.cuda.is_available() else 0
    env = {key: value for key, value in ENV.items() if key != "CUDA_DEVICES_SEEN"}
    result = subprocess.run(["bash", os.path.join(REPO, "examples", "pos_tagging", "run.sh"), "--dry-run", EWT_TRAIN,
                             EWT_DEV], capture_output=True, text=True, cwd=REPO,
                            env=dict(env, GPUS=str(seen + 1), OUT=str(tmp_path / "out")))
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.startswith(f"run.sh: GPUS={seen + 1}") and len(result.stderr.splitlines()) == 1


@pytest.mark.slow
def test_xpos_past_the_range_of_its_scales_is_one_line_at_evaluation(outcomes):
    """fairseq-eval-lm of an xPos model (scale base 16) in blocks one token past what float32 holds of its key
    scales: one line naming the length and what to do, where it printed ``Perplexity: nan``."""
    line = refusal(outcomes, "xPos past its range", "fairseq-eval-lm")
    assert f"a sequence of {XPOS_LONGEST + 1} tokens is longer than xPos reaches in float32" in line
    assert f"pass the type's range from {XPOS_LONGEST + 1} tokens on" in line and "larger scale base" in line


# ---------------------------------------------------------------------------- 4. partial tagging accuracy
@pytest.mark.slow
def test_a_tagger_shorter_than_the_data_pieces_is_refused_at_start_up(outcomes):
    """The issue's tagger (--max-source-positions 20 on pieces of up to 60 words) is refused by fairseq-train, and
    its checkpoint by fairseq-validate --skip-invalid-size-inputs-valid-test, which scored 299 of the 1,433 dev
    words: with every piece within the model's positions, nothing is skipped."""
    for case, tool in (("tagger shorter than its pieces", "fairseq-train"),
                       ("partial tagging accuracy", "fairseq-validate")):
        line = refusal(outcomes, case, tool)
        assert "have up to 60 words (posattn-prepare-tagging --max-length 60)" in line, line
        assert "(--max-source-positions 20)" in line and "Give --max-source-positions 60" in line
        assert "valid on" not in outcomes[case].stdout + outcomes[case].stderr


# ------------------------------------------------------------------------------ 5. advice that cannot work
@pytest.mark.slow
def test_advice_works_for_the_command_that_was_run(outcomes):
    """The record's refusal names --model-overrides, not a training flag, where the options came from
    them (fairseq-generate, fairseq-eval-lm), and the override that says a change is meant works there;
    fairseq-eval-lm of sentences longer than the LSTM's N does not advise the --tokens-per-sample it was given."""
    line = refusal(outcomes, "override at generation", "fairseq-generate")
    assert "--encoder-alibi: off in the checkpoint, on here" in line
    assert "--model-overrides" in line and "-reset-position-options" not in line
    assert "--model-overrides" in outcomes["override at evaluation"]
    assert "-reset-position-options" not in outcomes["override at evaluation"]
    assert outcomes["meant at evaluation"] is None
    line = refusal(outcomes, "sentences beyond N", "fairseq-eval-lm")
    assert "(or give --tokens-per-sample 35 with --sample-break-mode none" in line, line
    assert "lower --tokens-per-sample" not in line


# ----------------------------------------------------------------------------- 6. one line, not a traceback
@pytest.mark.slow
def test_refusals_under_hydra_are_one_line(outcomes):
    line = refusal(outcomes, "hydra", "fairseq-hydra-train")
    assert "the tagger reads at most 20 (--max-source-positions 20)" in line


@pytest.mark.slow
def test_missing_structural_side_data_is_one_line(outcomes, data):
    line = refusal(outcomes, "a validation split without side data", "fairseq-train")
    assert f"no structural side data {data['translation']}/test.en-de.en.structure.{{bin,idx}} for split 'test'" in line
    assert "leave the split out (--valid-subset, --gen-subset)" in line
    assert "for split 'test'" in outcomes["generate without side data"]
    assert (f"the split's side data, {data['translation']}/valid.en-de.en.structure, parses another source "
            f"language than --source-lang de") in outcomes["the other direction"]


@pytest.mark.slow
def test_a_label_without_a_class_is_one_line(outcomes, data):
    """A dev label the training labels lack (fairseq-preprocess binarizes it as <unk>) stopped training with
    "IndexError: Target -1 is out of bounds" at its batch."""
    line = refusal(outcomes, "a label without a class", "fairseq-train")
    assert f"{data['sst2']}/label/valid: sentence 1 (line 1 of the label text" in line
    assert "has the label <unk>" in line and "1 of the split's 200 sentences" in line
