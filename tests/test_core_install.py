"""The library where torch alone is installed, as a researcher with their own PyTorch gets it: a fresh virtualenv
with torch, then ``pip install`` of a clean copy of the working tree without an extra installs that one
distribution and compiles nothing; the installed ``posattn`` runs the README's example and the library's tests
(``tests/test_core.py``, without the suite's conftest, which imports the fairseq front-end), and the fairseq
front-end says in one line what it needs."""

import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from model_helpers import REPO
from test_packaging import tracked_files

#: torch as the project pins it (requirements/build.txt)
TORCH = re.search(r"^torch==\S+", (Path(REPO) / "requirements" / "build.txt").read_text(), re.M).group(0)


def readme_example() -> str:
    """The Python block of the README's section "Without fairseq"."""
    readme = (Path(REPO) / "README.md").read_text(encoding="utf-8")
    section = readme[readme.index("### Without fairseq"):]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def frozen(python: Path) -> set:
    listing = subprocess.run([str(python), "-m", "pip", "freeze"], check=True, capture_output=True, text=True)
    return set(listing.stdout.splitlines())


@pytest.mark.slow
def test_pip_install_beside_torch_alone_adds_one_distribution_and_runs_the_readme_and_the_library_tests(tmp_path):
    env, source = tmp_path / "env", tmp_path / "source"
    subprocess.run([sys.executable, "-m", "venv", str(env)], check=True)
    python = env / "bin" / "python"
    pip = [str(python), "-m", "pip", "--disable-pip-version-check", "-q"]
    subprocess.run([*pip, "install", TORCH], check=True, timeout=900)
    before = frozen(python)
    for name in tracked_files():
        (source / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(Path(REPO) / name, source / name)

    start = time.perf_counter()
    install = subprocess.run([*pip, "install", "-v", str(source)], capture_output=True, text=True, timeout=900)
    seconds = time.perf_counter() - start
    assert install.returncode == 0, install.stderr[-3000:]
    added = frozen(python) - before
    assert [re.split("[=@ ]", line)[0] for line in added] == ["fairseq-posattn"], added
    assert not re.search(r"\b(gcc|g\+\+|c\+\+|nvcc|building extension)\b", install.stdout, re.I), "compiled"
    print(f"pip install of the tree beside torch: {seconds:.1f} s")

    example = subprocess.run([str(python), "-P", "-c", readme_example() + "\nprint(posattn.__file__)"],
                             cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert example.returncode == 0, example.stderr[-3000:]
    assert example.stdout.strip().startswith(str(env))  # the installed library, not the clone's

    plugin = subprocess.run([str(python), "-P", "-c", "import fairseq_posattn"], cwd=tmp_path, capture_output=True,
                            text=True, timeout=300)
    assert plugin.returncode == 1 and "pip install 'fairseq-posattn[fairseq]'" in plugin.stderr

    subprocess.run([*pip, "install", "pytest==8.3.4"], check=True, timeout=900)  # the test tool, after the check
    tests = subprocess.run([str(python), "-P", "-m", "pytest", "--noconftest", "-p", "no:cacheprovider", "-q",
                            "-rs", "tests/test_core.py"], cwd=REPO, capture_output=True, text=True, timeout=1200)
    assert tests.returncode == 0, tests.stdout[-4000:] + tests.stderr[-2000:]
    summary = tests.stdout.strip().splitlines()[-1]
    assert re.search(r"\d+ passed", summary) and "failed" not in summary, summary
    skipped = [line for line in tests.stdout.splitlines() if line.startswith("SKIPPED")]
    assert all("fairseq" in line for line in skipped), skipped
