"""Language modelling end to end through fairseq's real command-line tools, in subprocesses, on the
shipped PTB sample (data/ptb_sample): fairseq-preprocess --only-source, fairseq-train of
``transformer_lm_posattn`` with several decoder position terms on at once, fairseq-eval-lm and
fairseq-interactive (sampling, incremental decoding) from the checkpoint in fresh processes, and the
start-up check of --tokens-per-sample against --max-target-positions."""

import math
import os
import re

import pytest

from cli_helpers import error_line, hypotheses, run, run_failing
from model_helpers import REPO, USER_DIR

pytestmark = pytest.mark.slow

PTB = os.path.join(REPO, "data", "ptb_sample")
TINY = [
    "--user-dir", USER_DIR, "--task", "language_modeling", "--arch", "transformer_lm_posattn",
    "--decoder-layers", "2", "--decoder-embed-dim", "32", "--decoder-input-dim", "32",
    "--decoder-output-dim", "32", "--decoder-ffn-embed-dim", "64", "--decoder-attention-heads", "2",
    "--share-decoder-input-output-embed",
]
VARIANTS = [
    "--decoder-direct-position", "both", "--decoder-distance-aware", "--decoder-relative-positions", "4",
    "--decoder-conv-attention", "2d", "--decoder-learnable-temperature",
]
# sentence-level samples; the longest valid / test sentence (57 words + eos) fits the 64 positions
DATA = ["--sample-break-mode", "eos", "--tokens-per-sample", "32", "--max-target-positions", "64"]
TRAINING = [
    "--optimizer", "adam", "--lr", "0.001", "--batch-size", "16", "--required-batch-size-multiple", "1",
    "--cpu", "--seed", "1", "--no-epoch-checkpoints", "--disable-validation", "--num-workers", "0",
    "--log-format", "simple", "--log-interval", "1",
]


def count_tokens(path: str) -> int:
    """Words plus one end of sentence per line: what fairseq-eval-lm must score."""
    with open(path, encoding="utf-8") as f:
        lines = f.read().splitlines()
    return sum(len(line.split()) for line in lines) + len(lines)


@pytest.fixture(scope="module")
def data_bin(tmp_path_factory):
    root = tmp_path_factory.mktemp("ptb_lm")
    destdir = str(root / "data-bin")
    run("fairseq-preprocess", [
        "--only-source", "--task", "language_modeling", "--workers", "1",
        "--trainpref", f"{PTB}/train.txt", "--validpref", f"{PTB}/valid.txt", "--testpref", f"{PTB}/test.txt",
        "--destdir", destdir,
    ])
    return destdir


@pytest.fixture(scope="module")
def checkpoint(data_bin, tmp_path_factory):
    save_dir = str(tmp_path_factory.mktemp("ptb_lm_ckpt"))
    log = run("fairseq-train", [data_bin, *TINY, *VARIANTS, *DATA, *TRAINING,
                                "--max-update", "4", "--save-dir", save_dir]).stdout
    assert "done training" in log
    path = os.path.join(save_dir, "checkpoint_last.pt")
    assert os.path.exists(path)
    return path


def test_eval_lm_scores_every_test_token_from_a_fresh_process(data_bin, checkpoint):
    result = run("fairseq-eval-lm", [
        data_bin, "--user-dir", USER_DIR, "--path", checkpoint, "--gen-subset", "test", *DATA,
        "--max-tokens", "4000", "--cpu", "--num-workers", "0",
    ])
    output = result.stdout + result.stderr
    loss = re.search(r"Loss \(base 2\): (\S+), Perplexity: (\S+)", output)
    assert loss, output[-2000:]
    loss_base2, perplexity = float(loss.group(1).rstrip(",")), float(loss.group(2))
    assert math.isfinite(loss_base2) and math.isfinite(perplexity)
    assert perplexity == pytest.approx(2 ** loss_base2, rel=1e-3)
    scored = re.search(r"Evaluated ([0-9,]+) tokens", output)
    assert scored, output[-2000:]
    # every target token incl. the end of each sentence: words + lines of test.txt
    assert int(scored.group(1).replace(",", "")) == count_tokens(f"{PTB}/test.txt")


def test_interactive_samples_continuations_from_the_checkpoint(data_bin, checkpoint):
    prompts = ["the company said", "in the"]
    result = run("fairseq-interactive", [
        data_bin, "--task", "language_modeling", "--user-dir", USER_DIR, "--path", checkpoint,
        "--sampling", "--sampling-topk", "10", "--beam", "1", "--max-len-b", "6", "--seed", "1",
        "--cpu", *DATA,
    ], input="\n".join(prompts) + "\n")
    found = hypotheses(result.stdout)
    assert sorted(found) == [0, 1], result.stdout[-2000:]
    for ident, prompt in enumerate(prompts):
        # the hypothesis is the prompt followed by sampled tokens (decoded step by step)
        assert found[ident].startswith(prompt)
        assert len(found[ident].split()) > len(prompt.split())


def test_block_longer_than_the_direct_positions_fails_at_start_up(data_bin, tmp_path):
    result = run_failing("fairseq-train", [
        data_bin, *TINY, "--decoder-direct-position", "absolute", "--max-target-positions", "64",
        "--tokens-per-sample", "80", "--sample-break-mode", "eos", *TRAINING,
        "--max-update", "1", "--save-dir", str(tmp_path / "ckpt"),
    ])
    message = result.stdout + result.stderr
    assert "--max-target-positions" in message, message[-2000:]
    assert "--tokens-per-sample 80" in message
    assert not os.path.exists(tmp_path / "ckpt" / "checkpoint_last.pt")


def test_an_option_value_that_would_change_nothing_is_refused_in_one_line(data_bin, tmp_path):
    result = run_failing("fairseq-train", [data_bin, *TINY, "--decoder-cope", "1", *TRAINING, "--max-update", "1",
                                           "--save-dir", str(tmp_path / "ckpt")])
    assert error_line(result, "fairseq-train").startswith(
        "fairseq-train: error: --decoder-cope must be 0 (off) or a number of positions of at least 2, got 1")
    assert not os.path.exists(tmp_path / "ckpt" / "checkpoint_last.pt")


def test_a_width_the_heads_do_not_divide_is_refused_in_one_line(data_bin, tmp_path):
    tiny = [value if value != "32" else "30" for value in TINY]  # --decoder-embed-dim 30 (and its in/out dims)
    result = run_failing("fairseq-train", [data_bin, *tiny, "--decoder-attention-heads", "4", "--decoder-alibi",
                                           *TRAINING, "--max-update", "1", "--save-dir", str(tmp_path / "ckpt")])
    assert error_line(result, "fairseq-train") == (
        "fairseq-train: error: --decoder-embed-dim 30 is not a multiple of --decoder-attention-heads 4: each head "
        "takes an equal share of the width (e.g. --decoder-embed-dim 28)")


def eval_lm(data_bin: str, checkpoint: str, extra: list, runner=run):
    return runner("fairseq-eval-lm", [data_bin, "--user-dir", USER_DIR, "--path", checkpoint, "--gen-subset", "test",
                                      "--max-tokens", "4000", "--cpu", "--num-workers", "0", *extra])


@pytest.fixture(scope="module")
def short_block_checkpoint(data_bin, tmp_path_factory):
    """Sinusoidal positions and ALiBi trained on blocks of 16 tokens: no parameter is tied to a length."""
    save_dir = str(tmp_path_factory.mktemp("ptb_lm_short"))
    run("fairseq-train", [data_bin, *TINY, "--decoder-alibi", "--sample-break-mode", "none", "--tokens-per-sample",
                          "16", *TRAINING, "--max-update", "3", "--save-dir", save_dir])
    return os.path.join(save_dir, "checkpoint_last.pt")


def test_eval_lm_beyond_the_training_length_names_the_override_then_scores_every_token(
        data_bin, short_block_checkpoint):
    """fairseq alone would skip every block of 64 (longer than the model's 16 positions) and print
    "Perplexity: 1.00" over 0 tokens; the plugin refuses, naming the override, which then scores all."""
    blocks = ["--sample-break-mode", "none", "--tokens-per-sample", "64"]
    line = error_line(eval_lm(data_bin, short_block_checkpoint, blocks, runner=run_failing), "fairseq-eval-lm")
    assert "would skip" in line and "16 positions" in line and "'max_target_positions': 64" in line
    override = ["--model-overrides", "{'max_target_positions': 64}"]
    for window in ([], ["--context-window", "32"]):
        output = eval_lm(data_bin, short_block_checkpoint, blocks + override + window)
        output = output.stdout + output.stderr
        scored = re.search(r"Evaluated ([0-9,]+) tokens", output)
        assert scored and int(scored.group(1).replace(",", "")) == count_tokens(f"{PTB}/test.txt"), output[-2000:]
        perplexity = float(re.search(r"Perplexity: (\S+)", output).group(1))
        assert math.isfinite(perplexity) and perplexity > 1.5


def test_eval_lm_of_a_model_tied_to_its_positions_says_it_cannot_read_longer_blocks(data_bin, checkpoint):
    """The direct absolute matrix is learned for t = 64 positions: no override can help; the message
    says which lengths work (an eval-time --max-target-positions would only fail to load the matrix)."""
    line = error_line(eval_lm(data_bin, checkpoint, ["--sample-break-mode", "none", "--tokens-per-sample",
                                                           "128"], runner=run_failing), "fairseq-eval-lm")
    assert "--tokens-per-sample 64 or less" in line, line


def test_an_override_beyond_the_learned_positions_is_refused_in_one_line(data_bin, checkpoint):
    """Raising a tied model's limit at evaluation time would only give PyTorch's "size mismatch" while
    loading A^p: the plugin names the term and its learned limit instead."""
    line = error_line(eval_lm(data_bin, checkpoint, [
        "--sample-break-mode", "none", "--tokens-per-sample", "128",
        "--model-overrides", "{'max_target_positions': 128}"], runner=run_failing), "fairseq-eval-lm")
    assert "learned for 64 positions" in line and "at most 64 tokens" in line, line
