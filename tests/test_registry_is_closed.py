"""Adding a position method is one file plus one import line: a toy method
(tests/data/toy_neighbour_method.py), put into a copy of the package with that one line and no
other edit, is picked up by every test family that iterates the registry (its reference registered by the
``toy_reference`` plugin), by the benchmark's rows and the sets derived for the GPU check, and by
posattn-inspect."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

from model_helpers import REPO

TOY = Path(REPO) / "tests" / "data" / "toy_neighbour_method.py"
#: the test families whose variant lists come from the registry (in-process models; no --user-dir)
FAMILIES = ("tests/test_attention_terms.py", "tests/test_kernel_paths.py", "tests/test_model_invariants.py",
            "tests/test_transformer_lm.py")
#: the benchmark's rows and derived sets, and posattn-inspect's kinds of a model with the toy on
OUTSIDE_THE_TESTS = """
import fairseq_posattn, posattn_benchmark.variants as v, torch
from fairseq_posattn.inspect import inspect_model
from model_helpers import TinyTask, build_lm, randomized, side_flags
print(fairseq_posattn.__file__)
print(v.VARIANTS_BY_NAME['toy-neighbour'].label, v.VARIANTS_BY_NAME['lm-toy-neighbour'].flags)
print(v.each_method()[-1], v.lm_each_kernel_path()[-1])
model = randomized(build_lm('transformer_lm_posattn', side_flags('decoder', 'toy-neighbour')))
sample = {'net_input': {'src_tokens': torch.tensor([[4, 5, 6, 7]]), 'src_lengths': torch.tensor([4])}}
print(inspect_model(model, TinyTask(), sample, 'given').available_kinds())
"""


def package_with_toy(root: Path) -> Path:
    """A copy of ``fairseq_posattn`` under ``root`` with the toy's file and its one import line."""
    copy = root / "fairseq_posattn"
    shutil.copytree(Path(REPO) / "fairseq_posattn", copy, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(TOY, copy / "modules" / "position_terms" / TOY.name)
    init = copy / "modules" / "position_terms" / "__init__.py"
    text = init.read_text()
    init.write_text(text.replace("    contextual,\n)", "    contextual,\n    toy_neighbour_method,\n)"))
    assert init.read_text() != text, "the import list of position_terms/__init__.py changed: update this test"
    return root


def run_with_toy(root: Path, *command: str) -> subprocess.CompletedProcess:
    """``python *command`` in ``root`` (first on the path: the copy is the package imported)."""
    paths = [str(root), str(Path(REPO) / "tests"), str(Path(REPO) / "scripts")]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(paths))
    return subprocess.run([sys.executable, *command], cwd=root, env=env, capture_output=True, text=True,
                          timeout=1200)


def test_a_method_in_one_file_reaches_every_test_family_the_benchmark_and_inspection(tmp_path):
    root = package_with_toy(tmp_path)
    tests = run_with_toy(root, "-m", "pytest", "-q", "-rA", "-p", "toy_reference", "-p", "no:cacheprovider",
                         "--rootdir", REPO, "-k", "toy", *(str(Path(REPO) / family) for family in FAMILIES))
    assert tests.returncode == 0, tests.stdout[-4000:] + tests.stderr[-2000:]
    passed = [line for line in tests.stdout.splitlines() if line.startswith("PASSED")]
    for family in FAMILIES:
        assert any(f"{Path(family).name}::" in line for line in passed), f"no toy test ran in {family}"

    outside = run_with_toy(root, "-c", OUTSIDE_THE_TESTS)
    assert outside.returncode == 0, outside.stderr[-3000:]
    assert outside.stdout.splitlines()[-4:] == [
        str(root / "fairseq_posattn" / "__init__.py"), "Toy neighbour bias ('--decoder-toy-neighbour-bias',)",
        "toy-neighbour lm-toy-neighbour", "['attention', 'toy-neighbour']"]
