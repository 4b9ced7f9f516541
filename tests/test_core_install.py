"""The library where torch alone is installed, as a researcher with their own PyTorch gets it: a fresh virtualenv
with torch, then ``pip install`` of a clean copy of the working tree without an extra installs that one
distribution and compiles nothing; the installed ``posattn`` runs the README's example and the library's tests
(``tests/test_core.py`` and ``tests/test_core_misuse.py``, without the suite's conftest, which imports the fairseq
front-end), and the fairseq front-end says in one line what it needs, on import and from one of the ``posattn-*``
commands the install put there. Then ``pip install ".[hf]"`` in the same environment (no fairseq) runs the README's
Hugging Face example."""

import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import List

import pytest

from model_helpers import REPO
from test_packaging import tracked_files

#: torch as the project pins it (requirements/build.txt)
TORCH = re.search(r"^torch==\S+", (Path(REPO) / "requirements" / "build.txt").read_text(), re.M).group(0)


def readme_example(section: str) -> str:
    """The first Python block of the README's ``section`` (its heading)."""
    readme = (Path(REPO) / "README.md").read_text(encoding="utf-8")
    return re.search(r"```python\n(.*?)```", readme[readme.index(section):], re.S).group(1)


def frozen(python: Path) -> set:
    listing = subprocess.run([str(python), "-m", "pip", "freeze"], check=True, capture_output=True, text=True)
    return set(listing.stdout.splitlines())


def pip_install(python: Path) -> List[str]:
    """``pip install`` of the environment whose interpreter is ``python``, quiet, writing no bytecode for what it
    installs (torch's takes 20 s; Python compiles what it imports)."""
    return [str(python), "-m", "pip", "--disable-pip-version-check", "-q", "install", "--no-compile"]


@pytest.fixture(scope="module")
def environment(tmp_path_factory) -> Path:
    """A fresh virtualenv with the pinned torch alone; its folder holds ``env/`` and ``source/``, a clean copy of
    the tracked files."""
    tmp_path = tmp_path_factory.mktemp("core-install")
    env, source = tmp_path / "env", tmp_path / "source"
    subprocess.run([sys.executable, "-m", "venv", str(env)], check=True)
    subprocess.run([*pip_install(env / "bin" / "python"), TORCH], check=True, timeout=900)
    for name in tracked_files():
        (source / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(Path(REPO) / name, source / name)
    return tmp_path


@pytest.mark.slow
def test_pip_install_beside_torch_alone_adds_one_distribution_and_runs_the_readme_and_the_library_tests(environment):
    tmp_path, source, env = environment, environment / "source", environment / "env"
    python = env / "bin" / "python"
    before = frozen(python)
    start = time.perf_counter()
    install = subprocess.run([*pip_install(python), "-v", str(source)], capture_output=True, text=True, timeout=900)
    seconds = time.perf_counter() - start
    assert install.returncode == 0, install.stderr[-3000:]
    added = frozen(python) - before
    assert [re.split("[=@ ]", line)[0] for line in added] == ["fairseq-posattn"], added
    assert not re.search(r"\b(gcc|g\+\+|c\+\+|nvcc|building extension)\b", install.stdout, re.I), "compiled"
    print(f"pip install of the tree beside torch: {seconds:.1f} s")

    code = readme_example("### Without fairseq") + "\nprint(posattn.__file__)"
    example = subprocess.run([str(python), "-P", "-c", code],
                             cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert example.returncode == 0, example.stderr[-3000:]
    assert example.stdout.strip().startswith(str(env))  # the installed library, not the clone's

    plugin = subprocess.run([str(python), "-P", "-c", "import fairseq_posattn"], cwd=tmp_path, capture_output=True,
                            text=True, timeout=300)
    assert plugin.returncode == 1 and "pip install 'fairseq-posattn[fairseq]'" in plugin.stderr
    command = subprocess.run([str(env / "bin" / "posattn-score"), "--help"], cwd=tmp_path, capture_output=True,
                             text=True, timeout=300)  # a console script the install put there: one line
    assert command.returncode == 1 and command.stderr.count("\n") == 1, command.stderr[-3000:]
    assert command.stderr.startswith("posattn-score: error: ") and 'pip install "fairseq-posattn[fairseq]"' in \
        command.stderr, command.stderr

    subprocess.run([*pip_install(python), "pytest==8.3.4"], check=True, timeout=900)  # the test tool, after the check
    tests = subprocess.run([str(python), "-P", "-m", "pytest", "--noconftest", "-p", "no:cacheprovider", "-q",
                            "-rs", "tests/test_core.py", "tests/test_core_misuse.py"], cwd=REPO, capture_output=True,
                           text=True, timeout=1200)
    assert tests.returncode == 0, tests.stdout[-4000:] + tests.stderr[-2000:]
    summary = tests.stdout.strip().splitlines()[-1]
    assert re.search(r"\d+ passed", summary) and "failed" not in summary, summary
    skipped = [line for line in tests.stdout.splitlines() if line.startswith("SKIPPED")]
    assert all("fairseq" in line for line in skipped), skipped


@pytest.mark.slow
def test_the_hf_extra_without_fairseq_runs_the_readmes_hugging_face_example(environment):
    python = environment / "env" / "bin" / "python"
    constraints = Path(REPO) / "requirements" / "runtime.txt"  # transformers as the project pins it
    install = subprocess.run([*pip_install(python), "-c", str(constraints), f"{environment / 'source'}[hf]"],
                             capture_output=True, text=True, timeout=900)
    assert install.returncode == 0, install.stderr[-3000:]
    installed = {re.split("[=@ ]", line)[0] for line in frozen(python)}
    assert "transformers" in installed and not installed & {"fairseq", "fairseq-fixed"}, installed
    example = subprocess.run([str(python), "-P", "-c", readme_example("### In Hugging Face models")],
                             cwd=environment, capture_output=True, text=True, timeout=600)
    assert example.returncode == 0, example.stderr[-3000:]
    assert (environment / "llama-t5" / "config.json").is_file()
