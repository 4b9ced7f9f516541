"""The structural pipeline end to end through the real tools, on real Multi30k sentences parsed by
spaCy: tokenize -> parse -> BPE -> fairseq-preprocess -> side data -> fairseq-train with
``--task translation_structural`` -> fairseq-generate and fairseq-interactive agree."""

import os
import shutil

import pytest

from cli_helpers import binarize, error_line, hypotheses, prepare_sample, run, run_failing
from model_helpers import USER_DIR

pytestmark = pytest.mark.slow

LINES = 120
MODEL = [
    "--user-dir", USER_DIR, "--task", "translation_structural", "--arch", "transformer_posattn",
    "--encoder-layers", "2", "--decoder-layers", "1", "--encoder-embed-dim", "32",
    "--decoder-embed-dim", "32", "--encoder-ffn-embed-dim", "64", "--decoder-ffn-embed-dim", "64",
    "--encoder-attention-heads", "2", "--decoder-attention-heads", "2", "--share-all-embeddings",
    "--max-source-positions", "128", "--max-target-positions", "128",
    "--encoder-structural-positions", "both", "--encoder-structural-fusion", "nonlinear",
    "--encoder-relative-positions", "4",
]
TRAINING = ["--optimizer", "adam", "--lr", "0.001", "--max-tokens", "2000", "--cpu", "--seed", "1",
            "--no-epoch-checkpoints", "--log-format", "simple", "--required-batch-size-multiple", "1",
            "--num-workers", "0"]


@pytest.fixture(scope="module")
def structural_corpus(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("structural"))
    prepared = prepare_sample(root, lines=LINES)
    data_bin = os.path.join(root, "data-bin")
    binarize(prepared, data_bin)
    for split in ("train", "valid", "test"):
        run("posattn-parse", ["--backend", "spacy", "--input", f"{prepared}/{split}.tok.en",
                              "--output", f"{prepared}/{split}.conllu"])
        run("posattn-prepare-structure", [
            "--conllu", f"{prepared}/{split}.conllu", "--bpe", f"{prepared}/{split}.bpe.en",
            "--destdir", data_bin, "--split", split, "--source-lang", "en", "--target-lang", "de"])
    return {"root": root, "prepared": prepared, "data_bin": data_bin}


@pytest.fixture(scope="module")
def structural_checkpoint(structural_corpus):
    save_dir = os.path.join(structural_corpus["root"], "checkpoints")
    run("fairseq-train", [structural_corpus["data_bin"], *MODEL, *TRAINING, "--max-update", "4",
                          "--save-dir", save_dir])
    return f"{save_dir}/checkpoint_last.pt"


def test_generate_and_interactive_give_the_same_translations(structural_corpus, structural_checkpoint):
    common = ["--user-dir", USER_DIR, "--task", "translation_structural", "--path", structural_checkpoint,
              "--beam", "3", "--max-len-b", "15", "--cpu", "--source-lang", "en", "--target-lang", "de"]
    generated = hypotheses(run("fairseq-generate", [
        structural_corpus["data_bin"], *common, "--gen-subset", "test", "--batch-size", "16",
        "--required-batch-size-multiple", "1"]).stdout)
    assert sorted(generated) == list(range(LINES))
    with open(os.path.join(structural_corpus["prepared"], "test.bpe.en")) as f:
        sources = f.readlines()[:6]
    interactive = hypotheses(run("fairseq-interactive", [
        structural_corpus["data_bin"], *common, "--buffer-size", "6", "--batch-size", "6"],
        input="".join(sources)).stdout)
    assert [interactive[i] for i in range(6)] == [generated[i] for i in range(6)]


def test_plain_translation_task_is_refused_at_start_up(structural_corpus, tmp_path):
    result = run_failing("fairseq-train", [
        structural_corpus["data_bin"], *[a if a != "translation_structural" else "translation" for a in MODEL],
        *TRAINING, "--max-update", "1", "--save-dir", str(tmp_path)])
    assert "use --task translation_structural" in result.stderr


def test_misaligned_side_data_is_refused(structural_corpus, tmp_path):
    """BPE text that is not what fairseq-preprocess binarized: the error names file and line."""
    prepared = structural_corpus["prepared"]
    bad_bpe = tmp_path / "test.bpe.en"
    lines = open(f"{prepared}/test.bpe.en").readlines()
    lines[4] = lines[4].replace("@@ ", "")  # still the same words, fewer pieces
    bad_bpe.write_text("".join(lines))
    data_bin = tmp_path / "data-bin"
    shutil.copytree(structural_corpus["data_bin"], data_bin)
    result = run_failing("posattn-prepare-structure", [
        "--conllu", f"{prepared}/test.conllu", "--bpe", str(bad_bpe), "--destdir", str(data_bin),
        "--split", "test", "--source-lang", "en", "--target-lang", "de"])
    assert f"{bad_bpe}:5" in result.stderr and "binarized source" in result.stderr

    words_changed = tmp_path / "words.bpe.en"
    lines = open(f"{prepared}/test.bpe.en").readlines()
    lines[2] = "zzz " + lines[2]
    words_changed.write_text("".join(lines))
    result = run_failing("posattn-prepare-structure", [
        "--conllu", f"{prepared}/test.conllu", "--bpe", str(words_changed), "--destdir", str(data_bin),
        "--split", "test", "--source-lang", "en", "--target-lang", "de"])
    assert f"{words_changed}:3" in result.stderr

    short = tmp_path / "short.bpe.en"
    short.write_text("".join(open(f"{prepared}/test.bpe.en").readlines()[:-1]))
    result = run_failing("posattn-prepare-structure", [
        "--conllu", f"{prepared}/test.conllu", "--bpe", str(short), "--destdir", str(data_bin),
        "--split", "test", "--source-lang", "en", "--target-lang", "de"])
    assert f"{short} has {LINES - 1} lines, {prepared}/test.conllu has {LINES} sentences" in result.stderr
    # nothing half-written: the good side data from before is still there and complete
    assert os.path.exists(data_bin / "test.en-de.en.structure.bin")
    assert not [p for p in os.listdir(data_bin) if ".tmp" in p]


def test_a_checkpoint_never_resumes_as_another_model(structural_corpus, tmp_path):
    """The baseline (Table 1 row 4) trained into a --save-dir, then the same command with structural
    absolute positions (no new parameter: the weights would fit): refused, naming both, with the
    checkpoint untouched; --encoder-reset-position-options makes the fine-tuning explicit."""
    baseline = [a for a in MODEL[: MODEL.index("--encoder-structural-positions")]]
    save_dir = str(tmp_path / "checkpoints")
    run("fairseq-train", [structural_corpus["data_bin"], *baseline, *TRAINING, "--max-update", "2", "--save-dir", save_dir])
    last = os.path.join(save_dir, "checkpoint_last.pt")
    before = open(last, "rb").read()
    structural = [*baseline, "--encoder-structural-positions", "absolute"]
    result = run_failing("fairseq-train", [structural_corpus["data_bin"], *structural, *TRAINING, "--max-update", "4",
                                           "--save-dir", save_dir])
    error = error_line(result, "fairseq-train")
    assert "--encoder-structural-positions: none in the checkpoint, absolute here" in error
    assert "--encoder-reset-position-options" in error
    assert open(last, "rb").read() == before
    run("fairseq-train", [structural_corpus["data_bin"], *structural, "--encoder-reset-position-options", *TRAINING,
                          "--max-update", "4", "--save-dir", save_dir])
    assert open(last, "rb").read() != before
    resumed = run("fairseq-train", [structural_corpus["data_bin"], *structural, *TRAINING, "--max-update", "5",
                                    "--save-dir", save_dir])  # now recorded as structural: resumes
    assert "done training" in resumed.stdout + resumed.stderr
