"""examples/pytorch/: the plain-PyTorch length-extrapolation recipe, run as a user runs it (its command line in a
subprocess, on the shipped PTB sample, with a budget of seconds): every record of results.json present and finite,
a finished run not redone, a model tied to its positions refusing the longer evaluations in its record, bad
arguments refused in one line; its sliding-window perplexity against a token-by-token recomputation; and its model
against fairseq's ``transformer_lm_posattn``: the same weights give the same logits."""

import importlib.util
import json
import math
import subprocess
from pathlib import Path
from typing import List

import pytest

from extrapolation_example_helpers import (PYTORCH_EXAMPLE as EXAMPLE, TESTS, check_scored_record, records_by_key,
                                           run_beside, run_recipe)

TINY = ["--dim", "32", "--ffn-dim", "64", "--heads", "2", "--updates", "20", "--train-length", "32",
        "--lengths", "32", "64", "--threads", "1"]


def recipe(*args: str) -> subprocess.CompletedProcess:
    return run_recipe(EXAMPLE / "extrapolation.py", *args)


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("pytorch-extrapolation")
    result = recipe("--out", str(out), "--methods", "alibi", "rotary", "direct-absolute", *TINY)
    assert result.returncode == 0, result.stderr[-3000:]
    return out


def test_every_record_is_present_and_finite(finished_run):
    records = json.loads((finished_run / "results.json").read_text())
    assert len(records_by_key(records)) == 3 * 2 * 2
    for record in (r for r in records if r["method"] != "direct-absolute"):
        check_scored_record(record)
    run = json.loads((finished_run / "alibi" / "seed1" / "run.json").read_text())
    assert run["command"].startswith("python ") and "--methods alibi rotary" in run["command"] and run["seconds"] > 0
    table = (finished_run / "results.md").read_text()
    assert "| alibi |" in table and "| rotary |" in table


def test_a_model_tied_to_its_positions_refuses_longer_windows_in_one_line(finished_run):
    records = [r for r in json.loads((finished_run / "results.json").read_text()) if r["method"] == "direct-absolute"]
    assert {(r["length"], r["status"]) for r in records} == {(32, "ok"), (64, "refused")}
    assert all("\n" not in r["error"] and "longer than the 32 positions" in r["error"]
               for r in records if r["status"] == "refused")


def test_a_finished_run_is_not_redone(finished_run):
    results = finished_run / "alibi" / "seed1" / "results.json"
    before = results.stat().st_mtime_ns
    result = recipe("--out", str(finished_run), "--methods", "alibi", *TINY)
    assert result.returncode == 0 and "finished already" in result.stdout
    assert results.stat().st_mtime_ns == before


@pytest.mark.parametrize("args, message", [
    (["--methods", "no-such-method"], "unknown method 'no-such-method'"),
    (["--data-dir", "no-such-folder"], "no train split in no-such-folder"),
])
def test_bad_arguments_are_refused_in_one_line(tmp_path, args: List[str], message: str):
    result = recipe("--out", str(tmp_path), *args)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    error_lines = [line for line in result.stderr.splitlines() if "error:" in line]
    assert len(error_lines) == 1 and message in error_lines[0], result.stderr


#: run with examples/pytorch and tests/ on PYTHONPATH: the recipe's sliding-window perplexity of a small trained
#: model, and the same from one forward pass per token over exactly the tokens that token's window reads
RECOMPUTATION = """
import json, torch
from data import load_corpus
from evaluation import evaluate
from data import training_blocks
from experiment import Protocol, build_model
from extrapolation_example_helpers import sliding_perplexity_token_by_token
from model import ModelSize
from training import Budget, train
torch.set_num_threads(1)
corpus = load_corpus(__import__("pathlib").Path("data/ptb_sample"))
model = build_model(corpus, "alibi", ModelSize(32, 64, 2, 2), Protocol(train_length=16, lengths=(16,)), seed=3)
train(model, *training_blocks(corpus.train, 16), Budget(updates=10), seed=3, log=lambda line: None)
targets = corpus.valid[:40]
recipe = evaluate(model, targets, "sliding", 16)["ppl"]
print(json.dumps({"recipe": recipe, "direct": sliding_perplexity_token_by_token(model.eval(), targets, 16)}))
"""


def test_the_sliding_perplexity_is_a_token_by_token_recomputation():
    values = run_beside(RECOMPUTATION, EXAMPLE, TESTS)
    assert math.isclose(values["recipe"], values["direct"], rel_tol=1e-5), values


#: run with examples/pytorch and tests/ on PYTHONPATH: the fairseq recipe's model (transformer_lm_posattn, its flags)
#: and the example's, the fairseq one's weights (random position parameters) copied into the other under the
#: example's names, on one batch
SAME_LOGITS = """
import json, torch
from model_helpers import TinyTask, build_model
from methods import side_options
from model import ModelSize, PositionLM
torch.manual_seed(0)
task = TinyTask(vocab_size=40, collated_side_data=())
LM = ["--task", "language_modeling", "--decoder-layers", "2", "--decoder-embed-dim", "16", "--decoder-input-dim",
      "16", "--decoder-output-dim", "16", "--decoder-ffn-embed-dim", "32", "--decoder-attention-heads", "2",
      "--tokens-per-sample", "64", "--max-target-positions", "64", "--share-decoder-input-output-embed",
      "--no-token-positional-embeddings", "--dropout", "0.1"]
NAMES = [("decoder.embed_tokens", "embed"), ("decoder.position_shared", "blocks.0.attn.position_shared"),
         ("decoder.layers.", "blocks."), ("self_attn_layer_norm", "attn_norm"), ("self_attn.", "attn."),
         ("final_layer_norm", "ffn_norm")]
largest = {}
for method, flags in [("alibi", ["--decoder-alibi"]), ("rotary", ["--decoder-rotary"]), ("none", []),
                      ("t5-bias", ["--decoder-t5-relative-bias", "8", "--decoder-t5-max-distance", "16"])]:
    fairseq = build_model("transformer_lm_posattn", flags, task, tiny=LM).eval()
    with torch.no_grad():  # position parameters start at zero: random values, so that they count
        for name, parameter in fairseq.named_parameters():
            if "position" in name:
                parameter.normal_()
    ours = PositionLM(len(task.target_dictionary), 1, ModelSize(16, 32, 2, 2), side_options(method, 64, 64)).eval()
    state = {}
    for name, value in fairseq.state_dict().items():
        for theirs, mine in NAMES:
            name = name.replace(theirs, mine)
        state[name] = value
    missing, unexpected = ours.load_state_dict(state, strict=False)
    assert not missing and set(unexpected) <= {"decoder.version", "decoder.position_record.flags",
                                               "decoder.output_projection.weight"}, (missing, unexpected)
    tokens = torch.randint(4, 40, (3, 50))
    with torch.no_grad():
        largest[method] = (fairseq(tokens)[0] - ours(tokens)).abs().max().item()
print(json.dumps(largest))
"""


@pytest.mark.skipif(importlib.util.find_spec("fairseq") is None, reason="needs fairseq")
def test_the_model_computes_what_the_fairseq_recipes_model_computes():
    largest = run_beside(SAME_LOGITS, EXAMPLE, TESTS)
    assert set(largest) == {"alibi", "rotary", "none", "t5-bias"}
    assert all(difference < 1e-4 for difference in largest.values()), largest
