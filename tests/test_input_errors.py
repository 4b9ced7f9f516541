"""Inputs that cannot silently go wrong (issue 16; docs/input_checks.md).

Every case drives the real console script (``posattn-*`` on the virtualenv's PATH) on the shipped samples,
corrupted in ``tmp_path`` as the case needs, and checks the exit status, that the message names the file
and line, and that no output, partial file or hidden temporary file is left (directory listings include
dotfiles). Variants of a case call the same ``main`` in this process (:func:`main_error`), which saves the
seconds each console script spends importing fairseq.
"""

import os
import random
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import List, Tuple

import pytest

from cli_helpers import BIN, SAMPLE, error_line, main_error, parse_in_process, preprocess_in_process
from fairseq_posattn.atomic_io import TERMINATED_EXIT_STATUS, read_lines, remove_stale_temporaries
from fairseq_posattn.cli import (INTERRUPTED_EXIT_STATUS, compare, prepare_structure, prepare_tagging,
                                 prepare_translation, score, tag)
from fairseq_posattn.data.tagged_corpus import read_tagged_conllu
from fairseq_posattn.data.text_pipeline import load_bpe, prepare_translation_corpus
from fairseq_posattn.structure.conllu_io import read_conllu
from model_helpers import REPO, USER_DIR

pytestmark = pytest.mark.slow

ENV = dict(os.environ, PATH=BIN + os.pathsep + os.environ["PATH"])
EWT = os.path.join(REPO, "data", "ud_ewt_sample")
EWT_TRAIN = os.path.join(EWT, "en_ewt-ud-train.sample.conllu")
EWT_DEV = os.path.join(EWT, "en_ewt-ud-dev.sample.conllu")
LINES = 100  # of each Multi30k split


def tool(name: str, *args, rc: int = 0) -> subprocess.CompletedProcess:
    """Run a console script found on PATH (the virtualenv's bin first); check its exit status."""
    result = subprocess.run([name, *map(str, args)], capture_output=True, text=True, env=ENV, cwd=REPO)
    assert result.returncode == rc, (f"{name} exited {result.returncode}, expected {rc}:\n"
                                     f"{result.stdout[-2000:]}\n{result.stderr[-4000:]}")
    return result


def listing(directory: Path) -> List[str]:
    """Every name in ``directory``, hidden ones included."""
    return sorted(os.listdir(directory))


def latin1_line(source: Path, dest: Path, from_line: int) -> int:
    """Copy ``source`` to ``dest`` with one Latin-1 'é' (byte 0xe9) in the first line from ``from_line`` on
    that has an 'e'; return that line's number (1-based)."""
    lines = source.read_bytes().splitlines(keepends=True)
    number = next(k for k in range(from_line, len(lines) + 1) if b"e" in lines[k - 1])
    lines[number - 1] = lines[number - 1].replace(b"e", "é".encode("latin-1"), 1)
    dest.write_bytes(b"".join(lines))
    return number


def head_lines(source: str, dest: Path, n: int) -> Path:
    dest.write_text("".join(f"{line}\n" for _, line in zip(range(n), read_lines(source))), encoding="utf-8")
    return dest


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    """The first LINES lines of every Multi30k split, tokenized, BPE'd, binarized; test.tok.en parsed; prepared in
    this process (the cases' inputs, not what they check)."""
    root = tmp_path_factory.mktemp("corpus")
    prepared = root / "prepared"
    prepare_translation_corpus(SAMPLE, str(prepared), "en", "de", bpe_merges=500, max_lines=LINES)
    preprocess_in_process(["--source-lang", "en", "--target-lang", "de", "--joined-dictionary", "--workers", "1",
                           "--trainpref", prepared / "train.bpe", "--validpref", prepared / "valid.bpe",
                           "--testpref", prepared / "test.bpe", "--destdir", root / "data-bin"])
    parse_in_process(["--backend", "spacy", "--input", prepared / "test.tok.en", "--output", prepared / "test.conllu"])
    return root


# ----------------------------------------------------------------- posattn-prepare-translation --

def test_prepare_translation_checks_options_before_writing(tmp_path, capsys):
    out = tmp_path / "out"
    common = ["--raw-dir", SAMPLE, "--out-dir", out, "-s", "en", "-t", "de"]
    result = tool("posattn-prepare-translation", *common, "--bpe-merges", "0", rc=2)
    assert "argument --bpe-merges: must be at least 1, got 0" in error_line(result, "posattn-prepare-translation")
    assert listing(tmp_path) == []
    for args, message in ((["--max-lines", "0"], "argument --max-lines: must be at least 1, got 0"),
                          (["--splits", "valid", "test"], "--splits valid test lacks train, on which BPE is learned"),
                          (["--splits", "train", "test", "test"], "--splits train test test names a split twice")):
        with pytest.raises(SystemExit):
            prepare_translation.main([str(arg) for arg in common + args])
        assert message in capsys.readouterr().err
    with pytest.raises(ValueError, match=r"bpe_merges \(--bpe-merges\) must be at least 1, got 0"):
        prepare_translation_corpus(SAMPLE, str(out), "en", "de", bpe_merges=0)
    with pytest.raises(ValueError, match=r"max_lines \(--max-lines\) must be at least 1"):
        prepare_translation_corpus(SAMPLE, str(out), "en", "de", max_lines=0)

    raw = tmp_path / "raw"
    raw.mkdir()
    for name in ("train.en", "train.de", "valid.en", "test.en", "test.de"):  # valid.de is missing
        head_lines(os.path.join(SAMPLE, name), raw / name, 20)
    message = main_error(prepare_translation.main, "--raw-dir", raw, "--out-dir", out, "-s", "en", "-t", "de")
    assert f"no raw file {raw / 'valid.de'}" in message
    assert listing(tmp_path) == ["raw"]


# -------------------------------------------------------------------- non-UTF-8, every reader --

def _prepare_translation_case(tmp_path: Path, corpus: Path) -> Tuple[List[str], Path, int, Path]:
    raw = tmp_path / "raw"
    raw.mkdir()
    for split in ("train", "valid", "test"):
        for lang in ("en", "de"):
            head_lines(os.path.join(SAMPLE, f"{split}.{lang}"), raw / f"{split}.{lang}", 30)
    shutil.copy(raw / "train.en", tmp_path / "utf8.en")
    number = latin1_line(tmp_path / "utf8.en", raw / "train.en", 17)
    args = ["--raw-dir", raw, "--out-dir", tmp_path / "out", "-s", "en", "-t", "de", "--bpe-merges", "50"]
    return args, raw / "train.en", number, tmp_path


def _parse_case(tmp_path: Path, corpus: Path):
    bad = tmp_path / "test.tok.en"
    number = latin1_line(corpus / "prepared" / "test.tok.en", bad, 4)
    out = tmp_path / "out"
    return ["--backend", "spacy", "--input", bad, "--output", out / "test.conllu"], bad, number, out


def _structure_args(corpus: Path, conllu: Path, bpe: Path, data_bin: Path) -> List:
    return ["--conllu", conllu, "--bpe", bpe, "--destdir", data_bin, "--split", "test",
            "--source-lang", "en", "--target-lang", "de"]


def _structure_bpe_case(tmp_path: Path, corpus: Path):
    bad = tmp_path / "test.bpe.en"
    number = latin1_line(corpus / "prepared" / "test.bpe.en", bad, 10)
    data_bin = tmp_path / "data-bin"
    shutil.copytree(corpus / "data-bin", data_bin)
    return _structure_args(corpus, corpus / "prepared" / "test.conllu", bad, data_bin), bad, number, data_bin


def _structure_conllu_case(tmp_path: Path, corpus: Path):
    bad = tmp_path / "test.conllu"
    number = latin1_line(corpus / "prepared" / "test.conllu", bad, 40)
    data_bin = tmp_path / "data-bin"
    shutil.copytree(corpus / "data-bin", data_bin)
    return _structure_args(corpus, bad, corpus / "prepared" / "test.bpe.en", data_bin), bad, number, data_bin


def _score_case(tmp_path: Path, corpus: Path):
    ref = head_lines(os.path.join(SAMPLE, "test.de"), tmp_path / "test.de", LINES)
    good = write_generate_output(tmp_path / "good.txt", list(read_lines(corpus / "prepared" / "test.tok.de")))
    bad = tmp_path / "generate-test.txt"
    number = latin1_line(good, bad, 30)
    good.unlink()
    out = tmp_path / "out"
    return [bad, "--ref", ref, "--write-detok", out / "detok.de"], bad, number, out


def _prepare_tagging_case(tmp_path: Path, corpus: Path):
    bad = tmp_path / "train.conllu"
    number = latin1_line(Path(EWT_TRAIN), bad, 40)
    out = tmp_path / "out"
    return ["--train", bad, "--destdir", out / "bin"], bad, number, out


@pytest.mark.parametrize("name, case, main", [
    ("posattn-prepare-translation", _prepare_translation_case, None),
    ("posattn-parse", _parse_case, None),
    ("posattn-prepare-structure", _structure_bpe_case, None),
    ("posattn-prepare-structure", _structure_conllu_case, prepare_structure.main),
    ("posattn-score", _score_case, score.main),
    ("posattn-prepare-tagging", _prepare_tagging_case, prepare_tagging.main),
], ids=["prepare-translation", "parse", "structure-bpe", "structure-conllu", "score", "prepare-tagging"])
def test_non_utf8_input_names_file_and_line(tmp_path, corpus, name, case, main):
    args, bad, number, output_dir = case(tmp_path, corpus)
    output_dir.mkdir(exist_ok=True)
    before = listing(output_dir)
    message = main_error(main, *args) if main else error_line(tool(name, *args, rc=1), name)
    assert message.startswith(f"{name}: error: {bad}:{number}: not UTF-8 (byte 0xe9")
    assert f"iconv -f latin1 -t utf-8 {bad}" in message
    assert listing(output_dir) == before  # nothing written, no temporary file


# ------------------------------------------------------------------ posattn-prepare-structure --

def test_prepare_structure_missing_inputs_and_a_short_bpe_file(tmp_path, corpus):
    prepared, data_bin = corpus / "prepared", tmp_path / "data-bin"
    shutil.copytree(corpus / "data-bin", data_bin)
    before = listing(data_bin)
    name = "posattn-prepare-structure"
    missing = tmp_path / "missing.conllu"
    message = main_error(prepare_structure.main, *_structure_args(corpus, missing, prepared / "test.bpe.en", data_bin))
    assert message == f"{name}: error: --conllu {missing}: no such file"
    missing = tmp_path / "missing.bpe.en"
    message = main_error(prepare_structure.main, *_structure_args(corpus, prepared / "test.conllu", missing, data_bin))
    assert message == f"{name}: error: --bpe {missing}: no such file"

    short = tmp_path / "short.bpe.en"  # line 50 lost: every later line would be compared with the wrong parse
    lines = (prepared / "test.bpe.en").read_text(encoding="utf-8").splitlines(keepends=True)
    short.write_text("".join(lines[:49] + lines[50:]), encoding="utf-8")
    message = error_line(tool(name, *_structure_args(corpus, prepared / "test.conllu", short, data_bin), rc=1),
                         name)
    assert f"{short} has {LINES - 1} lines, {prepared / 'test.conllu'} has {LINES} sentences" in message
    assert f"{data_bin / 'test.en-de.en'}.{{bin,idx}} has {LINES} sentences" in message
    assert "word" not in message  # a count mismatch, not reported as a word mismatch
    assert listing(data_bin) == before

    prepare_structure.main([str(a) for a in _structure_args(corpus, prepared / "test.conllu",
                                                             prepared / "test.bpe.en", data_bin)])
    assert listing(data_bin) == sorted(before + ["test.en-de.en.structure.bin", "test.en-de.en.structure.idx"])


# --------------------------------------------------------------- posattn-score / -compare, BPE --

def write_generate_output(path: Path, hypotheses: List[str]) -> Path:
    """fairseq-generate's output format: per sentence S-/T-/H-/D-/P- lines, in shuffled (batch) order."""
    order = list(range(len(hypotheses)))
    random.Random(0).shuffle(order)
    lines = ["2026-01-01 00:00:00 | INFO | fairseq_cli.generate | loading model(s)"]
    for i in order:
        lines += [f"S-{i}\tsource", f"H-{i}\t-0.{i + 100}\t{hypotheses[i]}",
                  f"D-{i}\t-0.{i + 100}\t{hypotheses[i]}", f"P-{i}\t-0.1 -0.2"]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


@pytest.fixture
def generate_outputs(tmp_path, corpus):
    """One system's hypotheses (the tokenized references, every third line cut short) written as
    ``fairseq-generate --remove-bpe`` would print them and as it prints them without ``--remove-bpe``."""
    tokens = [line.split() for line in read_lines(corpus / "prepared" / "test.tok.de")]
    hypotheses = [" ".join(words[:-2] + ["."]) if k % 3 == 0 else " ".join(words) for k, words in enumerate(tokens)]
    bpe = load_bpe(str(corpus / "prepared" / "bpe.codes"))
    clean = write_generate_output(tmp_path / "generate-clean.txt", hypotheses)
    with_bpe = write_generate_output(tmp_path / "generate-bpe.txt", [bpe.segment(h) for h in hypotheses])
    ref = head_lines(os.path.join(SAMPLE, "test.de"), tmp_path / "test.de", LINES)
    return clean, with_bpe, ref


def test_score_and_compare_refuse_output_still_in_bpe(tmp_path, generate_outputs, capsys):
    clean, with_bpe, ref = generate_outputs
    bpe_lines = [n for n, line in enumerate(read_lines(with_bpe), 1) if line.startswith("H-") and "@@ " in line]
    assert len(bpe_lines) > LINES // 10  # many lines of a BPE output hold a split word
    before = listing(tmp_path)
    message = error_line(tool("posattn-score", with_bpe, "--ref", ref, "--write-detok", tmp_path / "detok.de",
                              rc=1), "posattn-score")
    assert f"{with_bpe}:{bpe_lines[0]}: hypotheses still in BPE: {len(bpe_lines)} of {LINES} hypotheses" in message
    assert "Rerun fairseq-generate with --remove-bpe, or pass --remove-bpe" in message
    assert listing(tmp_path) == before  # no detok file

    compare_args = ["baseline=" + str(clean), "other=" + str(with_bpe), "--ref", str(ref), "--paired-bs-n", "100"]
    message = error_line(tool("posattn-compare", *compare_args, rc=1), "posattn-compare")
    assert f"{with_bpe}:{bpe_lines[0]}: hypotheses still in BPE" in message

    score.main([str(clean), "--ref", str(ref)])
    scored = capsys.readouterr().out
    score.main([str(with_bpe), "--ref", str(ref), "--remove-bpe"])
    assert capsys.readouterr().out == scored  # joined here exactly as fairseq-generate --remove-bpe would
    assert float(scored.split()[2]) > 50
    compare.main(compare_args + ["--remove-bpe"])
    other_row = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("| other |"))
    assert "| +0.00 |" in other_row and "| 1.0000 |" in other_row  # the same translations: no difference


def test_a_rare_literal_at_at_token_is_a_warning(tmp_path, corpus, capsys):
    tokens = list(read_lines(corpus / "prepared" / "test.tok.de"))
    tokens[7] = tokens[7] + " @@ x"  # one line in a hundred: not BPE, e.g. a literal '@@' in the text
    gen = write_generate_output(tmp_path / "generate-test.txt", tokens)
    line = next(n for n, text in enumerate(read_lines(gen), 1) if text.startswith("H-7\t"))
    ref = head_lines(os.path.join(SAMPLE, "test.de"), tmp_path / "test.de", LINES)
    score.main([str(gen), "--ref", str(ref)])
    captured = capsys.readouterr()
    assert f"{gen}:{line}: 1 of {LINES} hypotheses hold BPE continuation markers" in captured.err
    assert captured.out.startswith("BLEU = ")


# -------------------------------------------------------------------------------- posattn-tag --

@pytest.fixture(scope="module")
def tagger(tmp_path_factory) -> Tuple[str, str]:
    """A UPOS tagger trained for a few updates on the EWT sample: (data directory, checkpoint)."""
    root = tmp_path_factory.mktemp("tagger")
    data, save = str(root / "bin"), str(root / "checkpoints")
    tool("posattn-prepare-tagging", "--train", EWT_TRAIN, "--valid", EWT_DEV, "--destdir", data)
    tool("fairseq-train", data, "--user-dir", USER_DIR, "--task", "pos_tagging", "--criterion", "pos_tagging",
         "--arch", "san_tagger", "--word-embed-dim", "16", "--encoder-ffn-embed-dim", "32",
         "--char-cnn-filters", "16", "--optimizer", "adam", "--lr", "0.003", "--max-tokens", "1000",
         "--max-update", "2", "--save-dir", save, "--no-epoch-checkpoints", "--num-workers", "0", "--cpu",
         "--disable-validation", "--no-save-optimizer-state")
    return data, os.path.join(save, "checkpoint_last.pt")


def xpos_in_upos_column(dest: Path, from_line: int = 1) -> Tuple[Path, int]:
    """The EWT dev sample with the XPOS tags copied into the UPOS column from ``from_line`` on; return
    the file and the first line changed."""
    lines = Path(EWT_DEV).read_text(encoding="utf-8").splitlines(keepends=True)
    first = None
    for k in range(from_line - 1, len(lines)):
        cols = lines[k].split("\t")
        if len(cols) == 10 and cols[0].isdigit():
            cols[3] = cols[4]
            lines[k] = "\t".join(cols)
            first = first or k + 1
    dest.write_text("".join(lines), encoding="utf-8")
    return dest, first


def test_tag_warns_about_unknown_gold_tags_and_refuses_when_all_are(tmp_path, tagger, capsys):
    data, checkpoint = tagger
    tags = set(Path(data, "dict.tags.txt").read_text(encoding="utf-8").split()[::2])
    out = tmp_path / "out"
    out.mkdir()
    half = len(Path(EWT_DEV).read_text(encoding="utf-8").splitlines()) // 2
    partly, first = xpos_in_upos_column(tmp_path / "partly.conllu", from_line=half)
    result = tool("posattn-tag", data, "--path", checkpoint, "--input", partly, "--output", out / "p.conllu", "--cpu")
    warning = next(line for line in result.stderr.splitlines() if "WARNING | posattn-tag" in line)
    gold_tag = partly.read_text(encoding="utf-8").splitlines()[first - 1].split("\t")[3]
    assert gold_tag not in tags
    assert f"{partly}:{first}: gold UPOS tag {gold_tag!r} is not one of the model's {len(tags)} tags" in warning
    assert "are unknown to the model and count as wrong" in warning and "XPOS tags in the UPOS column" in warning
    assert "UPOS accuracy" in result.stdout and listing(out) == ["p.conllu"]

    xpos, first = xpos_in_upos_column(tmp_path / "xpos.conllu")
    gold = [tag for s in read_tagged_conllu(str(xpos), "upos", require_tags=False) for tag in s.tags if tag != "_"]
    assert not set(gold) & tags  # PTB tags only: the precondition of this case
    message = error_line(tool("posattn-tag", data, "--path", checkpoint, "--input", xpos,
                              "--output", out / "x.conllu", "--cpu", rc=1), "posattn-tag")
    assert f"{xpos}:{first}: gold UPOS tag" in message
    assert f"neither is any of the {len(gold)} gold tags of the file" in message
    assert "--tag-column xpos" in message and "--no-gold" in message
    assert listing(out) == ["p.conllu"]  # nothing written for the refused file

    tag.main([data, "--path", checkpoint, "--input", str(xpos), "--output", str(out / "x.conllu"), "--cpu",
              "--no-gold"])
    assert "accuracy" not in capsys.readouterr().out and listing(out) == ["p.conllu", "x.conllu"]


# ------------------------------------------------------------------- posattn-parse and signals --

def _start_parse(text: Path, output: Path) -> subprocess.Popen:
    """posattn-parse with SIGINT at its default: a test suite started in the background (``... &``,
    as CI may run it) has SIGINT ignored, which children inherit, and Python then never raises
    KeyboardInterrupt."""
    return subprocess.Popen(["posattn-parse", "--backend", "spacy", "--batch-size", "64", "--input", str(text),
                             "--output", str(output)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True, env=ENV, cwd=REPO,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


def _wait_for_parsing(process: subprocess.Popen, directory: Path, deadline_s: float = 120) -> Path:
    """The hidden temporary output, once the parser has written parses to it (the model is loaded)."""
    deadline = time.monotonic() + deadline_s
    while process.poll() is None and time.monotonic() < deadline:
        temporaries = [directory / name for name in os.listdir(directory) if name.endswith(".tmp")]
        if temporaries and temporaries[0].stat().st_size > 0:
            return temporaries[0]
        time.sleep(0.02)
    raise AssertionError(f"posattn-parse never wrote parses: {process.communicate()[1][-2000:]}")


def test_parse_stopped_by_a_signal_leaves_nothing_and_a_killed_one_is_cleaned_by_the_rerun(tmp_path):
    text = head_lines(os.path.join(SAMPLE, "train.en"), tmp_path / "train.en", 1200)
    # the interrupted runs get the sample three times over (9,000 lines, seconds of parsing on an idle
    # machine), so that the signal always arrives while they are still writing
    long_text = tmp_path / "long.en"
    long_text.write_text(3 * Path(SAMPLE, "train.en").read_text(encoding="utf-8"), encoding="utf-8")
    out = tmp_path / "out"
    out.mkdir()
    output = out / "train.conllu"
    for sig, status, said in ((signal.SIGTERM, TERMINATED_EXIT_STATUS, ""),
                              (signal.SIGINT, INTERRUPTED_EXIT_STATUS, "posattn-parse: interrupted")):
        process = _start_parse(long_text, output)
        _wait_for_parsing(process, out)
        process.send_signal(sig)
        assert process.wait(timeout=60) == status
        assert said in process.stderr.read() and listing(out) == []  # no output, no temporary

    process = _start_parse(long_text, output)
    stale = _wait_for_parsing(process, out)
    process.kill()  # SIGKILL: no cleanup possible
    assert process.wait(timeout=60) == -signal.SIGKILL
    assert listing(out) == [stale.name] and stale.name.startswith(".train.conllu.")

    rerun = tool("posattn-parse", "--backend", "spacy", "--input", text, "--output", output)
    assert f"removed {stale}, left by an earlier run that was killed while writing {output}" in rerun.stderr
    assert listing(out) == ["train.conllu"]
    assert [s.words for s in read_conllu(str(output))] == [line.split() for line in read_lines(text)]


def test_a_live_writers_temporary_is_kept_and_a_killed_ones_removed(tmp_path):
    """The lock tells a killed writer from a live one that writes the same output right now."""
    target = tmp_path / "out.txt"
    writer = subprocess.Popen([os.path.join(BIN, "python"), "-c", (
        "import sys, time\n"
        "from fairseq_posattn.atomic_io import atomic_write\n"
        "with atomic_write(sys.argv[1]) as out:\n"
        "    print('writing', flush=True)\n"
        "    time.sleep(120)\n"), str(target)], stdout=subprocess.PIPE, text=True, cwd=REPO)
    assert writer.stdout.readline().strip() == "writing"
    (temporary,) = listing(tmp_path)
    assert remove_stale_temporaries(str(target)) == [] and listing(tmp_path) == [temporary]
    writer.kill()
    assert writer.wait(timeout=60) == -signal.SIGKILL
    assert remove_stale_temporaries(str(target)) == [str(tmp_path / temporary)] and listing(tmp_path) == []
