"""``make check-install`` as the README gives it: from a clone whose path has a space, with its default work
folder inside the clone, the own-environment install (scripts/check_install.sh) passes end to end: a fresh
virtualenv with torch and fairseq first, ``pip install`` of the tree, then the installed plugin prepares,
parses, trains, translates and scores from outside the repository."""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from model_helpers import REPO
from test_packaging import tracked_files


@pytest.mark.slow
@pytest.mark.install
def test_make_check_install_passes_as_the_readme_gives_it(tmp_path):
    if shutil.which("make") is None:
        pytest.skip("needs GNU make, as the README's commands do")
    clone = tmp_path / "a clone with spaces"
    for name in tracked_files():
        (clone / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(f"{REPO}/{name}", clone / name)
    subprocess.run(["git", "init", "-q"], cwd=clone, check=True)  # the script lists the tree with git
    # fairseq-fixed's wheel as `make install` built it for this virtualenv (.venv/wheels), not built again (25 s of CPU)
    env = {**os.environ, "FAIRSEQ_WHEELS": str(Path(sys.prefix) / "wheels")}
    result = subprocess.run(["make", "check-install"], cwd=clone, env=env, capture_output=True, text=True,
                            timeout=1500)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    assert f"install check passed in {clone.resolve()}/check-install-output" in result.stdout
    assert "BLEU" in result.stdout  # posattn-score's table of the installed plugin's translation


@pytest.mark.parametrize("goals,script", [("gpu-check", "gpu_check"), ("install gpu-check", "gpu_check"),
                                          ("gpu-verify", "gpu_verify")])
def test_a_gpu_target_says_in_one_line_that_it_needs_a_gpu_before_installing(goals, script, tmp_path):
    if shutil.which("nvidia-smi"):
        pytest.skip("this machine has a GPU")
    result = subprocess.run(["make", "-s", *goals.split()], cwd=REPO, capture_output=True, text=True, timeout=600)
    assert result.returncode == 2
    (line,) = [line for line in result.stderr.splitlines() if not re.match(r"make(\[\d+\])?: ", line)]  # make's own
    target = goals.split()[-1]
    assert line == (f"make {target} needs an NVIDIA GPU (no nvidia-smi here); on a CPU, "
                    f"`.venv/bin/python scripts/{script}.py --device cpu --tiny` runs its smoke form")
