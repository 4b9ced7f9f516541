"""examples/huggingface/: the length-extrapolation recipe with a Llama model switched by posattn_huggingface and
trained with transformers.Trainer, run as a user runs it (its command line in a subprocess, on the shipped PTB
sample, with a budget of seconds): its records in examples/pytorch's shape, every perplexity finite, a finished
run not redone, bad methods refused in one line; Trainer's loss the mean token cross-entropy of the blocks'
aligned targets, its ``inverse_sqrt`` schedule fairseq's but for the warm-up's start; the sliding-window
perplexity against a token-by-token recomputation."""

import json
import math
import subprocess
from pathlib import Path
import pytest

pytest.importorskip("transformers", reason="the Hugging Face recipe needs transformers (pip install '.[hf]')")
pytest.importorskip("accelerate", reason="transformers.Trainer needs accelerate (pip install '.[hf]')")

from extrapolation_example_helpers import (PYTORCH_EXAMPLE, REPO, TESTS, check_scored_record,  # noqa: E402
                                           records_by_key, run_beside, run_recipe)

EXAMPLE = REPO / "examples" / "huggingface"
METHODS = ["alibi", "rotary", "t5-bias", "llama-rope"]
TINY = ["--dim", "32", "--intermediate-size", "64", "--heads", "2", "--updates", "8", "--warmup", "4",
        "--train-length", "32", "--lengths", "32", "64", "--threads", "1"]


def recipe(*args: str) -> subprocess.CompletedProcess:
    return run_recipe(EXAMPLE / "extrapolation.py", *args)


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("huggingface-extrapolation")
    result = recipe("--out", str(out), "--methods", *METHODS, *TINY)
    assert result.returncode == 0, result.stderr[-3000:]
    return out


def test_every_record_is_present_finite_and_shaped_as_the_pytorch_recipes(finished_run):
    records = json.loads((finished_run / "results.json").read_text())
    assert set(records_by_key(records)) == {(method, 1, mode, length) for method in METHODS
                                            for mode in ("nonoverlapping", "sliding") for length in (32, 64)}
    for record in records:
        check_scored_record(record)
    assert len({r["params"] for r in records if r["method"] != "t5-bias"}) == 1  # the T5 buckets add parameters
    run = json.loads((finished_run / "rotary" / "seed1" / "run.json").read_text())
    assert run["command"].startswith("python ") and "--methods alibi rotary" in run["command"] and run["seconds"] > 0
    assert run["settings"]["budget"]["warmup_init_lr"] == 0.0 and "transformers.Trainer" in run["budget"]
    log = (finished_run / "alibi" / "seed1" / "train.log").read_text()
    assert "alibi seed 1 | update 8 | loss " in log  # the line the results page reads
    table = (finished_run / "results.md").read_text()
    assert table.startswith("# Hugging Face") and all(f"| {method} |" in table for method in METHODS)


def test_a_finished_run_is_not_redone(finished_run):
    results = finished_run / "alibi" / "seed1" / "results.json"
    before = results.stat().st_mtime_ns
    result = recipe("--out", str(finished_run), "--methods", "alibi", *TINY)
    assert result.returncode == 0 and "finished already" in result.stdout
    assert results.stat().st_mtime_ns == before


def test_no_positions_is_refused_in_one_line_naming_the_baseline(tmp_path):
    """``none`` (no position information) is examples/pytorch's; here the front-end turns Llama's rotation off only
    for a method (an unknown name goes through examples/pytorch's check, tested there)."""
    result = recipe("--out", str(tmp_path), "--methods", "none")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    error_lines = [line for line in result.stderr.splitlines() if "error:" in line]
    assert len(error_lines) == 1 and "'none' is not a method here" in error_lines[0], result.stderr
    assert "'llama-rope'" in error_lines[0]


#: run with examples/huggingface, examples/pytorch and tests/ on PYTHONPATH: on a tiny ALiBi Llama, Trainer's loss
#: of a batch of blocks (its count of the batch's targets) beside the mean token cross-entropy, its learning rate
#: at every update beside fairseq's schedule, and the recipe's sliding-window perplexity (weights drawn wide, so
#: that the positions matter) beside the token-by-token recomputation
CHECKS = """
import json, tempfile, torch, torch.nn.functional as F
from pathlib import Path
from data import load_corpus, training_blocks
from evaluation import evaluate
from experiment import Protocol
from extrapolation_example_helpers import sliding_perplexity_token_by_token
from llama_model import LlamaSize, NextTokenLogits, build_model
from trainer_training import BlockDataset, training_arguments
from training import Budget, inverse_sqrt_lr
import transformers
torch.set_num_threads(1)
corpus = load_corpus(Path("data/ptb_sample"))
model = build_model(len(corpus.dictionary), "alibi", LlamaSize(32, 64, 2, 2), Protocol(16, (16,)), seed=3)
budget = Budget(updates=300, batch_size=4, warmup_updates=100, warmup_init_lr=0.0)
blocks = BlockDataset(*training_blocks(corpus.train, 16))
trainer = transformers.Trainer(model=model, args=training_arguments(budget, 3, Path(tempfile.mkdtemp()), 100),
                               train_dataset=blocks)
batch = transformers.default_data_collator([blocks[i] for i in range(4)])
_, counted = trainer.get_batch_samples(iter([batch]), 1, torch.device("cpu"))
model.eval()
loss = trainer.compute_loss(model, dict(batch), num_items_in_batch=counted).item()
mean_nll = F.cross_entropy(model(input_ids=batch["input_ids"]).logits.flatten(0, 1), batch["labels"].flatten()).item()
trainer.create_optimizer_and_scheduler(num_training_steps=budget.updates)
rates = []
for update in range(budget.updates):
    rates.append([trainer.lr_scheduler.get_last_lr()[0], inverse_sqrt_lr(update, budget)])
    trainer.optimizer.step()
    trainer.lr_scheduler.step()
with torch.no_grad():
    for parameter in model.parameters():
        parameter.normal_(0, 0.3)
logits = NextTokenLogits(model)
targets = corpus.valid[:40]
print(json.dumps({"counted": int(counted), "loss": loss, "mean_nll": mean_nll, "rates": rates,
                  "recipe": evaluate(logits, targets, "sliding", 16)["ppl"],
                  "direct": sliding_perplexity_token_by_token(logits.eval(), targets, 16)}))
"""


@pytest.fixture(scope="module")
def checks() -> dict:
    return run_beside(CHECKS, EXAMPLE, PYTORCH_EXAMPLE, TESTS)


def test_trainers_loss_is_the_mean_token_cross_entropy_of_every_target(checks):
    assert checks["counted"] == 4 * 16  # every target of the 4 blocks, none lost to a shift
    assert math.isclose(checks["loss"], checks["mean_nll"], rel_tol=1e-6), checks


def test_trainers_inverse_sqrt_is_fairseqs_but_for_the_warm_up_start(checks):
    rates = checks["rates"]
    assert rates[0][0] == 0.0  # the first update's learning rate: 0 (fairseq's warm-up starts from 1e-7)
    for trainer_lr, fairseq_lr in rates:
        assert math.isclose(trainer_lr, fairseq_lr, rel_tol=1e-9, abs_tol=1e-12), rates


def test_the_sliding_perplexity_is_a_token_by_token_recomputation(checks):
    assert math.isclose(checks["recipe"], checks["direct"], rel_tol=1e-5), checks
