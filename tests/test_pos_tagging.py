"""Part-of-speech tagging (issue 5): CoNLL-U reading, the OOV / ambiguous metrics, the binarized data,
the san_tagger model, the RMSprop optimizer, and the whole path through the real command-line tools
on UD English-EWT (the shipped 300 + 60 sentence samples)."""

import math
import os
import re
import subprocess
import sys
from types import SimpleNamespace

import conllu
import pytest
import torch
from fairseq.data import data_utils

from cli_helpers import run, run_failing
from fairseq_posattn.criterions.pos_tagging import PosTaggingCriterion, tagging_counts
from fairseq_posattn.data.tagged_corpus import (
    AMBIGUOUS_FLAG,
    OOV_FLAG,
    TrainingLexicon,
    read_tagged_conllu,
    write_predicted_tags,
)
from fairseq_posattn.data.tagging_binarize import prepare_tagging_data
from fairseq_posattn.data.tagging_dataset import TaggingDataset, TaggingSettings, TaggingVocabulary
from fairseq_posattn.modules.char_cnn import CharCNNWordEncoder
from model_helpers import REPO

EWT = os.path.join(REPO, "data", "ud_ewt_sample")
EWT_TRAIN = os.path.join(EWT, "en_ewt-ud-train.sample.conllu")
EWT_DEV = os.path.join(EWT, "en_ewt-ud-dev.sample.conllu")

EDGE_CASES = """# sent_id = a
# text = I didn't go.
1\tI\tI\tPRON\tPRP\t_\t3\tnsubj\t_\t_
2-3\tdidn't\t_\t_\t_\t_\t_\t_\t_\t_
2\tdid\tdo\tAUX\tVBD\t_\t4\taux\t_\t_
3\tn't\tnot\tPART\tRB\t_\t4\tadvmod\t_\t_
4\tgo\tgo\tVERB\tVB\t_\t0\troot\t_\t_
4.1\tgone\tgo\tVERB\tVBN\t_\t_\t_\t4:conj\t_
5\t.\t.\tPUNCT\t.\t_\t4\tpunct\t_\t_

# comment-only block

1\tYes\tyes\tINTJ\tUH\t_\t0\troot\t_\t_
"""


def write(path, text: str) -> str:
    path.write_text(text, encoding="utf-8")
    return str(path)


# ------------------------------------------------------------------------------ CoNLL-U reading --

def test_multiword_tokens_empty_nodes_and_comments(tmp_path):
    path = write(tmp_path / "edge.conllu", EDGE_CASES)
    sentences = list(read_tagged_conllu(path, "upos"))
    assert [s.words for s in sentences] == [["I", "did", "n't", "go", "."], ["Yes"]]
    assert [s.tags for s in sentences] == [["PRON", "AUX", "PART", "VERB", "PUNCT"], ["INTJ"]]
    assert sentences[0].word_lines == [3, 5, 6, 7, 9]
    assert sentences[1].line == 13
    assert [s.tags for s in read_tagged_conllu(path, "xpos")][0] == ["PRP", "VBD", "RB", "VB", "."]


@pytest.mark.parametrize("bad_line, message", [
    ("2\tdid\tdo\tAUX VBD _ 4 aux _ _", r"edge\.conllu:5: expected 10 tab-separated columns"),
    ("7\tdid\tdo\tAUX\tVBD\t_\t4\taux\t_\t_", r"edge\.conllu:5: word ID 7 out of sequence"),
    ("2\tdid\tdo\t_\tVBD\t_\t4\taux\t_\t_", r"edge\.conllu:5: word 2 'did' has no UPOS tag"),
])
def test_malformed_lines_name_file_and_line(tmp_path, bad_line, message):
    text = EDGE_CASES.replace("2\tdid\tdo\tAUX\tVBD\t_\t4\taux\t_\t_", bad_line)
    path = write(tmp_path / "edge.conllu", text)
    with pytest.raises(ValueError, match=message):
        list(read_tagged_conllu(path, "upos"))


def test_predicted_tags_replace_only_the_tag_column(tmp_path):
    path = write(tmp_path / "edge.conllu", EDGE_CASES)
    sentences = list(read_tagged_conllu(path, "upos"))
    predictions = {line: f"T{k}" for s in sentences for k, line in enumerate(s.word_lines)}
    out = str(tmp_path / "pred.conllu")
    assert write_predicted_tags(path, out, predictions, "upos") == 6
    before, after = EDGE_CASES.splitlines(), open(out, encoding="utf-8").read().splitlines()
    assert len(before) == len(after)
    for number, (old, new) in enumerate(zip(before, after), start=1):
        if number in predictions:
            old_cols, new_cols = old.split("\t"), new.split("\t")
            assert new_cols[3] == predictions[number]
            assert old_cols[:3] + old_cols[4:] == new_cols[:3] + new_cols[4:]
        else:
            assert old == new  # comments, multiword tokens, empty nodes, blank lines


# ---------------------------------------------------------------------------------- the metrics --

def test_oov_and_ambiguous_words_by_hand():
    # training: "run" is seen as VERB and NOUN (ambiguous), "dogs" only as NOUN, "fast" only as ADV
    train = [SimpleNamespace(words=["dogs", "run", "fast"], tags=["NOUN", "VERB", "ADV"]),
             SimpleNamespace(words=["a", "run"], tags=["DET", "NOUN"])]
    lexicon = TrainingLexicon.from_sentences(train)
    assert lexicon.flags(["run", "dogs", "cats", "Run", "fast"]) == [
        AMBIGUOUS_FLAG, 0, OOV_FLAG, OOV_FLAG, 0]  # forms are case-sensitive
    assert lexicon.vocabulary(0.5) == ["run", "dogs"]  # ceil(0.5 * 4 forms) most frequent, ties in order
    assert lexicon.vocabulary(0.6) == ["run", "dogs", "fast"]

    pad = 1
    # dev sentence "cats run fast" + padding: gold NOUN VERB ADV, predicted NOUN NOUN ADV
    target = torch.tensor([[4, 5, 6, pad]])
    predicted = torch.tensor([[4, 4, 6, 5]])
    flags = torch.tensor([[OOV_FLAG, AMBIGUOUS_FLAG, 0, 0]])
    counts = tagging_counts(predicted, target, flags, pad)
    assert counts == {"n_words": 3, "n_correct": 2, "n_oov": 1, "n_correct_oov": 1,
                      "n_ambiguous": 1, "n_correct_ambiguous": 0}


def test_criterion_reduces_counts_over_batches():
    from fairseq import metrics
    logs = [
        {"loss": 6.0, "sample_size": 3, "n_words": 3, "n_correct": 2, "n_oov": 1, "n_correct_oov": 1,
         "n_ambiguous": 2, "n_correct_ambiguous": 1},
        {"loss": 2.0, "sample_size": 1, "n_words": 1, "n_correct": 1, "n_oov": 0, "n_correct_oov": 0,
         "n_ambiguous": 2, "n_correct_ambiguous": 2},
    ]
    with metrics.aggregate() as agg:
        PosTaggingCriterion.reduce_metrics(logs)
        values = agg.get_smoothed_values()
    assert values["accuracy"] == pytest.approx(75.0)
    assert values["oov_accuracy"] == pytest.approx(100.0)
    assert values["ambiguous_accuracy"] == pytest.approx(75.0)
    assert values["loss"] == pytest.approx(8.0 / 4 / math.log(2), abs=1e-3)


# ---------------------------------------------------------------------------- data preparation --

def test_prepare_splits_long_sentences_and_flags_words(tmp_path):
    dest = str(tmp_path / "bin")
    summaries = prepare_tagging_data({"train": [EWT_TRAIN], "valid": [EWT_DEV]}, dest, max_length=8,
                                     max_chars=5)
    train, valid = summaries
    assert (train.sentences, valid.sentences) == (300, 60)
    dev = list(read_tagged_conllu(EWT_DEV))
    assert valid.pieces == sum(math.ceil(len(s.words) / 8) for s in dev)
    assert valid.words == sum(len(s.words) for s in dev)
    assert train.oov == 0 and valid.oov > 0

    vocabulary = TaggingVocabulary.load(dest)
    settings = TaggingSettings.load(dest)
    dataset = TaggingDataset.load(dest, "valid", vocabulary, settings.max_chars, shuffle=False)
    assert dataset.sizes.max() <= 8 and dataset.sizes.sum() == valid.words
    first = dataset[0]
    words = dev[0].words[:8]
    assert [vocabulary.tags[t] for t in first["tags"]] == dev[0].tags[:8]
    assert first["chars"].shape == (len(words), 5)
    lexicon = TrainingLexicon.from_sentences(read_tagged_conllu(EWT_TRAIN))
    assert first["flags"].tolist() == lexicon.flags(words)
    assert all(vocabulary.chars[c] == ch for c, ch in zip(first["chars"][0], words[0][:5]))

    batch = dataset.collater([dataset[i] for i in range(3)])
    assert batch["net_input"]["src_chars"].shape[2] == 5
    assert batch["ntokens"] == int(batch["target"].ne(vocabulary.tags.pad()).sum())
    # evaluation batches keep every sentence (fairseq drops a last batch that is not a multiple)
    batches = dataset.batch_by_size(dataset.ordered_indices(), max_tokens=100, required_batch_size_multiple=8)
    assert sum(len(b) for b in batches) == len(dataset)


def test_long_sentence_error_and_nothing_half_written(tmp_path):
    dest = tmp_path / "bin"
    with pytest.raises(ValueError, match=r"en_ewt-ud-train\.sample\.conllu:5: sentence of 29 words is longer "
                                         r"than --max-length 10"):
        prepare_tagging_data({"train": [EWT_TRAIN], "valid": [EWT_DEV]}, str(dest), max_length=10,
                             long_sentences="error")
    assert not dest.exists()
    assert not [p for p in os.listdir(tmp_path) if p.endswith(".tmp")]


# ------------------------------------------------------------------------------------ the model --

def test_char_cnn_against_a_loop():
    torch.manual_seed(0)
    encoder = CharCNNWordEncoder(num_chars=12, padding_idx=1, embed_dim=4, filters=3, width=3)
    chars = torch.tensor([[[5, 6, 7, 1], [8, 1, 1, 1]], [[9, 10, 11, 4], [1, 1, 1, 1]]])
    out = encoder(chars)
    weight, bias = encoder.conv.weight, encoder.conv.bias  # (filters, embed, width)
    for b in range(2):
        for w in range(2):
            ids = [c for c in chars[b, w].tolist() if c != 1]
            if not ids:
                assert torch.all(out[b, w] == 0)
                continue
            emb = encoder.embed.weight[chars[b, w]]  # the full padded row: pads embed to zero
            best = torch.full((3,), -float("inf"))
            for pos in range(len(ids)):  # only real characters compete for the max
                value = bias.clone()
                for k in range(3):
                    src = pos + k - 1
                    if 0 <= src < chars.size(2):
                        value = value + weight[:, :, k] @ emb[src]
                best = torch.maximum(best, torch.relu(value))
            assert torch.allclose(out[b, w], best, atol=1e-6)


def build_tagger(tmp_path, *flags: str):
    from fairseq import options, tasks
    dest = str(tmp_path / "bin")
    if not os.path.exists(dest):
        prepare_tagging_data({"train": [EWT_TRAIN], "valid": [EWT_DEV]}, dest)
    parser = options.get_training_parser()
    args = options.parse_args_and_arch(parser, [
        dest, "--user-dir", os.path.join(REPO, "fairseq_posattn"), "--task", "pos_tagging",
        "--arch", "san_tagger", "--criterion", "pos_tagging", *flags])
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf
    cfg = convert_namespace_to_omegaconf(args)
    task = tasks.setup_task(cfg.task)
    return task, task.build_model(cfg.model)


@pytest.mark.parametrize("flags", [
    ["--position-embedding", "add"],
    ["--position-embedding", "concat", "--position-embed-dim", "64"],
    ["--position-embedding", "none", "--encoder-direct-position", "both"],
    ["--encoder-conv-attention", "1d"],
    ["--encoder-conv-attention", "2d", "--encoder-learnable-temperature"],
    ["--encoder-distance-aware"],
    ["--encoder-relative-positions", "4"],
])
def test_tagger_ignores_padding_and_batch_mates(tmp_path, flags):
    torch.manual_seed(0)
    task, model = build_tagger(tmp_path, *flags)
    model.eval()
    sentences = [s.words for s in read_tagged_conllu(EWT_DEV)][:6]
    together = task.tag_sentences(model, sentences, batch_size=6)
    alone = [task.tag_sentences(model, [s])[0] for s in sentences]
    assert together == alone
    dataset = TaggingDataset.load(str(tmp_path / "bin"), "valid", task.vocabulary, 20, False)
    short, long = dataset[0], max((dataset[i] for i in range(10)), key=lambda s: s["words"].numel())
    with torch.no_grad():
        pair = model(**dataset.collater([short, long])["net_input"])
        single = model(**dataset.collater([short])["net_input"])
    assert torch.allclose(pair[0, :single.size(1)], single[0], atol=1e-5)


def test_tagger_width_and_length_errors(tmp_path):
    with pytest.raises(ValueError, match="layer width 320 .* not divisible by --encoder-attention-heads 3"):
        build_tagger(tmp_path, "--position-embedding", "concat", "--encoder-attention-heads", "3")
    with pytest.raises(ValueError, match="have up to 60 words .* reads at most 4 [(]--max-source-positions 4[)]"):
        build_tagger(tmp_path, "--max-source-positions", "4")  # the data's pieces would not fit
    task, model = build_tagger(tmp_path)
    words = torch.full((1, 61), task.vocabulary.words.unk())
    chars = torch.full((1, 61, 20), task.vocabulary.chars.unk())
    with pytest.raises(ValueError, match="longer than --max-source-positions 60"):
        model(words, None, chars)


def test_rmsprop_is_keras_rmsprop():
    from fairseq_posattn.optim.rmsprop import FairseqRMSprop, RMSpropConfig
    torch.manual_seed(0)
    param = torch.nn.Parameter(torch.randn(5))
    start = param.detach().clone()
    optimizer = FairseqRMSprop(RMSpropConfig(lr=[0.01]), [param])
    grads = [torch.randn(5) for _ in range(3)]
    average, expected = torch.zeros(5), start.clone()
    for grad in grads:
        param.grad = grad.clone()
        optimizer.step()
        average = 0.9 * average + 0.1 * grad ** 2  # keras: rho 0.9, epsilon 1e-7 outside the root
        expected = expected - 0.01 * grad / (average.sqrt() + 1e-7)
    assert torch.allclose(param.detach(), expected, atol=1e-6)


# ----------------------------------------------------------------- end to end, as a user would --

def validation_scores(output: str) -> dict:
    line = [l for l in output.splitlines() if "valid on 'valid' subset" in l][-1]
    return {k: float(v) for k, v in re.findall(r"(\w*accuracy) ([0-9.]+)", line)}


@pytest.fixture(scope="module")
def prepared_ewt(tmp_path_factory) -> str:
    """The EWT samples through posattn-prepare-tagging, once for the trainings below (they only read it)."""
    data = str(tmp_path_factory.mktemp("ewt") / "bin")
    run("posattn-prepare-tagging", ["--train", EWT_TRAIN, "--valid", EWT_DEV, "--destdir", data])
    return data


@pytest.mark.slow
@pytest.mark.parametrize("flags", [
    ["--position-embedding", "add"],
    ["--position-embedding", "none", "--encoder-direct-position", "both"],
    ["--encoder-conv-attention", "1d", "--rmsprop-eps-placement", "inside-root"],
])
def test_prepare_train_validate_tag(tmp_path, prepared_ewt, flags):
    data, save = prepared_ewt, str(tmp_path / "checkpoints")
    user_dir = os.path.join(REPO, "fairseq_posattn")
    train = run("fairseq-train", [
        data, "--user-dir", user_dir, "--task", "pos_tagging", "--criterion", "pos_tagging",
        "--arch", "san_tagger", *flags, "--word-embed-dim", "32", "--encoder-ffn-embed-dim", "64",
        "--char-cnn-filters", "32", "--optimizer", "rmsprop", "--lr", "0.003", "--max-tokens", "1000",
        "--max-update", "30", "--save-dir", save, "--no-epoch-checkpoints", "--num-workers", "0",
        "--best-checkpoint-metric", "accuracy", "--maximize-best-checkpoint-metric", "--cpu",
        "--log-format", "simple"])
    assert "done training" in train.stdout + train.stderr
    checkpoint = os.path.join(save, "checkpoint_last.pt")
    validated = run("fairseq-validate", [data, "--user-dir", user_dir, "--task", "pos_tagging",
                                         "--path", checkpoint, "--max-tokens", "500", "--cpu"])
    scores = validation_scores(validated.stdout + validated.stderr)
    assert set(scores) == {"accuracy", "oov_accuracy", "ambiguous_accuracy"}
    assert scores["accuracy"] > 100 / 17 * 2  # well above chance among the 17 UPOS tags after 30 updates

    predicted = str(tmp_path / "dev.pred.conllu")
    tagged = run("posattn-tag", [data, "--path", checkpoint, "--input", EWT_DEV, "--output", predicted, "--cpu"])
    accuracy = float(re.search(r"UPOS accuracy ([0-9.]+)", tagged.stdout).group(1))
    assert accuracy == pytest.approx(scores["accuracy"], abs=0.006)  # same model, same words, fresh process

    with open(EWT_DEV, encoding="utf-8") as f:
        gold = conllu.parse(f.read())
    with open(predicted, encoding="utf-8") as f:
        pred = conllu.parse(f.read())  # valid CoNLL-U for the field's own reader
    assert len(gold) == len(pred)
    tags = set(TaggingVocabulary.load(data).tags.symbols)
    for gold_sentence, pred_sentence in zip(gold, pred):
        assert [t["form"] for t in gold_sentence] == [t["form"] for t in pred_sentence]
        assert [t["id"] for t in gold_sentence] == [t["id"] for t in pred_sentence]
        for g, p in zip(gold_sentence, pred_sentence):
            if isinstance(g["id"], int):
                assert p["upos"] in tags
            else:  # multiword tokens and empty nodes are copied
                assert g == p


@pytest.mark.slow
def test_cli_errors_name_the_file(tmp_path):
    bad = write(tmp_path / "bad.conllu", EDGE_CASES.replace("\tPRON\t", "\t_\t"))
    result = run_failing("posattn-prepare-tagging", ["--train", bad, "--destdir", str(tmp_path / "bin")])
    assert re.search(r"bad\.conllu:3: word 1 'I' has no UPOS tag .* --tag-column", result.stderr)
    assert not (tmp_path / "bin").exists()
    result = run_failing("fairseq-train", [str(tmp_path / "missing"), "--user-dir", os.path.join(REPO, "fairseq_posattn"),
                                           "--task", "pos_tagging", "--arch", "san_tagger",
                                           "--criterion", "pos_tagging", "--max-tokens", "100", "--cpu"])
    assert "is not a part-of-speech data directory; make one with posattn-prepare-tagging" in result.stderr


@pytest.mark.slow
def test_treebank_loop_recipe(tmp_path):
    """examples/pos_tagging: the 47-treebank loop over run.sh, on a UD folder holding the EWT samples."""
    treebank = tmp_path / "ud" / "UD_English-EWT"
    treebank.mkdir(parents=True)
    for split, source in (("train", EWT_TRAIN), ("dev", EWT_DEV), ("test", EWT_DEV)):
        (treebank / f"en_ewt-ud-{split}.conllu").write_text(open(source, encoding="utf-8").read(), encoding="utf-8")
    out = tmp_path / "out"
    env = dict(os.environ, OUT_ROOT=str(out), TREEBANKS="English-EWT English-GUM", MAX_UPDATE="4",
               VALIDATE_EVERY="2", SEEDS="1", VARIANTS="pe_add p_r", THREADS="1",
               PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"])
    result = subprocess.run(["bash", os.path.join(REPO, "examples", "pos_tagging", "run_ud_treebanks.sh"),
                             str(tmp_path / "ud")], capture_output=True, text=True, env=env, cwd=REPO)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "skip English-GUM: no *-ud-train.conllu" in result.stderr
    rows = [line for line in result.stdout.splitlines() if line.startswith("| English-EWT")]
    assert len(rows) == 1 and len(rows[0].split("|")) == 5  # one treebank, two variants
    assert "**macro mean**" in result.stdout
    runs = out / "English-EWT"
    assert (runs / "learning_curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    validated = (runs / "runs" / "p_r" / "seed1" / "validate.log").read_text()
    assert "valid on 'test' subset" in validated and "oov_accuracy" in validated
    assert "| SAN+P+R | 1 |" in (runs / "results.md").read_text()
