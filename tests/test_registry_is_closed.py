"""Adding a position method is one file plus one import line: two toy methods, put into a copy of the package
with one import line each and no other edit, are picked up by every test family that iterates the registry
(their references registered by the ``toy_reference`` plugin), by the benchmark's rows (and a benchmark run)
and the sets derived for the GPU check, and by posattn-inspect. The first (tests/data/toy_neighbour_method.py)
is a bias of positions alone; the second (tests/data/toy_segment_method.py) reads per-sentence side data that
a task collates into every batch, which the side unpacks into the context and refuses to go without.

:data:`PLACES_A_METHOD_TOUCHES` lists the places a new method touches, as docs/design.md counts them (checked
here), each with what holds it to account.
"""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from model_helpers import REPO
from test_benchmark_script import TINY as BENCHMARK_TINY

TOYS = tuple(Path(REPO) / "tests" / "data" / name for name in ("toy_neighbour_method.py", "toy_segment_method.py"))
#: the places a new method touches, as docs/design.md counts them, and what holds each to account
PLACES_A_METHOD_TOUCHES = {
    "its file in posattn/position_terms/": "this test: each toy is the copy's only new file",
    "one import line": "this test: the copy's only other change is one line per toy in position_terms/__init__.py",
    "its reference in tests/reference_attention.py": "the reference families stop, naming where to add it",
    "its section in docs/methods.md": "test_documents: a method without its option table there is reported",
    "its row in the README's paper table": "review (the README's table is prose with links)",
}
NUMBER_WORDS = {2: "two", 3: "three", 4: "four", 5: "five", 6: "six", 7: "seven"}
#: the test families whose variant lists come from the registry (in-process models; no --user-dir)
FAMILIES = ("tests/test_attention_terms.py", "tests/test_kernel_paths.py", "tests/test_model_invariants.py",
            "tests/test_core.py", "tests/test_transformer_lm.py")
#: the benchmark's rows and derived sets, and posattn-inspect's kinds of a model with the toy on
OUTSIDE_THE_TESTS = """
import fairseq_posattn, posattn_benchmark.variants as v, torch
from fairseq_posattn.inspect import inspect_model
from model_helpers import TinyTask, build_lm, randomized, side_flags
print(fairseq_posattn.__file__)
print(v.VARIANTS_BY_NAME['toy-neighbour'].label, v.VARIANTS_BY_NAME['lm-toy-neighbour'].flags)
print(*v.each_method()[-2:], v.lm_each_kernel_path()[-1])
model = randomized(build_lm('transformer_lm_posattn', side_flags('decoder', 'toy-neighbour')))
sample = {'net_input': {'src_tokens': torch.tensor([[4, 5, 6, 7]]), 'src_lengths': torch.tensor([4])}}
print(inspect_model(model, TinyTask(), sample, 'given').available_kinds())
print(v.VARIANTS_BY_NAME['toy-segment'].label, v.VARIANTS_BY_NAME['toy-segment'].flags, 'lm-toy-segment' in v.VARIANTS_BY_NAME)
from model_helpers import build_model, side_inputs
from posattn.position_terms.side_inputs import SideDataError
model = randomized(build_model('transformer_posattn', side_flags('encoder', 'toy-segment')))
src = torch.tensor([[4, 5, 6, 7, 8, 2]])
sample = {'net_input': {'src_tokens': src, 'src_lengths': torch.tensor([6]),
                        'prev_output_tokens': torch.tensor([[2, 4, 5]]),
                        'src_segments': side_inputs(src)['src_segments']}}
print(inspect_model(model, TinyTask(), sample, 'given').available_kinds())
try:
    model.encoder(src)
except SideDataError as error:
    print(error)
"""


def package_with_toy(root: Path) -> Path:
    """A copy of the library ``posattn`` and of ``fairseq_posattn`` under ``root``, with each toy's file and its
    one import line in the library."""
    for package in ("posattn", "fairseq_posattn"):
        shutil.copytree(Path(REPO) / package, root / package, ignore=shutil.ignore_patterns("__pycache__"))
    copy = root / "posattn"
    init = copy / "position_terms" / "__init__.py"
    text = init.read_text()
    imports = "".join(f"    {toy.stem},\n" for toy in TOYS)
    init.write_text(text.replace(",\n)", f",\n{imports})", 1))  # after the list's last import
    assert init.read_text() != text, "the import list of position_terms/__init__.py changed: update this test"
    for toy in TOYS:
        shutil.copy(toy, copy / "position_terms" / toy.name)
    changed = {path.relative_to(root) for path in root.rglob("*.py")
               if not (Path(REPO) / path.relative_to(root)).is_file()
               or (Path(REPO) / path.relative_to(root)).read_text() != path.read_text()}
    package = Path("posattn") / "position_terms"
    assert changed == {package / "__init__.py", *(package / toy.name for toy in TOYS)}, sorted(changed)
    assert len(init.read_text().splitlines()) - len(text.splitlines()) == len(TOYS)
    return root


def test_the_design_document_states_the_places_a_method_touches():
    design = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", (Path(REPO) / "docs" / "design.md").read_text())  # links' text
    assert f"A new method touches {NUMBER_WORDS[len(PLACES_A_METHOD_TOUCHES)]} places" in design
    for place in PLACES_A_METHOD_TOUCHES:
        assert place in " ".join(design.replace("`", "").split()), f"docs/design.md does not name {place!r}"


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

    for family in FAMILIES[:4]:  # the encoder's families: the side-data toy is an encoder method
        assert any(f"{Path(family).name}::" in line and "toy-segment" in line for line in passed), \
            f"no test of the side-data toy ran in {family}"

    outside = run_with_toy(root, "-c", OUTSIDE_THE_TESTS)
    assert outside.returncode == 0, outside.stderr[-3000:]
    assert outside.stdout.splitlines()[-7:] == [
        str(root / "fairseq_posattn" / "__init__.py"), "Toy neighbour bias ('--decoder-toy-neighbour-bias',)",
        "toy-neighbour toy-segment lm-toy-neighbour", "['attention', 'toy-neighbour']",
        "Toy segment bias ('--encoder-toy-segment-bias',) False", "['attention', 'toy-segment']",
        "--encoder-toy-segment-bias True needs each source token's segment: train, generate and translate with "
        "a task that collates src_segments"]

    report = root / "benchmark.md"
    benchmark = run_with_toy(root, str(Path(REPO) / "scripts" / "posattn_benchmark"), *BENCHMARK_TINY,
                             "--variants", "toy-segment", "--decode-variants", "toy-segment", "--skip-prepare",
                             "--output", str(report))
    assert benchmark.returncode == 0, benchmark.stderr[-3000:]
    assert "| Toy segment bias | `--encoder-toy-segment-bias` |" in report.read_text()
