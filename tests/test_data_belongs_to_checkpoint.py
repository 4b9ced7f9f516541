"""Issue 34, numbers that must not be silently wrong: predicted tags are tags of the data (never ``<s>`` or
``</s>``), a checkpoint refuses a data directory whose dictionaries are not its own (posattn-tag, the hub,
fairseq-generate, fairseq-eval-lm), empty tagging splits and typo'd classification labels are caught
when the data is prepared, and posattn-tag refuses ``--batch-size 0`` and an ``--output`` that is its input.

Briefly trained tiny models (fairseq-train, one or two updates) on the shipped samples."""

import os
import re
import shutil
from typing import Dict, List

import pytest
import torch

from cli_helpers import binarize_in_process, error_line, prepare_sample, run, run_failing
from fairseq_posattn import hub
from fairseq_posattn.criterions.pos_tagging import PosTaggingCriterion
from fairseq_posattn.data.fingerprint import STATE_KEY, DataMismatchError
from fairseq_posattn.data.tagged_corpus import read_tagged_conllu
from fairseq_posattn.data.tagging_binarize import prepare_tagging_data
from fairseq_posattn.data.tagging_dataset import collate_tagging
from fairseq_posattn.tasks.pos_tagging import PosTaggingConfig, PosTaggingTask
from model_helpers import REPO, USER_DIR
from test_cli_translation import MODEL as TRANSLATION_MODEL
from test_cli_translation import TRAINING as TRANSLATION_TRAINING
from test_pos_tagging import EWT_DEV, EWT_TRAIN
from test_transformer_lm_cli import DATA as LM_DATA
from test_transformer_lm_cli import PTB
from test_transformer_lm_cli import TINY as LM_MODEL
from test_transformer_lm_cli import TRAINING as LM_TRAINING

SST2_TRAIN = os.path.join(REPO, "data", "sst2_sample", "stsa.binary.train")
TAGGER = [
    "--user-dir", USER_DIR, "--task", "pos_tagging", "--criterion", "pos_tagging", "--arch", "san_tagger",
    "--word-embed-dim", "16", "--char-embed-dim", "8", "--char-cnn-filters", "16", "--encoder-ffn-embed-dim", "32",
    "--encoder-layers", "1", "--encoder-attention-heads", "2", "--optimizer", "adam", "--lr", "0.0003",
    "--max-tokens", "2000", "--max-update", "2", "--no-epoch-checkpoints", "--num-workers", "0", "--cpu",
    "--seed", "1", "--disable-validation", "--log-format", "simple",
]


def real_tags(task: PosTaggingTask) -> List[str]:
    tags = task.vocabulary.tags
    return tags.symbols[tags.nspecial:]


def first_symbols(data_dir: str, name: str) -> List[str]:
    """The first two symbols of a dictionary file (fairseq's indices 4 and 5, after the special symbols)."""
    with open(os.path.join(data_dir, name), encoding="utf-8") as f:
        return [f.readline().split()[0] for _ in range(2)]


def swap_first_symbols(data_dir: str, name: str) -> None:
    """Exchange the first two symbols of ``data_dir/name``: same size, another order."""
    path = os.path.join(data_dir, name)
    with open(path, encoding="utf-8") as f:
        lines = f.read().splitlines()
    lines[0], lines[1] = lines[1], lines[0]
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")


def one_error_line(result) -> str:
    """The refusal of a posattn-* tool: status 1, no traceback, its last stderr line."""
    assert result.returncode == 1, result.stderr[-2000:]
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    return result.stderr.strip().splitlines()[-1]


@pytest.fixture(scope="module")
def tagging(tmp_path_factory) -> Dict[str, str]:
    """Data directories: the tagger's own; one of the same training sentences in reverse order (INTJ and
    SYM, once each, swap places in dict.tags.txt); one of XPOS tags."""
    root = tmp_path_factory.mktemp("tagging")
    with open(EWT_TRAIN, encoding="utf-8") as f:
        blocks = f.read().strip("\n").split("\n\n")
    reversed_train = root / "train.reversed.conllu"
    reversed_train.write_text("\n\n".join(reversed(blocks)) + "\n\n", encoding="utf-8")
    dirs = {name: str(root / name) for name in ("trained", "reordered", "xpos")}
    prepare_tagging_data({"train": [EWT_TRAIN], "valid": [EWT_DEV]}, dirs["trained"])
    prepare_tagging_data({"train": [str(reversed_train)], "valid": [EWT_DEV]}, dirs["reordered"])
    prepare_tagging_data({"train": [EWT_TRAIN], "valid": [EWT_DEV]}, dirs["xpos"], tag_column="xpos")
    return dirs


@pytest.fixture(scope="module")
def tagger(tagging, tmp_path_factory) -> str:
    """A tagger after two updates, whose raw argmax still picks special symbols for some words."""
    save_dir = str(tmp_path_factory.mktemp("tagger"))
    run("fairseq-train", [tagging["trained"], *TAGGER, "--save-dir", save_dir])
    return os.path.join(save_dir, "checkpoint_last.pt")


def load_tagger_hub(checkpoint: str, data: str):
    return hub.from_pretrained(os.path.dirname(checkpoint), os.path.basename(checkpoint), data)


# ------------------------------------------------------------------- (4) tags that are not tags --

@pytest.mark.slow
def test_posattn_tag_and_the_hub_write_only_tags_of_the_data(tagging, tagger, tmp_path):
    tagger_hub = load_tagger_hub(tagger, tagging["trained"])
    task, model = tagger_hub.task, tagger_hub.models[0]
    sentences = [s.words for s in read_tagged_conllu(EWT_DEV)]
    items = []
    for k, words in enumerate(sentences):
        word_ids, chars = task.vocabulary.encode_words(words, task.settings.max_chars)
        items.append({"id": k, "words": word_ids, "chars": chars.view(len(words), -1)})
    batch = collate_tagging(items, task.vocabulary, task.settings.max_chars)
    words = batch["net_input"]["src_tokens"]
    with torch.no_grad():
        raw = model(**batch["net_input"]).argmax(dim=-1)[words.ne(task.vocabulary.words.pad())]
    assert (raw < task.vocabulary.tags.nspecial).any(), "the situation of the issue: the raw argmax picks <s>, </s>"

    predicted = str(tmp_path / "dev.pred.conllu")
    run("posattn-tag", [tagging["trained"], "--path", tagger, "--input", EWT_DEV, "--output", predicted, "--cpu"])
    written = [s.tags for s in read_tagged_conllu(predicted)]
    assert sum(map(len, written)) == raw.numel()
    assert {tag for tags in written for tag in tags} <= set(real_tags(task))
    assert tagger_hub.tag(sentences) == written


def test_criterion_accuracy_counts_the_best_tag_of_the_data(tagging):
    task = PosTaggingTask.setup_task(PosTaggingConfig(data=tagging["trained"]))
    tags = task.vocabulary.tags
    target = torch.tensor([[tags.index("NOUN"), tags.index("VERB"), tags.index("DET")]])
    logits = torch.zeros(1, 3, len(tags))
    logits[0, :, tags.eos()] = 9.0  # an undertrained model's favourite: the end-of-sentence symbol
    logits[0, :, tags.bos()] = 8.0
    logits[0, 0, tags.index("NOUN")] = logits[0, 1, tags.index("VERB")] = logits[0, 2, tags.index("ADJ")] = 5.0
    sample = {"net_input": {}, "target": target, "flags": torch.zeros_like(target), "ntokens": 3, "nsentences": 1}
    _, _, logged = PosTaggingCriterion(task).forward(lambda: logits, sample)
    assert (int(logged["n_words"]), int(logged["n_correct"])) == (3, 2)
    assert task.predict_tags(logits).tolist() == [[tags.index("NOUN"), tags.index("VERB"), tags.index("ADJ")]]


# ------------------------------------------------ (5) a data dir that does not belong to the checkpoint --

@pytest.mark.slow
@pytest.mark.parametrize("data, difference", [
    ("reordered", "{data}/dict.tags.txt has 'SYM' at index 19 where the training data's {trained}/dict.tags.txt "
                  "had 'INTJ' (21 symbols in both)"),
    ("xpos", "{data}/dict.tags.txt holds 50 symbols, the training data's {trained}/dict.tags.txt held 21"),
], ids=["same-sentences-reordered", "another-tag-set"])
def test_posattn_tag_and_the_hub_refuse_a_data_dir_with_other_dictionaries(tagging, tagger, tmp_path, data,
                                                                           difference):
    data_dir, trained = tagging[data], tagging["trained"]
    output = tmp_path / "pred.conllu"
    message = one_error_line(run_failing("posattn-tag", [data_dir, "--path", tagger, "--input", EWT_DEV,
                                                         "--output", str(output), "--cpu"]))
    assert message.startswith(f"posattn-tag: error: {tagger} was trained with other dictionaries: ")
    assert difference.format(data=data_dir, trained=trained) in message
    assert message.endswith(f"use the data dir the model was trained with ({trained}), or one prepared from the "
                            "same files in the same way")
    assert "size mismatch" not in message
    assert not output.exists()
    with pytest.raises(DataMismatchError, match=f"^{re.escape(tagger)} was trained with other dictionaries: "
                                                f".*{re.escape(data_dir)}/dict.tags.txt"):
        load_tagger_hub(tagger, data_dir)


@pytest.mark.slow
def test_a_checkpoint_without_a_fingerprint_loads_as_before(tagging, tagger, tmp_path):
    state = torch.load(tagger, map_location="cpu", weights_only=False)
    del state["task_state"][STATE_KEY]
    older = str(tmp_path / "older.pt")
    torch.save(state, older)
    tagger_hub = load_tagger_hub(older, tagging["reordered"])
    assert len(tagger_hub.tag("The cat sat on the mat .")) == 7


@pytest.fixture(scope="module")
def translation(tmp_path_factory) -> Dict[str, str]:
    """A tiny transformer_posattn after one update, its data-bin and a copy with two symbols swapped."""
    root = tmp_path_factory.mktemp("translation")
    data_bin, swapped, save_dir = str(root / "data-bin"), str(root / "swapped"), str(root / "checkpoints")
    binarize_in_process(prepare_sample(str(root), lines=100, bpe_merges=300), data_bin)
    run("fairseq-train", [data_bin, *TRANSLATION_MODEL, *TRANSLATION_TRAINING, "--task", "translation",
                          "--max-update", "1", "--disable-validation", "--save-dir", save_dir])
    shutil.copytree(data_bin, swapped)
    for lang in ("en", "de"):  # a joined dictionary
        swap_first_symbols(swapped, f"dict.{lang}.txt")
    return {"data_bin": data_bin, "swapped": swapped, "checkpoint": os.path.join(save_dir, "checkpoint_last.pt")}


@pytest.mark.slow
def test_generate_refuses_a_data_dir_with_other_dictionaries(translation):
    first, second = first_symbols(translation["data_bin"], "dict.en.txt")
    result = run_failing("fairseq-generate", [translation["swapped"], "--user-dir", USER_DIR, "--path",
                                              translation["checkpoint"], "--gen-subset", "test", "--beam", "1",
                                              "--max-tokens", "2000", "--cpu"])
    expected = (f"the checkpoint was trained with other dictionaries: {translation['swapped']}/"
                f"dict.en.txt has {second!r} at index 4 where the training data's {translation['data_bin']}/"
                f"dict.en.txt had {first!r}")
    assert expected in error_line(result, "fairseq-generate")  # one line, no traceback
    assert "size mismatch" not in result.stderr


@pytest.mark.slow
def test_eval_lm_refuses_a_data_dir_with_other_dictionaries(tmp_path):
    """transformer_lm_posattn is a hydra-dataclass model: its config keeps no key of ours, the task state does."""
    data_bin, swapped, save_dir = str(tmp_path / "data-bin"), str(tmp_path / "swapped"), str(tmp_path / "checkpoints")
    run("fairseq-preprocess", ["--only-source", "--task", "language_modeling", "--workers", "1", "--trainpref",
                               f"{PTB}/train.txt", "--testpref", f"{PTB}/test.txt", "--destdir", data_bin])
    run("fairseq-train", [data_bin, *LM_MODEL, *LM_DATA, *LM_TRAINING, "--max-update", "1", "--save-dir", save_dir])
    shutil.copytree(data_bin, swapped)
    swap_first_symbols(swapped, "dict.txt")
    result = run_failing("fairseq-eval-lm", [swapped, "--user-dir", USER_DIR, "--path",
                                             os.path.join(save_dir, "checkpoint_last.pt"), "--gen-subset", "test",
                                             *LM_DATA, "--max-tokens", "4000", "--cpu", "--num-workers", "0"])
    first, second = first_symbols(data_bin, "dict.txt")
    assert (f"the checkpoint was trained with other dictionaries: {swapped}/dict.txt has "
            f"{second!r} at index 4 where the training data's {data_bin}/dict.txt had {first!r}") in \
        error_line(result, "fairseq-eval-lm")


# ------------------------------------------------------ (7) data preparation: empty splits, typo'd labels --

@pytest.mark.slow
@pytest.mark.parametrize("split", ["train", "valid"])
def test_prepare_tagging_refuses_an_empty_split(tmp_path, split):
    empty = tmp_path / "empty.conllu"
    empty.write_text("# only a comment\n", encoding="utf-8")
    files = {"train": EWT_TRAIN, "valid": EWT_DEV, split: str(empty)}
    destdir = tmp_path / "bin"
    message = one_error_line(run_failing("posattn-prepare-tagging", ["--train", files["train"], "--valid",
                                                                     files["valid"], "--destdir", str(destdir)]))
    assert message.startswith(f"posattn-prepare-tagging: error: {empty}: no sentence (the file is empty or holds "
                              f"only comments), so the {split} split would have no words to ")
    assert message.endswith(f"give --{split} a CoNLL-U file with tagged sentences")
    assert not destdir.exists()


@pytest.mark.slow
def test_prepare_classification_warns_about_a_rare_label_and_pins_the_label_set(tmp_path):
    train = tmp_path / "train.txt"
    lines = open(SST2_TRAIN, encoding="utf-8").read().splitlines()
    lines[41] = "01" + lines[41][1:]  # one typo'd label among 600 lines
    train.write_text("\n".join(lines) + "\n", encoding="utf-8")
    counts = {label: sum(line.split()[0] == label for line in lines) for label in ("0", "1")}
    ordered = sorted(counts, key=counts.get, reverse=True)

    warned = run("posattn-prepare-classification", ["--train", str(train), "--destdir", str(tmp_path / "text")])
    assert (f"WARNING | fairseq_posattn.data.sentence_classification | {train}:42: label '01' is on 1 of the "
            f"{len(lines)} training examples (labels: {ordered[0]!r} x{counts[ordered[0]]}, {ordered[1]!r} "
            f"x{counts[ordered[1]]}, '01' x1); every label becomes a class: if it is a typo, fix the line; pin the "
            "label set with --labels 0,1 (then any other label is an error)") in warned.stderr

    message = one_error_line(run_failing("posattn-prepare-classification", [
        "--train", str(train), "--labels", "0,1", "--destdir", str(tmp_path / "pinned")]))
    assert message.startswith(f"posattn-prepare-classification: error: {train}:42: label '01' is not one of 0, 1")
    assert not (tmp_path / "pinned").exists()


# ------------------------------------------------------------------------ (8) posattn-tag's options --

@pytest.mark.slow
def test_posattn_tag_refuses_batch_size_zero_and_an_output_that_is_its_input(tagging, tmp_path):
    gold = tmp_path / "dev.conllu"
    shutil.copy(EWT_DEV, gold)
    before = gold.read_bytes()
    result = run_failing("posattn-tag", [tagging["trained"], "--path", "unused.pt", "--input", str(gold),
                                         "--output", str(tmp_path / "out.conllu"), "--batch-size", "0"])
    assert result.returncode == 2
    assert "posattn-tag: error: argument --batch-size: must be at least 1, got 0" in result.stderr

    message = one_error_line(run_failing("posattn-tag", [tagging["trained"], "--path", "unused.pt", "--input",
                                                         str(gold), "--output", "dev.conllu"], cwd=str(tmp_path)))
    assert message == (f"posattn-tag: error: dev.conllu: the output is also an input (under the name {gold}); "
                       "writing it would destroy that input. Write the output to another file")
    assert gold.read_bytes() == before
