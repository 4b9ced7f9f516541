"""The support matrix (``make test-matrix``; docs/install.md, "Tested versions"): the versions that setup.py declares,
each tested in a fresh virtual environment with that front-end's tests.

- core (``posattn``, torch alone): the oldest torch declared and the newest that pip installs, on the oldest and
  the newest Python declared (the classifiers); on a Python for which the oldest declared torch has no wheel, the
  oldest torch that has one; ``tests/test_core.py``, ``tests/test_core_misuse.py`` and
  ``tests/test_sdpa_causal_path.py`` without the suite's conftest (which imports fairseq).
- hf (``posattn_huggingface``): the oldest transformers, accelerate and torch declared (extra ``hf``), on the
  oldest Python that transformers 5 takes (3.10); the newest of each on the newest Python;
  ``tests/test_huggingface.py`` and ``tests/test_transformers_selection.py``, without fairseq.
- fairseq (``fairseq_posattn``): fairseq-fixed, the ``fairseq`` extra's choice from Python 3.11 on, built by
  ``scripts/fairseq_wheel.sh`` on every declared Python from 3.11 with the newest torch, and the front-end's
  model tests that start no command-line tool.

Each environment is a virtualenv under ``.matrix/envs/`` (ignored by git, reused by the next run; ``--clean``
removes each once its rows have run): ``pip install`` of torch, transformers and accelerate pinned to the versions
of the row, and of a clean copy of the working tree, from the package index as a user's ``pip install`` does
(``PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu`` makes it torch's CPU builds, where that index is
reachable; PyPI's Linux builds bring CUDA's libraries, several GB per environment). A Python the machine lacks
(``pythonX.Y`` on PATH, or pyenv's) is a row skipped with the reason. The table, with the date, replaces the one
between :data:`BEGIN` and :data:`END` in docs/install.md; tests/test_support_matrix.py checks that it tests what
setup.py declares and that every row passed.

    python3 scripts/support_matrix.py [--only core|hf|fairseq ...] [--clean] [--workers N] [--no-write | --write-only]
"""

import argparse
import ast
import datetime
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import time
import xml.etree.ElementTree as ElementTree
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Tuple

REPO = Path(__file__).resolve().parent.parent
WORK = REPO / ".matrix"
INSTALL_DOC = REPO / "docs" / "install.md"
BEGIN = "<!-- support-matrix: begin (make test-matrix writes this table) -->"
END = "<!-- support-matrix: end -->"

#: the oldest Python transformers 5 installs on (its Requires-Python)
HF_OLDEST_PYTHON = "3.10"
#: the oldest Python for which the extra ``fairseq`` installs fairseq-fixed (setup.py's FAIRSEQ markers)
FAIRSEQ_OLDEST_PYTHON = "3.11"
#: each front-end's tests, and the options they run with (core and hf: without the suite's conftest, which imports
#: the fairseq front-end)
TESTS = {
    "core": ["--noconftest", "tests/test_core.py", "tests/test_core_misuse.py", "tests/test_sdpa_causal_path.py"],
    "hf": ["--noconftest", "tests/test_huggingface.py", "tests/test_transformers_selection.py"],
    "fairseq": ["-m", "not slow", "tests/test_model_invariants.py", "tests/test_transformer_lm.py",
                "tests/test_lstm_lm.py"],
}
#: the test runner in every environment (requirements/runtime.txt's pins)
PYTEST = ["pytest==8.3.4", "pytest-xdist==3.6.1", "execnet==2.1.1"]
#: what fairseq-fixed needs to build and to run, besides torch (README "Install into your own environment")
FAIRSEQ_BUILD = ["numpy", "cython", "setuptools", "wheel"]
FAIRSEQ_RUNTIME = ["hydra-core", "omegaconf", "bitarray", "regex", "cffi", "scikit-learn", "packaging", "sacrebleu",
                   "tqdm"]


@dataclass(frozen=True)
class Declared:
    """What setup.py declares (its constants PYTHON_REQUIRES, PYTHONS, TORCH and HF)."""

    python: str  # the oldest Python (python_requires)
    pythons: Tuple[str, ...]  # the classifiers' Pythons
    torch: str  # the oldest torch
    transformers: Tuple[str, str]  # the oldest transformers and the first major version excluded
    accelerate: str  # the oldest accelerate
    hf_torch: str  # the oldest torch of the extra hf


def declared(setup: Path = REPO / "setup.py") -> Declared:
    """setup.py's declared ranges, read from its module-level constants (setup.py runs setup() when imported)."""
    constants = {target.id: ast.literal_eval(node.value) for node in ast.parse(setup.read_text()).body
                 if isinstance(node, ast.Assign) for target in node.targets
                 if isinstance(target, ast.Name) and target.id in ("PYTHON_REQUIRES", "PYTHONS", "TORCH", "HF")}
    hf = {re.match(r"[\w-]+", requirement).group(0): requirement for requirement in constants["HF"]}
    return Declared(python=lower_bound(constants["PYTHON_REQUIRES"]), pythons=tuple(constants["PYTHONS"]),
                    torch=lower_bound(constants["TORCH"]),
                    transformers=(lower_bound(hf["transformers"]),
                                  re.search(r"<([\d.]+)", hf["transformers"]).group(1)),
                    accelerate=lower_bound(hf["accelerate"]), hf_torch=lower_bound(hf["torch"]))


def lower_bound(requirement: str) -> str:
    return re.search(r">=\s*([\d.]+)", requirement).group(1)


def version_key(version: str) -> Tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", version.split("+")[0]))


@dataclass(frozen=True)
class Row:
    """One environment's test run: a front-end, a Python, and which end of each declared range."""

    front_end: str
    python: str
    torch: str  # "oldest" or "newest"
    hf: str = ""  # "oldest" or "newest": transformers and accelerate (hf rows)

    @property
    def env(self) -> str:
        return f"py{self.python}-torch-{self.torch}"


def rows(spec: Declared) -> List[Row]:
    """The matrix of ``spec``, in the table's order (module docstring)."""
    oldest, newest = spec.pythons[0], spec.pythons[-1]
    hf_oldest = max(oldest, HF_OLDEST_PYTHON, key=version_key)
    return [Row("core", oldest, "oldest"), Row("core", oldest, "newest"), Row("core", newest, "oldest"),
            Row("core", newest, "newest"), Row("hf", hf_oldest, "oldest", "oldest"),
            Row("hf", newest, "newest", "newest"),
            *(Row("fairseq", python, "newest") for python in spec.pythons
              if version_key(python) >= version_key(FAIRSEQ_OLDEST_PYTHON))]


@dataclass
class Result:
    """A row's run: what it installed, its tests' counts, its minutes, or why it did not run."""

    row: Row
    versions: Dict[str, str] = field(default_factory=dict)  # torch, transformers, accelerate, fairseq as installed
    counts: Dict[str, int] = field(default_factory=dict)  # passed, failed, skipped
    seconds: float = 0.0
    skipped: str = ""  # why the row did not run
    failures: List[str] = field(default_factory=list)  # the failed tests' ids, or what failed before the tests
    date: str = field(default_factory=lambda: datetime.date.today().isoformat())


def find_python(version: str) -> Optional[str]:
    """An interpreter of Python ``version`` (X.Y): ``pythonX.Y`` on PATH, else pyenv's newest X.Y.*."""
    candidates = [shutil.which(f"python{version}")]
    pyenv = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "versions"
    candidates += sorted(glob.glob(str(pyenv / f"{version}.*" / "bin" / "python")), key=version_key, reverse=True)
    for candidate in filter(None, candidates):
        probe = subprocess.run([candidate, "-c", "import sys, venv; print('%d.%d' % sys.version_info[:2], "
                                "sys.executable)"], capture_output=True, text=True)
        if probe.returncode == 0 and probe.stdout.split(" ", 1)[0] == version:
            return probe.stdout.split(" ", 1)[1].strip()  # the interpreter itself, not a shim that finds it
    return None


class Environment:
    """A virtualenv of the matrix, its pip and its installs (each command's output appended to its log)."""

    def __init__(self, path: Path, python: str, log: Path):
        self.path, self.log = path, log
        if not (path / "bin" / "python").exists():
            self.run([python, "-m", "venv", str(path)])
        self.python = str(path / "bin" / "python")

    def run(self, command: List[str], **kwargs) -> subprocess.CompletedProcess:
        with self.log.open("a") as log:
            log.write(f"$ {' '.join(command)}\n")
            log.flush()
            return subprocess.run(command, stdout=log, stderr=subprocess.STDOUT, check=True, **kwargs)

    def pip(self, *arguments: str) -> None:
        self.run([self.python, "-m", "pip", "--disable-pip-version-check", "-q", *arguments])

    def available(self, package: str) -> List[str]:
        """The releases of ``package`` that this Python can install from the index, oldest first."""
        listing = subprocess.run([self.python, "-m", "pip", "--disable-pip-version-check", "index", "versions",
                                  package], capture_output=True, text=True, check=True).stdout
        versions = re.search(r"Available versions: (.*)", listing).group(1).split(", ")
        return sorted(versions, key=version_key)

    def newest(self, requirement: str) -> str:
        """The version that ``pip install requirement`` picks here (the index, pip's configuration)."""
        report = subprocess.run([self.python, "-m", "pip", "--disable-pip-version-check", "install", "--dry-run",
                                 "--ignore-installed", "--no-deps", "-q", "--report", "-", requirement],
                                capture_output=True, text=True, check=True).stdout
        return json.loads(report)["install"][0]["metadata"]["version"]

    def version(self, module: str) -> str:
        return subprocess.run([self.python, "-c", f"import {module}; print({module}.__version__)"],
                              capture_output=True, text=True, check=True).stdout.strip()


def pins(env: Environment, row: Row, spec: Declared) -> Dict[str, str]:
    """The exact versions of the row: the declared minimum (for torch, the oldest release at or above it that this
    Python has), or the newest that pip installs."""
    pinned = {}
    if row.torch == "oldest":
        floor = version_key(spec.hf_torch if row.hf else spec.torch)
        pinned["torch"] = next(v for v in env.available("torch") if version_key(v) >= floor)
    else:
        pinned["torch"] = env.newest(f"torch>={spec.torch}")
    if row.hf == "oldest":
        pinned.update(transformers=spec.transformers[0], accelerate=spec.accelerate)
    elif row.hf == "newest":
        pinned.update(transformers=env.newest(f"transformers>={spec.transformers[0]},<{spec.transformers[1]}"),
                      accelerate=env.newest(f"accelerate>={spec.accelerate}"))
    return pinned


def install(env: Environment, row: Row, pinned: Dict[str, str], source: Path) -> None:
    requirements = [f"{name}=={version}" for name, version in pinned.items()]
    env.pip("install", *requirements, *PYTEST)
    if row.front_end == "core":
        env.pip("install", str(source), *requirements)
    elif row.front_end == "hf":
        env.pip("install", f"{source}[hf]", *requirements)
    else:
        constraints = WORK / "constraints.txt"  # make install's pins, torch aside (the row's)
        constraints.write_text("".join(line + "\n" for name in ("build.txt", "runtime.txt")
                                       for line in (REPO / "requirements" / name).read_text().splitlines()
                                       if not line.startswith("torch==")))
        env.pip("install", "-c", str(constraints), *FAIRSEQ_BUILD, *FAIRSEQ_RUNTIME, *requirements)
        wheels = WORK / "wheels" / f"fairseq-py{row.python}"
        if not list(wheels.glob("fairseq_fixed-*.whl")):
            env.run(["bash", str(REPO / "scripts" / "fairseq_wheel.sh"), env.python, str(wheels)])
        env.pip("install", "--no-deps", *map(str, wheels.glob("fairseq_fixed-*.whl")))
        env.pip("install", "-c", str(constraints), f"{source}[plugin]", *requirements)


def run_tests(env: Environment, row: Row, source: Path, workers: int, report: Path) -> Tuple[Dict[str, int], List[str]]:
    """The front-end's tests, from the clean copy but on the installed package (the ``pytest`` command, not
    ``python -m pytest``, which puts the copy's folder on ``sys.path``); the counts and the failed tests from pytest's
    JUnit report."""
    parallel = ["-n", str(workers), "--dist", "loadfile"] if workers > 1 else []
    report.unlink(missing_ok=True)
    command = [str(env.path / "bin" / "pytest"), "-q", "-p", "no:cacheprovider", *parallel, f"--junitxml={report}",
               *TESTS[row.front_end]]
    with env.log.open("a") as log:
        log.write(f"$ {' '.join(command)}\n")
        log.flush()
        subprocess.run(command, cwd=source, stdout=log, stderr=subprocess.STDOUT,
                       env={**os.environ, "PATH": f"{env.path / 'bin'}{os.pathsep}{os.environ['PATH']}"})
    if not report.exists():
        return {}, [f"pytest wrote no report: {env.log.relative_to(REPO)}"]
    suites = ElementTree.parse(report).getroot().iter("testsuite")
    counts = {"tests": 0, "failed": 0, "skipped": 0}
    failures = []
    for suite in suites:
        counts["tests"] += int(suite.get("tests"))
        counts["failed"] += int(suite.get("failures")) + int(suite.get("errors"))
        counts["skipped"] += int(suite.get("skipped"))
        failures += [f"{case.get('classname')}::{case.get('name')}" for case in suite.iter("testcase")
                     if case.find("failure") is not None or case.find("error") is not None]
    counts["passed"] = counts["tests"] - counts["failed"] - counts["skipped"]
    return counts, failures


def run_row(row: Row, spec: Declared, source: Path, workers: int) -> Result:
    result = Result(row)
    python = find_python(row.python)
    if python is None:
        result.skipped = f"no Python {row.python} on this machine (python{row.python} on PATH, pyenv)"
        return result
    start = time.perf_counter()
    name = f"{row.front_end}-py{row.python}-torch-{row.torch}{'-hf-' + row.hf if row.hf else ''}"
    env = Environment(WORK / "envs" / row.env, python, WORK / "logs" / f"{name}.log")
    try:
        pinned = pins(env, row, spec)
        install(env, row, pinned, source)
        result.versions = {module: env.version(module) for module in
                           ("torch", *(("transformers", "accelerate") if row.hf else ()),
                            *(("fairseq",) if row.front_end == "fairseq" else ()))}
        result.counts, result.failures = run_tests(env, row, source, workers, WORK / "logs" / f"{name}.xml")
    except subprocess.CalledProcessError as error:
        result.failures = [f"`{' '.join(map(str, error.cmd[:6]))} ...` failed (exit {error.returncode}): "
                           f"{env.log.relative_to(REPO)}"]
    result.seconds = time.perf_counter() - start
    return result


def clean_copy() -> Path:
    """The tracked and unignored files of the working tree, copied to ``.matrix/source`` (what pip installs and
    where the tests run from)."""
    source = WORK / "source"
    shutil.rmtree(source, ignore_errors=True)
    listing = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                             check=True, capture_output=True).stdout.decode()
    for name in filter(None, listing.split("\0")):
        if (REPO / name).is_file():
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, source / name)
    return source


COLUMNS = ["front-end", "Python", "torch", "transformers", "accelerate", "fairseq", "tests", "passed", "failed",
           "skipped", "minutes", "date", "note"]
#: the tests column: the files a front-end's rows run
TESTS_LABEL = {front_end: ", ".join(f"`{Path(arg).name}`" for arg in args if arg.startswith("tests/"))
               + (" (not slow)" if "not slow" in args else "") for front_end, args in TESTS.items()}


def table_row(result: Result) -> str:
    row, versions = result.row, result.versions
    if result.counts:
        counts = [str(result.counts[key]) for key in ("passed", "failed", "skipped")]
        note = "; ".join(result.failures[:3]) + (f" and {len(result.failures) - 3} more" if len(result.failures) > 3
                                                 else "")
    else:
        counts, note = ["–"] * 3, result.skipped or result.failures[0]
    cells = [row.front_end, row.python, versions.get("torch", row.torch),
             versions.get("transformers", row.hf or "–"), versions.get("accelerate", row.hf or "–"),
             versions.get("fairseq", "–"), TESTS_LABEL[row.front_end], *counts, f"{result.seconds / 60:.1f}",
             result.date, note]
    return "| " + " | ".join(cells) + " |"


def declaration(spec: Declared) -> str:
    """The table's first line: the ranges setup.py declares."""
    return (f"Declared in setup.py: Python {spec.pythons[0]} to {spec.pythons[-1]} (python_requires >={spec.python}), "
            f"torch >={spec.torch}; extra `hf`: transformers >={spec.transformers[0]},<{spec.transformers[1]}, "
            f"accelerate >={spec.accelerate}, torch >={spec.hf_torch}.")


def table(results: List[Result], spec: Declared) -> str:
    date = max((result.date for result in results if result.counts), default="–")
    lines = [BEGIN, "", f"{declaration(spec)} Written by `make test-matrix` on {date}.", "",
             "| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += [table_row(result) for result in results]
    return "\n".join([*lines, "", END])


def same_release(version: str, bound: str) -> bool:
    """Whether ``version`` is the release ``bound`` names (``2.3.0+cu121`` is ``2.3``)."""
    size = max(len(version_key(version)), len(version_key(bound)), 3)
    return (version_key(version) + (0,) * size)[:size] == (version_key(bound) + (0,) * size)[:size]


def mismatches(spec: Declared, text: str) -> List[str]:
    """Where the table in ``text`` (docs/install.md) does not show ``spec`` tested: a row of the matrix missing or
    not passed, or a declared bound that its row did not install. Empty when the two agree."""
    table, expected = read_table(text), rows(spec)
    problems = [] if declaration(spec) in text else [f"the table does not begin with: {declaration(spec)}"]
    shown = [(cells["front-end"], cells["Python"]) for cells in table]
    if shown != [(row.front_end, row.python) for row in expected]:
        wanted = [(row.front_end, row.python) for row in expected]
        return problems + [f"the table's rows {shown} are not the matrix's {wanted}"]
    for row, cells in zip(expected, table):
        name = f"the {row.front_end} row on Python {row.python}"
        if cells["failed"] != "0" or not cells["passed"].isdigit() or int(cells["passed"]) == 0 or cells["note"]:
            problems.append(f"{name} did not pass ({cells['failed']} failed; {cells['note'] or 'no note'})")
            continue
        if row == expected[0] and not same_release(cells["torch"], spec.torch):
            problems.append(f"{name} tested torch {cells['torch']}, not the torch >={spec.torch} declared")
        if row.hf == "oldest" and not (same_release(cells["transformers"], spec.transformers[0])
                                       and same_release(cells["accelerate"], spec.accelerate)
                                       and same_release(cells["torch"], spec.hf_torch)):
            problems.append(f"{name} tested transformers {cells['transformers']}, accelerate "
                            f"{cells['accelerate']} and torch {cells['torch']}, not the oldest declared")
        if row.hf == "newest" and cells["transformers"][:1].isdigit() and \
                version_key(cells["transformers"]) >= version_key(spec.transformers[1]):
            problems.append(f"{name} tested transformers {cells['transformers']}, outside <{spec.transformers[1]}")
    return problems


RESULTS = WORK / "results.json"


def row_key(row: Row) -> str:
    return f"{row.front_end} {row.python} torch-{row.torch} hf-{row.hf or '-'}"


def stored() -> Dict[str, Result]:
    """The latest result of every row run so far (``--only`` runs some rows; the table shows all)."""
    if not RESULTS.exists():
        return {}
    return {key: Result(**{**value, "row": Row(**value["row"])})
            for key, value in json.loads(RESULTS.read_text()).items()}


def store(results: Dict[str, Result]) -> None:
    RESULTS.write_text(json.dumps({key: {**vars(result), "row": vars(result.row)} for key, result in results.items()},
                                  indent=1))


def read_table(text: str) -> List[Dict[str, str]]:
    """The rows of the table between :data:`BEGIN` and :data:`END` in ``text``, by column."""
    block = text[text.index(BEGIN):text.index(END)]
    lines = [line for line in block.splitlines() if line.startswith("| ") and not line.startswith("| front-end")]
    return [dict(zip(COLUMNS, (cell.strip() for cell in line.strip("|").split(" | ")))) for line in lines]


def write_table(text: str, document: Path = INSTALL_DOC) -> None:
    content = document.read_text(encoding="utf-8")
    start, end = content.index(BEGIN), content.index(END) + len(END)
    document.write_text(content[:start] + text + content[end:], encoding="utf-8")


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", nargs="+", choices=sorted(TESTS), help="these front-ends' rows alone")
    parser.add_argument("--clean", action="store_true", help="remove each environment once its rows have run")
    parser.add_argument("--workers", type=int, default=2, help="pytest-xdist workers per test run (default 2)")
    parser.add_argument("--no-write", action="store_true", help="print the table, leave docs/install.md alone")
    parser.add_argument("--write-only", action="store_true",
                        help="run nothing: write the table of the results kept in .matrix/results.json")
    args = parser.parse_args(argv)
    spec = declared()
    everything = rows(spec)
    chosen = [] if args.write_only else [row for row in everything if not args.only or row.front_end in args.only]
    results = run_rows(chosen, spec, args.workers, args.clean)
    shown = [results.get(row_key(row), Result(row, skipped="not run yet", date="–")) for row in everything]
    text = table(shown, spec)
    print(text)
    if not args.no_write:
        write_table(text)
    for problem in mismatches(spec, text):
        print(f"support matrix: {problem}", file=sys.stderr)
    return 0 if all(r.skipped or (r.counts and not r.counts["failed"]) for r in shown) else 1


def run_rows(chosen: List[Row], spec: Declared, workers: int, clean: bool) -> Dict[str, Result]:
    """Runs the rows ``chosen`` on a clean copy of the tree; every row's latest result, kept in :data:`RESULTS`."""
    results, start = stored(), time.perf_counter()
    if not chosen:
        return results
    (WORK / "logs").mkdir(parents=True, exist_ok=True)
    source = clean_copy()
    for index, row in enumerate(chosen):
        print(f"[{(time.perf_counter() - start) / 60:.0f} min] {row}", flush=True)
        results[row_key(row)] = run_row(row, spec, source, workers)
        store(results)
        print(table_row(results[row_key(row)]), flush=True)
        if clean and all(later.env != row.env for later in chosen[index + 1:]):
            shutil.rmtree(WORK / "envs" / row.env, ignore_errors=True)
    print(f"{len(chosen)} rows in {(time.perf_counter() - start) / 60:.0f} minutes", flush=True)
    return results


if __name__ == "__main__":
    sys.exit(main())
