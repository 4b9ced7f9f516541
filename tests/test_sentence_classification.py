"""Sentence classification (issue 5): the ``label sentence`` splitter, the ``transformer_posattn_classifier``
model (defaults = fairseq's encoder, padding, pooling, option errors), and the recipe's steps through the
real command-line tools (fairseq-preprocess, fairseq-train, fairseq-validate in a fresh process) on the
shipped SST-2 sample, for the vanilla, Shaw and DA encoders."""

import os
import re
import subprocess
from typing import List

import pytest
import torch
from fairseq import models
from fairseq.data import Dictionary
from fairseq.dataclass.utils import convert_namespace_to_omegaconf
from fairseq.models.transformer import Embedding, TransformerConfig, TransformerEncoderBase

from cli_helpers import BIN
from fairseq_posattn.data.sentence_classification import split_corpus
from fairseq_posattn.inspect.learning_curves import read_curve
from posattn.position_options import PositionOptionError
from fairseq_posattn.models.transformer_classifier_posattn import (
    PositionAwareTransformerClassifier,
    pool,
    posattn_classifier_base,
)
from fairseq_posattn.modules.attention import PositionAwareMultiheadAttention
from posattn.position_terms.base import SequenceTooLongError
from model_helpers import REPO, parse_model_args, randomized

SST2 = os.path.join(REPO, "data", "sst2_sample")
RECIPE = os.path.join(REPO, "examples", "sentence_classification", "run.sh")
HEAD = "sentence_classification_head"
TASK = ["--task", "sentence_prediction", "--criterion", "sentence_prediction", "--num-classes", "2",
        "--max-positions", "24"]
TINY_CLASSIFIER = TASK + ["--encoder-layers", "2", "--encoder-embed-dim", "16", "--encoder-ffn-embed-dim", "32",
                          "--encoder-attention-heads", "2"]


def write(path, text: str) -> str:
    path.write_text(text, encoding="utf-8")
    return str(path)


# ---------------------------------------------------------------------------------- label sentence --

def test_split_corpus_writes_parallel_files(tmp_path):
    train, dev = (os.path.join(SST2, f"stsa.binary.{split}") for split in ("train", "dev"))
    counts = split_corpus({"train": train, "valid": dev}, str(tmp_path), labels=["0", "1"])
    assert counts == {"train": 600, "valid": 200}
    with open(train, encoding="utf-8") as f:
        first = f.readline().rstrip("\n")
    sentences = (tmp_path / "train.input0").read_text(encoding="utf-8").splitlines()
    labels = (tmp_path / "train.label").read_text(encoding="utf-8").splitlines()
    assert len(sentences) == len(labels) == 600
    assert f"{labels[0]} {sentences[0]}" == first
    assert set(labels) == {"0", "1"}


@pytest.mark.parametrize("bad_train, bad_dev, message", [
    ("1 good film\n\n0 bad film\n", "1 fine\n", r"train\.txt:2: empty line"),
    ("1 good film\n0\n", "1 fine\n", r"train\.txt:2: label '0' without a sentence"),
    ("1 good film\ngood film 0\n", "1 fine\n", r"train\.txt:2: label 'good' is not one of 0, 1"),
    ("1 good film\n1 great film\n", "1 fine\n0 dull\n", r"dev\.txt:2: label '0' never occurs in the training"),
])
def test_bad_lines_name_file_and_line(tmp_path, bad_train, bad_dev, message):
    train, dev = write(tmp_path / "train.txt", bad_train), write(tmp_path / "dev.txt", bad_dev)
    out = tmp_path / "out"
    with pytest.raises(ValueError, match=message):
        split_corpus({"train": train, "valid": dev}, str(out), labels=["0", "1"])
    assert not out.exists()  # nothing half written


# ------------------------------------------------------------------------------------------- model --

class ClassificationTask:
    """What ``build_model`` reads from ``--task sentence_prediction``: the input dictionary."""

    def __init__(self, vocab_size: int = 20):
        self.source_dictionary = Dictionary()
        for i in range(vocab_size):
            self.source_dictionary.add_symbol(f"w{i}")


def build_classifier(extra: List[str], seed: int = 0, arch: str = "transformer_posattn_classifier",
                     sizes: List[str] = TINY_CLASSIFIER):
    """Parse and build as fairseq-train does, then register the head as the task does."""
    torch.manual_seed(seed)
    cfg = convert_namespace_to_omegaconf(parse_model_args(arch, extra, sizes))
    model = models.build_model(cfg.model, ClassificationTask())
    model.register_classification_head(HEAD, num_classes=2)
    return model


def plain_fairseq_classifier(seed: int = 0) -> PositionAwareTransformerClassifier:
    """The same classifier around fairseq's own encoder, built without any position option."""
    torch.manual_seed(seed)
    args = parse_model_args("transformer_posattn_classifier", [], TINY_CLASSIFIER)
    posattn_classifier_base(args)
    args.max_source_positions = args.max_positions
    dictionary = ClassificationTask().source_dictionary
    embed_tokens = Embedding(len(dictionary), args.encoder_embed_dim, dictionary.pad())
    encoder = TransformerEncoderBase(TransformerConfig.from_namespace(args), dictionary, embed_tokens)
    model = PositionAwareTransformerClassifier(args, encoder)
    model.register_classification_head(HEAD, num_classes=2)
    return model


def right_padded(*sentences: List[int], pad: int = 1) -> torch.Tensor:
    """A batch as ``--task sentence_prediction`` collates it (RightPadDataset)."""
    length = max(len(s) for s in sentences)
    return torch.tensor([s + [pad] * (length - len(s)) for s in sentences])


SHORT, LONG = [5, 9, 7, 12, 2], [6, 8, 10, 11, 13, 14, 15, 9, 2]  # word ids, EOS (2) last


def logits(model, tokens: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(tokens, classification_head_name=HEAD)[0]


def test_defaults_are_fairseqs_encoder():
    ours, plain = build_classifier([]).eval(), plain_fairseq_classifier().eval()
    assert not any(isinstance(m, PositionAwareMultiheadAttention) for m in ours.modules())
    ours_state, plain_state = ours.state_dict(), plain.state_dict()
    assert ours_state.pop("encoder.position_record.flags").numel() > 0  # the side's options record
    assert ours_state.keys() == plain_state.keys()
    assert all(torch.equal(ours_state[k], plain_state[k]) for k in ours_state)
    batch = right_padded(SHORT, LONG)
    assert torch.equal(logits(ours, batch), logits(plain, batch))


@pytest.mark.parametrize("flags", [
    [],
    ["--classifier-pooling", "first"],
    ["--no-token-positional-embeddings", "--encoder-distance-aware"],
    ["--no-token-positional-embeddings", "--encoder-relative-positions", "3"],
    ["--encoder-direct-position", "both", "--encoder-learnable-temperature"],
    ["--encoder-conv-attention", "1d"],
    ["--encoder-conv-attention", "2d", "--encoder-normalize-before"],
], ids=lambda flags: " ".join(flags) or "defaults")
def test_padding_does_not_change_the_logits(flags):
    model = build_classifier(flags).eval()
    if any(f.startswith("--encoder-") and f != "--encoder-normalize-before" for f in flags):
        model = randomized(model)  # position parameters away from their neutral start
    alone = logits(model, right_padded(SHORT))
    with_a_longer_mate = logits(model, right_padded(SHORT, LONG))
    torch.testing.assert_close(with_a_longer_mate[0], alone[0], rtol=1e-5, atol=1e-6)


def test_pooling_skips_pads_on_either_side():
    features = torch.arange(12, dtype=torch.float).view(2, 3, 2)
    right = torch.tensor([[False, False, True], [False, False, False]])
    left = torch.tensor([[True, False, False], [False, False, False]])
    assert pool(features, right, "mean")[0].tolist() == [1.0, 2.0]
    assert pool(features, right, "first")[0].tolist() == [0.0, 1.0]
    assert pool(features, left, "mean")[0].tolist() == [3.0, 4.0]
    assert pool(features, left, "first")[0].tolist() == [2.0, 3.0]
    assert pool(features, None, "mean").tolist() == pool(features, torch.zeros(2, 3, dtype=torch.bool), "mean").tolist()


def test_wu2021_preset_sizes():
    model = build_classifier([], arch="transformer_posattn_classifier_wu2021", sizes=TASK)
    layer, = model.encoder.layers
    attention = layer.self_attn
    assert (attention.num_heads, attention.head_dim, model.encoder.embed_tokens.embedding_dim) == (16, 16, 256)


def test_option_errors_name_the_option():
    with pytest.raises(PositionOptionError, match="--encoder-structural-positions"):
        build_classifier(["--encoder-structural-positions", "absolute"])
    model = build_classifier(["--encoder-direct-position", "absolute"]).eval()
    with pytest.raises(SequenceTooLongError, match="--max-positions"):
        logits(model, right_padded(list(range(4, 19)) * 2))  # 30 tokens, t = 24


# -------------------------------------------------------------------- the recipe, through the CLI --

def recipe_env(out: str) -> dict:
    return dict(os.environ, OUT=out, SEEDS="1", MAX_UPDATE="20", VALIDATE_EVERY="10",
                MODEL_FLAGS="--encoder-embed-dim 64 --encoder-ffn-embed-dim 128", OMP_NUM_THREADS="1",
                PATH=f"{BIN}:{os.environ['PATH']}")


@pytest.mark.slow
def test_recipe_preprocess_train_validate_on_the_sample(tmp_path):
    out = str(tmp_path / "out")
    result = subprocess.run(["bash", RECIPE, SST2], env=recipe_env(out), capture_output=True, text=True)
    assert result.returncode == 0, f"run.sh failed:\n{result.stdout[-3000:]}\n{result.stderr[-5000:]}"
    assert "WARNING" not in result.stderr and "FAILED" not in result.stdout, result.stdout + result.stderr
    for variant, flags in [("vanilla", None), ("shaw", "--encoder-relative-positions 16"),
                           ("da", "--encoder-distance-aware")]:
        run = os.path.join(out, "runs", variant, "seed1")
        with open(os.path.join(run, "train.log"), encoding="utf-8") as f:
            train_log = f.read()
        assert "done training" in train_log
        if flags:  # the variant's flags reached the model, and the recipe dropped the sinusoidal PE
            assert "PositionAwareMultiheadAttention" in train_log
            assert "no_token_positional_embeddings=True" in train_log
        else:
            assert "PositionAwareMultiheadAttention" not in train_log
            assert "SinusoidalPositionalEmbedding" in train_log
        curve = read_curve(os.path.join(run, "train.log"))
        assert [x for x, _ in curve.points] == [10, 19, 20]  # every 10 updates, and each epoch's end (19)
        with open(os.path.join(run, "validate.log"), encoding="utf-8") as f:
            validated = [line for line in f if "valid on 'valid' subset" in line][-1]
        # a fresh process, the reloaded best checkpoint, every one of the 200 dev sentences
        assert float(re.search(r"\| accuracy ([0-9.]+)", validated).group(1)) == curve.best(False)[1]
        assert "| bsz 200" in validated
        check_hub_predictions(run, os.path.join(out, "data-bin"), validated)
    with open(os.path.join(out, "results.md"), encoding="utf-8") as f:
        table = f.read()
    assert [line.split(" | ")[0] for line in table.splitlines()[2:]] == [
        "| Transformer", "| Transformer-RPR", "| DA-Transformer"]
    with open(os.path.join(out, "learning_curves.png"), "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"


def check_hub_predictions(run: str, data_bin: str, validated: str) -> None:
    """The hub interface of a trained classifier labels the dev sentences as fairseq-validate does: its
    accuracy on them is the accuracy fairseq-validate printed, and its probabilities are distributions."""
    from fairseq_posattn.hub import ClassifierHubInterface, from_pretrained

    hub = PositionAwareTransformerClassifier.from_pretrained(
        os.path.join(run, "checkpoints"), checkpoint_file="checkpoint_best.pt", data_name_or_path=data_bin)
    assert isinstance(hub, ClassifierHubInterface) and sorted(hub.labels) == ["0", "1"]
    with open(os.path.join(SST2, "stsa.binary.dev"), encoding="utf-8") as f:
        gold, sentences = zip(*(line.rstrip("\n").split(" ", 1) for line in f))
    predicted = hub.predict(list(sentences), batch_size=37)
    accuracy = 100 * sum(p == g for p, g in zip(predicted, gold)) / len(gold)
    assert abs(accuracy - float(re.search(r"\| accuracy ([0-9.]+)", validated).group(1))) < 0.05, validated
    one = hub.probabilities(sentences[0])
    assert set(one) == {"0", "1"} and abs(sum(one.values()) - 1) < 1e-6
    assert hub.predict(sentences[0]) == max(one, key=one.get) == predicted[0]
    same = from_pretrained(os.path.join(run, "checkpoints"), "checkpoint_best.pt", data_bin)  # by the task
    assert same.predict(list(sentences[:5])) == predicted[:5]
    limit = hub.models[0].max_positions()
    with pytest.raises(ValueError, match=f"has {limit + 1} tokens .* reads at most {limit}"):
        hub.predict(" ".join(["good"] * limit))
