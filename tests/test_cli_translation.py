"""End to end through fairseq's real command-line tools, in subprocesses, on the shipped Multi30k
sample: fairseq-preprocess, fairseq-train with several position terms on at once, fairseq-generate
and fairseq-interactive from the saved checkpoint in fresh processes, resume (distributed training: test_distributed.py)."""

import os
import re
from typing import List

import pytest
import torch

from cli_helpers import binarize, hypotheses, prepare_sample, run, run_failing
from model_helpers import USER_DIR

pytestmark = pytest.mark.slow

MODEL = [
    "--user-dir", USER_DIR, "--arch", "transformer_posattn",
    "--encoder-layers", "2", "--decoder-layers", "2", "--encoder-embed-dim", "32",
    "--decoder-embed-dim", "32", "--encoder-ffn-embed-dim", "64", "--decoder-ffn-embed-dim", "64",
    "--encoder-attention-heads", "2", "--decoder-attention-heads", "2",
    "--max-source-positions", "128", "--max-target-positions", "128", "--share-all-embeddings",
]
VARIANTS = [
    "--encoder-no-token-positional-embeddings", "--encoder-direct-position", "both", "--encoder-learnable-temperature",
    "--encoder-conv-attention", "2d", "--encoder-distance-aware", "--encoder-relative-positions", "4",
    "--decoder-direct-position", "both", "--decoder-conv-attention", "1d",
    "--decoder-relative-positions", "4", "--decoder-learnable-temperature",
]
TRAINING = [
    "--optimizer", "adam", "--lr", "0.001", "--max-tokens", "2000", "--cpu", "--seed", "1",
    "--criterion", "label_smoothed_cross_entropy", "--label-smoothing", "0.1",
    "--no-epoch-checkpoints", "--log-format", "simple", "--log-interval", "1",
    "--required-batch-size-multiple", "1", "--num-workers", "0",
]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """Tokenized, BPE-split and binarized first 300 lines of each split of the shipped sample."""
    root = tmp_path_factory.mktemp("multi30k")
    prepared = prepare_sample(str(root))
    data_bin = str(root / "data-bin")
    binarize(prepared, data_bin)
    return {"prepared": prepared, "data_bin": data_bin, "root": root}


@pytest.fixture(scope="module")
def trained(corpus):
    save_dir = str(corpus["root"] / "checkpoints")
    log = run("fairseq-train", [corpus["data_bin"], *MODEL, *VARIANTS, *TRAINING,
                                "--max-update", "6", "--save-dir", save_dir]).stdout
    assert "done training" in log and os.path.exists(f"{save_dir}/checkpoint_last.pt")
    return save_dir


def decoding(trained: str) -> List[str]:
    """The options fairseq-generate and fairseq-interactive share: the checkpoint, beam 3, en-de."""
    return ["--user-dir", USER_DIR, "--path", f"{trained}/checkpoint_last.pt", "--beam", "3",
            "--max-len-b", "20", "--cpu", "--source-lang", "en", "--target-lang", "de"]


@pytest.fixture(scope="module")
def generated(corpus, trained) -> str:
    """fairseq-generate's output on the test split, from a fresh process."""
    return run("fairseq-generate", [
        corpus["data_bin"], *decoding(trained), "--gen-subset", "test", "--batch-size", "32",
        "--required-batch-size-multiple", "1",
    ]).stdout


def test_generate_translates_every_test_sentence_from_a_fresh_process(generated):
    assert sorted(hypotheses(generated)) == list(range(300))


def test_interactive_agrees_with_generate(corpus, trained, generated):
    with open(os.path.join(corpus["prepared"], "test.bpe.en")) as f:
        sources = [next(f) for _ in range(5)]
    interactive = run("fairseq-interactive", [corpus["data_bin"], *decoding(trained), "--buffer-size", "5",
                                              "--batch-size", "5"], input="".join(sources)).stdout
    from_generate = hypotheses(generated)
    from_interactive = hypotheses(interactive)
    assert len(from_interactive) == 5
    for i, source in enumerate(sources):
        test_id = _test_id_of(corpus, source)
        assert from_interactive[i] == from_generate[test_id]


def _test_id_of(corpus, source: str) -> int:
    with open(os.path.join(corpus["prepared"], "test.bpe.en")) as f:
        return [line for line in f].index(source)


def test_resume_continues_from_the_checkpoint(corpus, trained, tmp_path):
    save_dir = str(tmp_path / "resumed")
    os.makedirs(save_dir)
    with open(f"{trained}/checkpoint_last.pt", "rb") as src, open(f"{save_dir}/checkpoint_last.pt", "wb") as dst:
        dst.write(src.read())
    log = run("fairseq-train", [corpus["data_bin"], *MODEL, *VARIANTS, *TRAINING,
                                "--max-update", "8", "--save-dir", save_dir])
    text = log.stdout + log.stderr
    assert re.search(r"Loaded checkpoint .*checkpoint_last\.pt \(epoch \d+ @ 6 updates\)", text), text[-2000:]
    assert "num_updates 8" in text or "@ 8 updates" in text


def test_loaded_model_runs_our_attention_in_eval_mode(trained):
    """A checkpoint loaded in eval mode must not take a fused path that skips the position terms."""
    from fairseq import checkpoint_utils
    from fairseq_posattn.modules.attention import PositionAwareMultiheadAttention

    models, _cfg, _task = checkpoint_utils.load_model_ensemble_and_task([f"{trained}/checkpoint_last.pt"])
    model = models[0].eval()
    assert model.encoder.embed_positions is None and model.decoder.embed_positions is not None
    attention = model.encoder.layers[0].self_attn
    assert isinstance(attention, PositionAwareMultiheadAttention)
    src = torch.tensor([[10, 11, 12, 13, 2]])
    with torch.no_grad():
        before = model.encoder(src)["encoder_out"][0]
        attention.additive_terms[0].weight.add_(5.0 * torch.randn_like(attention.additive_terms[0].weight))
        after = model.encoder(src)["encoder_out"][0]
    assert not torch.allclose(before, after)


def test_help_lists_the_position_options():
    out = run("fairseq-train", ["unused", "--user-dir", USER_DIR, "--arch", "transformer_posattn", "-h"]).stdout
    for option in ("--encoder-direct-position ", "--decoder-conv-attention ", "--encoder-distance-aware",
                   "--decoder-relative-positions", "--encoder-structural-positions",
                   "--encoder-no-token-positional-embeddings"):
        assert option in out


def test_unknown_combination_fails_at_start_up_with_the_fix(corpus, tmp_path):
    result = run_failing("fairseq-train", [
        corpus["data_bin"], *MODEL, *TRAINING,
        "--encoder-direct-position-layers", "all", "--max-update", "1", "--save-dir", str(tmp_path),
    ])
    assert "--encoder-direct-position-layers all has no effect without --encoder-direct-position" in result.stderr
