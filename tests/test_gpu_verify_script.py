"""``scripts/gpu_verify.py`` (``make gpu-verify``) in its CPU smoke form: the three parts' tables written,
every fused path the CPU can take (flex_attention's forward, SDPA with gradients) agreeing with the explicit
path, checked by two processes side by side; without a GPU the real run stops in one line."""

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
    long_blocks = results["long_blocks"]
    assert any("Transformer LM (fairseq)" in row["check"] for row in long_blocks)
    assert {row["setting"].split(" tokens")[0] for row in long_blocks} == {"32", "16"}
    assert all(row["result"] in ("measured", "met", "MISSED") for row in long_blocks), long_blocks
    assert any("T5 relative bias" in row["check"] for row in results["translation"])
    assert any(row["variant"].startswith("distance-aware") for row in results["compilations"])
    report = (tmp_path / "report.md").read_text()
    for title in ("## a. Correctness", "## b. Long blocks", "## c. Translation lengths", "## c. Compilations"):
        assert title in report


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
