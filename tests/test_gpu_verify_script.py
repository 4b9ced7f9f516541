"""``scripts/gpu_verify.py`` (``make gpu-verify``) in its CPU smoke form: the three parts' tables written,
every fused path the CPU can take (flex_attention's forward, SDPA with gradients) agreeing with the explicit
path, checked by two processes side by side in two sweeps, compilation timed apart; part a's order and its
notes on what it did not reach; without a GPU the real run stops in one line."""

import json
import subprocess
import sys

import pytest

from model_helpers import REPO

SCRIPT = f"{REPO}/scripts/gpu_verify.py"


@pytest.mark.slow
def test_the_smoke_run_writes_every_part_and_every_path_agrees(tmp_path):
    result = subprocess.run([sys.executable, SCRIPT, "--device", "cpu", "--tiny", "--jobs", "2", "--output", str(tmp_path)],
                            capture_output=True, text=True, cwd=REPO, timeout=900)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    results = json.loads((tmp_path / "results.json").read_text())
    rows = results["correctness"]
    assert rows and all(row["verdict"] == "agrees" for row in rows)
    paths = {(row["variant"], row["mode"], row["path"]) for row in rows}
    assert ("distance-aware", "scoring", "flex_attention") in paths
    assert ("structural-keys-only", "scoring", "flex_attention") in paths
    assert ("t5-bias", "training", "sdpa") in paths
    assert not any(row["path"] == "flex_attention" and row["mode"] == "training" for row in rows)  # no CPU backward
    assert {row["side"] for row in rows} == {"causal, right-padded", "bidirectional, left-padded"}
    # flex_attention at the self-check's batch (40 tokens: the tiny layers' limit) in the first sweep, at 17
    # in the second, each configuration's rows together; compilation timed apart (0 for paths that do not compile)
    flex = [row for row in rows if row["path"] == "flex_attention"]
    assert {(row["sweep"], row["lengths"]) for row in flex} == {(1, "40/27"), (2, "17/11")}
    assert {row["lengths"] for row in rows if row["path"] == "sdpa"} == {"17/11 40/26"}
    assert all(row["compile_seconds"] >= 0 and row["seconds"] >= row["compile_seconds"] for row in rows)
    assert all(row["compile_seconds"] == 0 for row in rows if row["path"] != "flex_attention")
    configurations = [(row["variant"], row["side"], row["dtype"]) for row in rows]
    assert configurations == sorted(configurations, key=configurations.index)  # each one's rows together
    assert all(row["sweep"] <= following["sweep"] for row, following in zip(rows, rows[1:])
               if (row["variant"], row["side"], row["dtype"]) == (following["variant"], following["side"],
                                                                  following["dtype"]))
    assert any(note.startswith("Correctness: ") and "compilation" in note for note in results["notes"])
    assert not any("not reached" in note for note in results["notes"])
    long_blocks = results["long_blocks"]
    assert any("Transformer LM (fairseq)" in row["check"] for row in long_blocks)
    assert {row["setting"].split(" tokens")[0] for row in long_blocks} == {"16"}
    assert all(row["result"] in ("measured", "met", "MISSED") for row in long_blocks), long_blocks
    assert any("T5 relative bias" in row["check"] for row in results["translation"])
    assert any(row["variant"].startswith("distance-aware") for row in results["compilations"])
    report = (tmp_path / "report.md").read_text()
    for title in ("## a. Correctness", "## b. Long blocks", "## c. Translation lengths", "## c. Compilations"):
        assert title in report
    assert "| lengths |" in report and "| compilation |" in report


def test_without_a_gpu_the_real_run_stops_in_one_line(tmp_path):
    result = subprocess.run([sys.executable, SCRIPT, "--output", str(tmp_path / "out")], capture_output=True,
                            text=True, cwd=REPO)
    assert result.returncode == 2
    assert result.stderr.startswith("gpu_verify: no CUDA device") and "Traceback" not in result.stderr
    assert "make gpu-verify" in result.stderr and "--device cpu --tiny" in result.stderr
    assert not (tmp_path / "out").exists()


def test_a_cut_off_correctness_run_has_checked_every_variant_in_bf16_on_its_first_side_first():
    import gpu_verify  # scripts/ is on pytest's pythonpath

    configurations = gpu_verify.ordered_configurations(gpu_verify.GPU)
    names = list(dict.fromkeys(name for name, *_ in configurations))
    head = configurations[: len(names)]
    assert [name for name, *_ in head] == names  # every variant once, before any variant twice
    assert all(dtype == "bfloat16" for *_, dtype in head)
    assert all((causal, right) == (True, True) for name, side, _, causal, right, _ in head if side == "decoder")
    assert len(configurations) == len({(name, causal, right, dtype) for name, _, _, causal, right, dtype in configurations})


def test_correctness_checks_every_configuration_then_the_flex_paths_at_their_longer_lengths(monkeypatch, tmp_path):
    import torch

    import gpu_verify

    calls = []

    def check(configuration, sizes, device, sweep):
        calls.append((gpu_verify.configuration_name(configuration), sweep))
        row = dict(variant=configuration[0], side="-", mode="training", dtype=configuration[5], path="p",
                   sweep=sweep, lengths="-", verdict="agrees", largest=0.0, tensor="output", at="-",
                   compile_seconds=1.0, check_seconds=0.5, seconds=1.5, errors={})
        return [row], []
    monkeypatch.setattr(gpu_verify, "check_configuration", check)
    monkeypatch.setattr(gpu_verify, "prepare_process", lambda: None)  # leaves this process's logging alone
    report = gpu_verify.Report(tmp_path, "cuda", [])
    gpu_verify.correctness(report, gpu_verify.GPU, torch.device("cuda"), 1e9, 1, lambda line: None)
    names = [gpu_verify.configuration_name(c) for c in gpu_verify.ordered_configurations(gpu_verify.GPU)]
    flex = [name for name, sweep in calls if sweep == 2]
    assert calls[:len(names)] == [(name, 1) for name in names] and calls[len(names):] == [(name, 2) for name in flex]
    assert 0 < len(flex) < len(names) and flex == [name for name in names if name in flex]  # SDPA-only layers too
    assert len(report.correctness) == len(calls)
    assert f"compilation {len(calls):.1f} s, checks {len(calls) / 2:.1f} s" in report.notes[0]


def test_a_correctness_budget_spent_at_once_names_every_configuration_not_reached(monkeypatch, tmp_path):
    import torch

    import gpu_verify

    monkeypatch.setattr(gpu_verify, "prepare_process", lambda: None)
    report = gpu_verify.Report(tmp_path, "cpu", [])
    gpu_verify.correctness(report, gpu_verify.TINY, torch.device("cpu"), 0, 1, lambda line: None)
    configurations = gpu_verify.ordered_configurations(gpu_verify.TINY)
    assert report.correctness == []
    first, flex = report.notes[1], report.notes[2]
    assert f"{len(configurations)} of {len(configurations)} layer configurations not reached" in first
    assert all(gpu_verify.configuration_name(c) in first for c in configurations)
    assert "flex_attention at 17/11 not reached" in flex
    assert "distance-aware (causal, right-padded, float32)" in flex
    assert report.notes == json.loads((tmp_path / "results.json").read_text())["notes"]
