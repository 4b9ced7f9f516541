"""What the tests of the length-extrapolation recipe's replicas (examples/pytorch, examples/huggingface) share:
running a recipe's command line or a script beside its modules in a subprocess (their modules have plain names,
``data``, ``model``, kept out of the test process), the checks of a scored record, and the sliding-window
perplexity recomputed token by token."""

import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Dict, List

import torch
from torch import Tensor, nn

REPO = Path(__file__).resolve().parents[1]
TESTS = REPO / "tests"
PYTORCH_EXAMPLE = REPO / "examples" / "pytorch"
SAMPLE_VALID_TOKENS = 4722  # data/ptb_sample/valid.txt: words and line ends
#: the fields of a scored record (a refused one has ``error`` instead of ``ppl``, ``loss``, ``tokens``,
#: ``wall_seconds``)
SCORED_FIELDS = {"method", "seed", "params", "train_seconds", "mode", "length", "status", "ppl", "loss", "tokens",
                 "wall_seconds"}


def run_recipe(script: Path, *args: str) -> subprocess.CompletedProcess:
    """A recipe's command line, as a user runs it from the repository root."""
    return subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True, cwd=REPO,
                          timeout=120)


def run_beside(code: str, *folders: Path) -> Dict:
    """``code`` run from the repository root with ``folders`` first on PYTHONPATH; the JSON of its last line."""
    path = os.pathsep.join([*map(str, folders), os.environ.get("PYTHONPATH", "")])
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO,
                            env=dict(os.environ, PYTHONPATH=path), timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.splitlines()[-1])


def check_scored_record(record: Dict) -> None:
    """A record that scored the sample's valid split: its fields, a finite perplexity equal to 2^loss, every token."""
    assert set(record) == SCORED_FIELDS and record["status"] == "ok", record
    assert math.isfinite(record["ppl"]) and record["tokens"] == SAMPLE_VALID_TOKENS, record
    assert math.isclose(2 ** record["loss"], record["ppl"], rel_tol=1e-9), record
    assert record["params"] > 0 and record["wall_seconds"] >= 0 and record["train_seconds"] > 0, record


def records_by_key(records: List[Dict]) -> Dict:
    """``(method, seed, mode, length) -> record``; each key once."""
    keyed = {(r["method"], r["seed"], r["mode"], r["length"]): r for r in records}
    assert len(keyed) == len(records), "a record repeated"
    return keyed


@torch.no_grad()
def sliding_perplexity_token_by_token(model: nn.Module, targets: Tensor, length: int) -> float:
    """The sliding window's perplexity from one forward pass per target over exactly the tokens its window reads:
    windows of length/2 targets, each after up to length/2 earlier tokens, the stream read from ``</s>`` (2).
    ``model``: tokens ``(batch, length)`` to next-token logits, in eval mode."""
    stride = length // 2
    stream = [2] + targets.tolist()  # token i is read before target i is predicted
    nll = 0.0
    for i in range(len(targets)):
        first_read = max(0, (i // stride) * stride - (length - stride))
        log_probs = torch.log_softmax(model(torch.tensor([stream[first_read:i + 1]]))[0, -1], dim=-1)
        nll -= log_probs[stream[i + 1]].item()
    return math.exp(nll / len(targets))
