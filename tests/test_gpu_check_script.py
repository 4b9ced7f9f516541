"""scripts/gpu_check.py: the smoke run (``--device cpu --tiny``) end to end on the CPU, every step
but the pytest sub-run (no tests inside tests): the shipped samples prepared, short trainings on one
device and on two gloo processes, BLEU and perplexity from the checkpoints, the loss curves, the
benchmark; and the refusals where the device asked for is not there."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Dict, List

import pytest
import torch

from fairseq_posattn.inspect.learning_curves import read_curve

REPO = Path(__file__).resolve().parent.parent
SCRIPT = str(REPO / "scripts" / "gpu_check.py")
COLUMNS = ("check", "device", "setting", "result", "numbers")


def gpu_check(args: List[str], timeout: float = 1800) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True, cwd=REPO,
                          timeout=timeout, env={**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}"
                                                                      f"{os.environ['PATH']}"})


def table_rows(report: str) -> List[Dict[str, str]]:
    """The rows of the report's table, as ``{column: cell}``."""
    lines = report.split("| check | device | setting | result | numbers |")[1].split("\n\n")[0].splitlines()
    rows = []
    for line in lines[2:]:
        cells = [cell.strip() for cell in re.split(r"(?<!\\)\|", line.strip())[1:-1]]
        rows.append(dict(zip(COLUMNS, cells)))
    return rows


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    output = tmp_path_factory.mktemp("gpu-check")
    completed = gpu_check(["--device", "cpu", "--tiny", "--skip", "pytest", "--families", "structural", "poslstm",
                           "--output", str(output)])
    return output, completed


@pytest.mark.slow
def test_tiny_cpu_run_writes_one_report_with_every_step(tiny_run):
    output, completed = tiny_run
    assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-3000:]
    report = (output / "report.md").read_text()
    rows = table_rows(report)
    by_check: Dict[str, List[Dict[str, str]]] = {}
    for row in rows:
        by_check.setdefault(row["check"], []).append(row)

    structural, = [r for r in by_check["train Structural PE (Wang et al.)"] if r["device"] == "cpu"]
    lm, = [r for r in by_check["train Positional attentive LSTM LM (Dagan)"] if r["device"] == "cpu"]
    precision = structural["setting"]
    assert precision in ("--bf16", "fp32") and lm["setting"] == precision
    assert structural["result"] == lm["result"] == "passed"
    assert re.search(r"BLEU \d+\.\d\d", structural["numbers"])
    assert "sacreBLEU `nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:" in report  # its own signature
    assert re.search(r"test ppl \d+\.\d", lm["numbers"])
    # the two-process runs (gloo, fairseq's default --ddp-backend pytorch_ddp)
    for check in ("train Structural PE (Wang et al.)", "train Positional attentive LSTM LM (Dagan)"):
        distributed, = [r for r in by_check[check] if r["device"] == "cpu, 2 processes (gloo)"]
        assert distributed["result"] == "passed", distributed
        assert "2 devices, --ddp-backend pytorch_ddp" in distributed["setting"]

    benchmark = [row for row in rows if row["check"].startswith("benchmark")]
    assert {row["check"] for row in benchmark} == {
        "benchmark train step: Transformer (fairseq)", "benchmark train step: Structural rel (r=16)",
        "benchmark beam search: Transformer (fairseq)", "benchmark beam search: Structural rel (r=16)"}
    assert all(row["result"] in ("measured", "met", "MISSED") for row in benchmark)
    assert (output / "benchmark.md").exists()
    long_lm = [row for row in rows if row["check"].startswith("long LM blocks, benchmark train step: ")]
    assert {(row["check"].split(": ")[1], row["setting"]) for row in long_lm} == {
        (model, "language model, blocks of 16") for model in ("Transformer LM (fairseq)", "DA-Transformer")}
    assert (output / "long-lm.md").exists()
    assert "FAILED" not in {row["result"] for row in rows}
    assert len(rows) == 10 and all(row["device"].startswith("cpu") for row in rows)  # 4 trainings, 4 + 2 benchmark


@pytest.mark.slow
def test_report_numbers_come_from_the_runs_logs(tiny_run):
    """The loss trend of each row is the first and last validation of its fairseq-train log, the same
    points are in results.json, and each family's PNG holds them."""
    output, completed = tiny_run
    assert completed.returncode == 0, completed.stderr[-3000:]
    results = json.loads((output / "results.json").read_text())
    assert results["mode"] == "tiny" and results["device"]["kind"] == "cpu"
    rows = {(row["check"], row["device"], row["setting"]): row for row in results["rows"]}
    assert len(rows) == len(table_rows((output / "report.md").read_text()))
    for family, check in (("structural", "train Structural PE (Wang et al.)"),
                          ("poslstm", "train Positional attentive LSTM LM (Dagan)")):
        name = next(name for name in results["valid_loss"] if name.startswith(family) and "-x" not in name)
        points = read_curve(str(output / "logs" / "train" / f"{name}.log"), metric="loss").points
        assert [tuple(point) for point in results["valid_loss"][name]] == points and len(points) >= 2
        numbers, = [row["numbers"] for (name, device, _), row in rows.items() if (name, device) == (check, "cpu")]
        trend = f"valid loss {points[0][1]:.2f} -> {points[-1][1]:.2f} ({int(points[-1][0])} updates)"
        assert numbers.startswith(trend), numbers
        assert (output / f"loss-{family}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal where torch sees no GPU")
def test_without_cuda_the_check_says_so_and_fails(tmp_path):
    completed = gpu_check(["--output", str(tmp_path / "out")], timeout=120)
    assert completed.returncode == 2
    assert "no CUDA device" in completed.stderr and "--device cpu --tiny" in completed.stderr
    assert not (tmp_path / "out").exists()


def test_cpu_runs_only_the_smoke_sizes_and_precisions():
    completed = gpu_check(["--device", "cpu"], timeout=120)
    assert completed.returncode == 2 and "--device cpu runs only with --tiny" in completed.stderr
    completed = gpu_check(["--device", "cpu", "--tiny", "--precisions", "fp16"], timeout=120)
    assert completed.returncode == 2 and "need CUDA" in completed.stderr
