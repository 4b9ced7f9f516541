"""examples/huggingface/path_conversion.py: a RoPE Llama converted to PaTH attention by continued training, against
PaTH from scratch (Yang et al. 2025, arXiv 2505.16381), run as a user runs it (its command line in a subprocess, on
the shipped PTB sample, one seed, a budget of a few updates): both result files, a finite loss for every arm, the
converted model's configuration recording PaTH where the RoPE arms record no method, and a second command with
another budget into the same folder refused in one line before anything is redone."""

import json
import math
import subprocess
from pathlib import Path

import pytest

pytest.importorskip("transformers", reason="the Hugging Face recipe needs transformers (pip install '.[hf]')")
pytest.importorskip("accelerate", reason="transformers.Trainer needs accelerate (pip install '.[hf]')")

from extrapolation_example_helpers import REPO, SAMPLE_VALID_TOKENS, run_recipe  # noqa: E402

SCRIPT = REPO / "examples" / "huggingface" / "path_conversion.py"
ARMS = ("rope", "converted-at-switch", "converted", "scratch", "rope-continued")
TINY = ["--seeds", "1", "--pretrain-updates", "3", "--warmup", "1", "--dim", "32", "--intermediate-size", "64",
        "--heads", "2", "--train-length", "16", "--threads", "1"]


def conversion(out: Path, finetune_updates: str) -> subprocess.CompletedProcess:
    return run_recipe(SCRIPT, "--out", str(out), "--finetune-updates", finetune_updates, *TINY)


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("path-conversion")
    result = conversion(out, "2")
    assert result.returncode == 0, result.stderr[-3000:]
    return out


def settings(out: Path, arm: str) -> dict:
    return json.loads((out / arm / "seed1" / "run.json").read_text())["settings"]


def test_every_arm_has_a_finite_loss_in_both_result_files(finished):
    results = json.loads((finished / "results.json").read_text())
    assert [r["method"] for r in results["records"]] == list(ARMS)
    for record in results["records"]:
        assert record["status"] == "ok" and record["tokens"] == SAMPLE_VALID_TOKENS, record
        assert math.isfinite(record["loss"]) and 0 < record["loss"], record
        assert results["arms"][record["method"]]["loss_by_seed"] == {"1": record["loss"]}
    pair = results["pairs"]["converted - scratch"]
    assert pair["by_seed"]["1"] == results["arms"]["converted"]["mean"] - results["arms"]["scratch"]["mean"]
    table = (finished / "results.md").read_text()
    assert all(f"| {arm} |" in table for arm in ARMS) and "| converted - scratch |" in table


def test_the_converted_model_records_path_attention_and_the_rope_arms_none(finished):
    for arm in ("converted-at-switch", "converted", "scratch"):
        recorded = settings(finished, arm)
        assert recorded["position_method"]["options"] == {"path_attention": True}, recorded
        assert recorded["attn_implementation"] == "posattn_huggingface"
    for arm in ("rope", "rope-continued"):
        assert settings(finished, arm)["position_method"] is None
    records = {r["method"]: r for r in json.loads((finished / "results.json").read_text())["records"]}
    assert records["converted-at-switch"]["loss"] != records["rope"]["loss"]  # the switch changed the model
    assert records["converted"]["params"] == records["scratch"]["params"] > records["rope"]["params"]


def test_another_budget_into_the_same_folder_is_refused_in_one_line(finished):
    before = (finished / "results.json").stat().st_mtime_ns
    result = conversion(finished, "3")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "was run with other settings" in lines[0], result.stderr
    assert "finetune.updates: 2 there, 3 here" in lines[0] and "--out" in lines[0]
    assert (finished / "results.json").stat().st_mtime_ns == before
