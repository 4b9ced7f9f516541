"""Running fairseq's and our console tools in subprocesses, as a user would."""

import os
import subprocess
import sys
from typing import Callable, Dict, List

import pytest

from fairseq_posattn.data.text_pipeline import prepare_translation_corpus
from model_helpers import REPO

SAMPLE = os.path.join(REPO, "data", "multi30k_sample")
BIN = os.path.dirname(sys.executable)


def run(tool: str, args: List[str], **kwargs) -> subprocess.CompletedProcess:
    """Run a console tool of the virtualenv; fail with its output if it fails."""
    result = subprocess.run([os.path.join(BIN, tool), *args], capture_output=True, text=True,
                            cwd=kwargs.pop("cwd", REPO), **kwargs)
    assert result.returncode == 0, f"{tool} failed:\n{result.stdout[-3000:]}\n{result.stderr[-5000:]}"
    return result


def run_failing(tool: str, args: List[str], **kwargs) -> subprocess.CompletedProcess:
    """Run a console tool that must fail; return its result for the message checks."""
    result = subprocess.run([os.path.join(BIN, tool), *args], capture_output=True, text=True,
                            cwd=kwargs.pop("cwd", REPO), **kwargs)
    assert result.returncode != 0, f"{tool} should have failed:\n{result.stdout[-2000:]}"
    return result


def prepare_sample(root: str, lines: int = 300, bpe_merges: int = 800) -> str:
    """Tokenize and BPE the first ``lines`` of each split of the shipped Multi30k sample."""
    prepared = os.path.join(root, "prepared")
    prepare_translation_corpus(SAMPLE, prepared, "en", "de", bpe_merges=bpe_merges, max_lines=lines)
    return prepared


def binarize(prepared: str, data_bin: str) -> None:
    run("fairseq-preprocess", [
        "--source-lang", "en", "--target-lang", "de", "--joined-dictionary", "--workers", "1",
        "--trainpref", f"{prepared}/train.bpe", "--validpref", f"{prepared}/valid.bpe",
        "--testpref", f"{prepared}/test.bpe", "--destdir", data_bin,
    ])


def hypotheses(generate_output: str) -> Dict[int, str]:
    """``H-<id>`` lines of fairseq-generate / fairseq-interactive output, by id."""
    found = {}
    for line in generate_output.splitlines():
        if line.startswith("H-"):
            ident, _score, text = line.split("\t")
            found[int(ident[2:])] = text
    return found


def error_line(result: subprocess.CompletedProcess, name: str) -> str:
    """The single ``NAME: error: ...`` line of a failed command, which printed no traceback."""
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    lines = [line for line in result.stderr.splitlines() if line.startswith(f"{name}: error: ")]
    assert len(lines) == 1, result.stderr[-3000:]
    return lines[0]


def main_error(main: Callable, *args) -> str:
    """The message with which a console script's ``main``, called in this process, exits unsuccessfully."""
    with pytest.raises(SystemExit) as exit_info:
        main([str(arg) for arg in args])
    assert exit_info.value.code not in (0, None)
    return str(exit_info.value.code)
