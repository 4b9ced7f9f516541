"""The versions declared are the versions tested: setup.py's ranges (Python, torch, the extra ``hf``) and the support
matrix that ``make test-matrix`` wrote into docs/install.md ("Tested versions") agree, every row of it passed, and
``posattn_huggingface`` refuses a transformers outside the declared range in one line. Reads files only (the matrix
itself takes an hour: scripts/support_matrix.py); a change of setup.py without a new matrix, or of the table without
setup.py, fails here."""

from dataclasses import replace

import pytest

from support_matrix import INSTALL_DOC, REPO, declared, mismatches, read_table

SPEC = declared()
TEXT = INSTALL_DOC.read_text(encoding="utf-8")


def test_the_matrix_in_docs_install_tests_every_range_that_setup_py_declares_and_passed():
    assert mismatches(SPEC, TEXT) == []
    tested = read_table(TEXT)
    assert {row["Python"] for row in tested if row["front-end"] == "core"} == {SPEC.pythons[0], SPEC.pythons[-1]}
    assert SPEC.python == SPEC.pythons[0]  # python_requires is the classifiers' oldest


#: a declaration moved (or, "table", a row of the table failed), and the start of the problem that names the row
CHANGES = {
    "torch": ({"torch": "9.0"}, f"the core row on Python {SPEC.pythons[0]} tested torch"),
    "python": ({"python": "3.8", "pythons": ("3.8", *SPEC.pythons)}, "the table's rows"),
    "transformers": ({"transformers": ("5.99", "6")}, "the hf row on Python 3.10 tested transformers"),
    "accelerate": ({"accelerate": "1.0"}, "the hf row on Python 3.10 tested transformers"),
    "hf torch": ({"hf_torch": "2.5"}, "the hf row on Python 3.10 tested transformers"),
    "table": ({}, f"the core row on Python {SPEC.pythons[0]} did not pass (1 failed"),
}


@pytest.mark.parametrize("change", CHANGES)
def test_a_declaration_changed_without_the_matrix_is_a_mismatch(change):
    """Negative controls: each declared bound moved, or a row of the table failed, is named with its row."""
    moved, expected = CHANGES[change]
    text = TEXT
    if change == "table":
        first = next(line for line in TEXT.splitlines() if line.startswith("| core |"))
        cells = first.split(" | ")
        cells[8] = "1"  # the failed column
        text = TEXT.replace(first, " | ".join(cells))
    problems = mismatches(replace(SPEC, **moved), text)
    assert any(problem.startswith(expected) for problem in problems), problems
    assert (change == "table") != any(problem.startswith("the table does not begin with") for problem in problems)


def test_the_hf_front_end_takes_the_declared_ranges_and_refuses_outside_them():
    compatibility = pytest.importorskip("posattn_huggingface.compatibility")
    oldest, refused = SPEC.transformers
    assert (compatibility.TRANSFORMERS_RANGE, compatibility.TORCH_MINIMUM) == ((oldest, refused), SPEC.hf_torch)
    compatibility.require_versions(f"{oldest}.0", f"{SPEC.hf_torch}.0+cu121")
    major, minor = (int(part) for part in oldest.split(".")[:2])
    older = f"{major}.{minor - 1}.9" if minor else f"{major - 1}.99.0"
    for version in (older, f"{refused}.0.0", f"{refused}.0.0.dev0"):
        with pytest.raises(compatibility.TransformersVersionError) as refusal:
            compatibility.require_versions(version)
        assert str(refusal.value) == (
            f"posattn_huggingface needs transformers>={oldest},<{refused} (the releases tested, docs/install.md), "
            f"not transformers {version}: pip install 'transformers>={oldest},<{refused}'")
    with pytest.raises(compatibility.TransformersVersionError) as refusal:
        compatibility.require_versions(f"{oldest}.0", SPEC.torch)
    assert str(refusal.value) == (
        f"posattn_huggingface needs torch>={SPEC.hf_torch} (the releases tested, docs/install.md), not torch "
        f"{SPEC.torch}: pip install 'torch>={SPEC.hf_torch}'")


def test_the_readme_states_the_tested_ranges():
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    section = readme[readme.index("### Install into your own environment"):readme.index("### Without fairseq")]
    assert (f"Python {SPEC.pythons[0]}-{SPEC.pythons[-1]}, torch >= {SPEC.torch}, transformers >= "
            f"{SPEC.transformers[0]}" in " ".join(section.split())), section
