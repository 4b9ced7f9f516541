"""Translation data pipeline and BLEU scoring on a few real Multi30k lines (fast: no training)."""

import itertools
import os
from pathlib import Path

import pytest
from sacrebleu.metrics import BLEU
from sacremoses import MosesDetokenizer, MosesTokenizer

from fairseq_posattn.cli import score as score_cli
from fairseq_posattn.data.generate_output import parse_hypotheses, score_generate_output
from fairseq_posattn.data.text_pipeline import (
    apply_bpe_file,
    check_parallel,
    learn_bpe,
    moses_tokenize_file,
    prepare_translation_corpus,
    remove_bpe,
)

SAMPLE = Path(__file__).resolve().parent.parent / "data" / "multi30k_sample"
N = 40


def head(path: Path, n: int = N):
    with open(path, encoding="utf-8") as f:
        return [line.rstrip("\n") for line in itertools.islice(f, n)]


def write(path: Path, lines):
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


@pytest.fixture
def raw_dir(tmp_path):
    """The first N lines of every split of the shipped sample."""
    raw = tmp_path / "raw"
    raw.mkdir()
    for split in ("train", "valid", "test"):
        for lang in ("en", "de"):
            write(raw / f"{split}.{lang}", head(SAMPLE / f"{split}.{lang}"))
    return raw


@pytest.mark.parametrize("lang", ["en", "de"])
def test_tokenization_matches_sacremoses(tmp_path, lang):
    src = SAMPLE / f"train.{lang}"
    out = tmp_path / f"train.tok.{lang}"
    assert moses_tokenize_file(str(src), str(out), lang, max_lines=N) == N
    tokenizer = MosesTokenizer(lang=lang)
    expected = [tokenizer.tokenize(line, return_str=True, escape=False) for line in head(src)]
    assert out.read_text(encoding="utf-8").splitlines() == expected
    assert not [p for p in os.listdir(tmp_path) if p.endswith(".tmp")]  # atomic write left nothing


def test_bpe_round_trip(tmp_path):
    tok = [tmp_path / "train.tok.en", tmp_path / "train.tok.de"]
    for path, lang in zip(tok, ("en", "de")):
        moses_tokenize_file(str(SAMPLE / f"train.{lang}"), str(path), lang, max_lines=200)
    codes = tmp_path / "bpe.codes"
    assert learn_bpe([str(p) for p in tok], str(codes), 100) == 100
    for path in tok:
        out = tmp_path / (path.name + ".bpe")
        apply_bpe_file(str(codes), str(path), str(out))
        segmented = out.read_text(encoding="utf-8").splitlines()
        original = path.read_text(encoding="utf-8").splitlines()
        assert any("@@ " in line for line in segmented)  # BPE did split words
        assert [remove_bpe(line) for line in segmented] == original


def test_prepare_translation_corpus(raw_dir, tmp_path):
    out = tmp_path / "prepared"
    prepare_translation_corpus(str(raw_dir), str(out), "en", "de", bpe_merges=200)
    for split in ("train", "valid", "test"):
        for lang in ("en", "de"):
            tok = (out / f"{split}.tok.{lang}").read_text(encoding="utf-8").splitlines()
            bpe = (out / f"{split}.bpe.{lang}").read_text(encoding="utf-8").splitlines()
            assert len(tok) == len(bpe) == N
            assert [remove_bpe(line) for line in bpe] == tok
    assert (out / "bpe.codes").read_text(encoding="utf-8").startswith("#version")


def test_mismatched_line_counts(tmp_path):
    src = write(tmp_path / "a.en", head(SAMPLE / "train.en", 5))
    tgt = write(tmp_path / "a.de", head(SAMPLE / "train.de", 4))
    with pytest.raises(ValueError) as err:
        check_parallel(str(src), str(tgt))
    message = str(err.value)
    assert f"{src} has 5 lines" in message and f"{tgt} has 4 lines" in message


def test_empty_line(tmp_path):
    de = head(SAMPLE / "train.de", 5)
    de[2] = "  "
    src = write(tmp_path / "a.en", head(SAMPLE / "train.en", 5))
    tgt = write(tmp_path / "a.de", de)
    with pytest.raises(ValueError, match=f"empty line at {tgt}:3") as err:
        check_parallel(str(src), str(tgt))
    assert str(src) in str(err.value)  # the fix names both files


def test_prepare_refuses_misaligned_raw_data(raw_dir, tmp_path):
    write(raw_dir / "valid.de", head(SAMPLE / "valid.de", N - 1))
    with pytest.raises(ValueError, match="valid.de has 39 lines"):
        prepare_translation_corpus(str(raw_dir), str(tmp_path / "out"), "en", "de", bpe_merges=50)
    assert not (tmp_path / "out" / "bpe.codes").exists()


def make_generate_output(tmp_path, n, order):
    """A hand-made fairseq-generate output: tokenized references (with a few words dropped, so BLEU
    is not 100) as hypotheses, printed in ``order`` as generate prints them, batch by batch."""
    tokenizer = MosesTokenizer(lang="de")
    refs = head(SAMPLE / "test.de", n)
    hyps = {i: tokenizer.tokenize(refs[i], return_str=True, escape=False) for i in range(n)}
    hyps = {i: " ".join(h.split()[:-2]) + " ." if i % 3 == 0 else h for i, h in hyps.items()}
    lines = ["2026-01-01 00:00:00 | INFO | fairseq_cli.generate | loading model(s)"]
    for i in order:
        lines += [f"S-{i}\tsource sentence", f"T-{i}\t{refs[i]}", f"H-{i}\t-0.{i + 100}\t{hyps[i]}",
                  f"D-{i}\t-0.{i + 100}\t{hyps[i]}", f"P-{i}\t-0.1 -0.2"]
    lines.append("Generate test with beam=5: BLEU4 = 1.00, 10.0/1.0/1.0/1.0 (BP=1.000)")
    ref_path = write(tmp_path / "ref.de", refs)
    return write(tmp_path / "generate-test.txt", lines), ref_path, hyps


def test_score_matches_sacrebleu(tmp_path, capsys):
    n = 12
    order = [7, 3, 11, 0, 5, 9, 1, 10, 2, 8, 4, 6]
    gen, ref, hyps = make_generate_output(tmp_path, n, order)
    assert list(parse_hypotheses(str(gen))) == order
    detok = [MosesDetokenizer(lang="de").detokenize(hyps[i].split()) for i in range(n)]
    expected = BLEU().corpus_score(detok, [head(ref, n)])
    assert 0 < expected.score < 100

    detok_path = tmp_path / "detok.de"
    score_cli.main([str(gen), "--ref", str(ref), "--write-detok", str(detok_path)])
    printed = capsys.readouterr().out.splitlines()
    assert printed[0] == str(expected)
    assert printed[0].startswith("BLEU = ")
    assert printed[1].startswith("nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:")
    assert detok_path.read_text(encoding="utf-8").splitlines() == detok
    assert score_generate_output(str(gen), str(ref), "de").score == pytest.approx(expected.score)


def test_score_hypothesis_count_mismatch(tmp_path, capsys):
    gen, ref, _ = make_generate_output(tmp_path, 12, order=range(8))  # last batch of 4 dropped
    write(ref, head(SAMPLE / "test.de", 12))
    with pytest.raises(SystemExit) as exit_info:
        score_cli.main([str(gen), "--ref", str(ref)])
    message = str(exit_info.value.code)
    assert f"{gen} has 8 hypotheses" in message
    assert f"{ref} has 12 lines" in message
    assert "missing ids 8, 9, 10, 11" in message
    assert "--required-batch-size-multiple 1" in message
    assert capsys.readouterr().out == ""
