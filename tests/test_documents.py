"""The documents, checked as a reader uses them: every relative link and anchor of README.md,
CONTRIBUTING.md, CHANGELOG.md, docs/, examples/ and data/ resolves; every ``make`` target, repository path
and console script they name exists; every flag of the tables of README.md and docs/options.md is accepted by
``fairseq-train -h`` of its architecture; the option tables are what ``make docs`` writes; the version has one source."""

import contextlib
import importlib.metadata
import io
import re
import subprocess
from pathlib import Path
from typing import Dict, Iterator, List, Tuple

import pytest
from fairseq import options
from fairseq.models import ARCH_MODEL_REGISTRY

import fairseq_posattn
import posattn
from fairseq_posattn import docs_tables
from fairseq_posattn.models.building import USER_DIR, parse_model_args
from model_helpers import REPO

ROOT = Path(REPO)
#: the documents a reader follows (examples/evidence/records/ holds run records, not documents)
DOCUMENTS = sorted({ROOT / "README.md", ROOT / "CONTRIBUTING.md", ROOT / "CHANGELOG.md",
                    *ROOT.glob("docs/*.md"), *ROOT.glob("data/**/README.md"),
                    *(path for path in ROOT.glob("examples/**/*.md") if "records" not in path.parts)})
#: the documents whose commands, paths and scripts must exist (the changelog names what once was)
CURRENT = [path for path in DOCUMENTS if path.name != "CHANGELOG.md"]
#: repository paths named in the documents that are not this repository's
ELSEWHERE = {
    "data/task1/raw": "the raw folder of github.com/multi30k/dataset",
    "scripts/average_checkpoints.py": "a script of fairseq's repository",
    "data/train.conllu": "a user's file in an example message",
    "data/.train.conllu.k3j9x2ab.tmp": "a temporary file in an example message",
}
TOP_FOLDERS = ("scripts", "examples", "tests", "fairseq_posattn", "docs", "data", "requirements")

FENCE = re.compile(r"^```.*?^```", re.M | re.S)
CODE_SPAN = re.compile(r"`[^`\n]+`")
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$", re.M)


def name(path: Path) -> str:
    return str(path.relative_to(ROOT))


def prose(text: str) -> str:
    """``text`` without code blocks and with code spans blanked (links inside code are not links)."""
    return CODE_SPAN.sub("`code`", FENCE.sub("", text))


def code(text: str) -> Iterator[str]:
    """The code of ``text``: each code block's lines and each code span."""
    for block in FENCE.findall(text):
        yield from block.splitlines()[1:-1]
    yield from (span[1:-1] for span in CODE_SPAN.findall(FENCE.sub("", text)))


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation but ``-`` and ``_`` dropped, spaces to ``-``."""
    heading = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link in a heading keeps its text
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(path: Path) -> set:
    seen: Dict[str, int] = {}
    found = set()
    for _, heading in HEADING.findall(FENCE.sub("", path.read_text(encoding="utf-8"))):
        base = slug(heading)
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def links(path: Path) -> Iterator[str]:
    for target in LINK.findall(prose(path.read_text(encoding="utf-8"))):
        if not re.match(r"[a-z]+:", target):  # http:, https:, mailto: are not this repository's
            yield target


def test_every_relative_link_and_anchor_resolves():
    broken = []
    known: Dict[Path, set] = {}
    for document in DOCUMENTS:
        for target in links(document):
            file_part, _, anchor = target.partition("#")
            linked = (document.parent / file_part).resolve() if file_part else document
            if not linked.exists():
                broken.append(f"{name(document)}: {target} (no {file_part})")
            elif anchor and linked.suffix == ".md":
                if anchor not in known.setdefault(linked, anchors(linked)):
                    broken.append(f"{name(document)}: {target} (no heading #{anchor} in {name(linked)})")
    assert broken == []


def test_the_anchor_rule_is_githubs():
    assert slug("## `--ddp-backend`".lstrip("# ")) == "--ddp-backend"
    assert slug("3. Part-of-speech tagging: UD English-EWT (Dufter et al. 2020, Table 2)") == \
        "3-part-of-speech-tagging-ud-english-ewt-dufter-et-al-2020-table-2"
    assert slug("The registry (`modules/position_terms/registry.py`)") == "the-registry-modulesposition_termsregistrypy"


def make_targets() -> List[str]:
    """Every ``make <target>`` the documents name, in a code span or at the start of a code line."""
    found = set()
    for document in CURRENT:
        for line in code(document.read_text(encoding="utf-8")):
            found.update(re.findall(r"^\s*make ([a-z][\w-]*)", line))
    return sorted(found)


def test_every_make_target_the_documents_name_exists():
    targets = make_targets()
    assert {"quickstart", "test", "docs", "benchmark", "check-install", "gpu-check", "gpu-verify"} <= set(targets)
    for target in targets:
        result = subprocess.run(["make", "-n", target], cwd=REPO, capture_output=True, text=True)
        assert result.returncode == 0, f"make {target}: {result.stderr}"


def repository_paths() -> Iterator[Tuple[str, str]]:
    """(document, path) for every path under one of the repository's folders that a document names."""
    pattern = re.compile(r"(?<![\w./$~-])((?:%s)/[\w./-]*)" % "|".join(TOP_FOLDERS))
    for document in CURRENT:
        for path in pattern.findall(document.read_text(encoding="utf-8")):
            yield name(document), path.rstrip(".")


def exists(path: Path) -> bool:
    """``path`` is there, or names a module's attribute (``tests/model_helpers.SIDE_VARIANTS``); paths
    inside the package are often named from the package (``data/tagged_corpus.py``)."""
    return path.exists() or path.with_suffix(".py").exists()


def test_every_repository_path_the_documents_name_exists():
    named = list(repository_paths())
    assert ("README.md", "examples/quickstart/README.md") in named
    missing = [f"{document}: {path}" for document, path in named if path.rstrip("/") not in ELSEWHERE
               and not any(exists(base / path) for base in (ROOT, ROOT / "fairseq_posattn"))]
    assert missing == []


def test_every_console_script_the_documents_name_exists():
    setup = (ROOT / "setup.py").read_text(encoding="utf-8")
    ours = set(re.findall(r'"(posattn-[a-z-]+) = ', setup))
    fairseq = {entry.name for entry in importlib.metadata.entry_points(group="console_scripts")
               if entry.name.startswith("fairseq-")}
    not_scripts = {"fairseq-posattn", "fairseq-fixed", "posattn-xxx"}  # the distributions; a placeholder
    unknown = []
    for document in CURRENT:
        for script in set(re.findall(r"(?<![\w.-])((?:posattn|fairseq)-[a-z][a-z0-9-]*)",
                                     "\n".join(code(document.read_text(encoding="utf-8"))))):
            if script not in ours | fairseq | not_scripts and not script.startswith("fairseq-posattn"):
                unknown.append(f"{name(document)}: {script}")
    assert unknown == [] and "posattn-inspect" in ours and "fairseq-hydra-train" in fairseq


def readme_tables() -> Iterator[Tuple[str, List[List[str]]]]:
    """(header line, rows as cells) of every table of README.md and docs/options.md (the options it points to)."""
    lines = [line for name in ("README.md", "docs/options.md")
             for line in [*(ROOT / name).read_text(encoding="utf-8").splitlines(), ""]]
    i = 0
    while i < len(lines):
        if lines[i].startswith("|") and i + 1 < len(lines) and lines[i + 1].startswith("|---"):
            j = i + 2
            rows = []
            while j < len(lines) and lines[j].startswith("|"):
                rows.append([cell.strip() for cell in re.split(r"(?<!\\)\|", lines[j])[1:-1]])
                j += 1
            yield lines[i], rows
            i = j
        else:
            i += 1


def flag_rows() -> Iterator[Tuple[str, str, List[str], bool]]:
    """(task, architecture, command-line flags, whether they form a command line) of each row of the
    tables of README.md and docs/options.md that gives flags (the options table gives flags without their values)."""
    for header, rows in readme_tables():
        if not (header.startswith("| option |") or "| flags" in header):
            continue  # a table that names flags without giving a command line (the map of the documents)
        default_arch = "transformer_posattn"
        for row in rows:
            spans = [span[1:-1] for cell in row for span in CODE_SPAN.findall(cell)]
            words = [word for word in " ".join(span for span in spans if span.startswith("--")).split()
                     if not word.startswith("--") or re.fullmatch(r"--[a-z{][\w{},-]*", word)]
            if not words:
                continue
            arch = words[words.index("--arch") + 1] if "--arch" in words else None
            task = words[words.index("--task") + 1] if "--task" in words else None
            if header.startswith("| option |"):  # the options table: each side's flags
                for side, arch, task in (("encoder", "transformer_posattn", "translation"),
                                         ("decoder", "transformer_posattn", "translation"),
                                         ("decoder", "transformer_lm_posattn", "language_modeling")):
                    flags = [word.replace("{encoder,decoder}", side) for word in words
                             if word.startswith("--") and side in word.replace("{encoder,decoder}", side)]
                    if flags:
                        yield task, arch, flags, False
                continue
            if arch is None:
                arch = "transformer_lm_posattn" if "`transformer_lm_posattn`" in " ".join(row) else default_arch
            if task is None:
                task = "language_modeling" if arch.startswith("transformer_lm") else "translation"
            yield task, arch, [word for word in words if word not in ("--arch", arch, "--task", task)], True


def help_text(task: str, arch: str) -> str:
    """What ``fairseq-train --user-dir fairseq_posattn --task TASK --arch ARCH -h`` prints."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
        options.parse_args_and_arch(options.get_training_parser(),
                                    ["data", "--user-dir", str(USER_DIR), "--task", task, "--arch", arch, "-h"])
    return out.getvalue()


def test_every_flag_of_the_readmes_tables_is_accepted_by_fairseq_train_of_its_architecture():
    rows = list(flag_rows())
    assert len(rows) > 30 and {arch for _, arch, _, _ in rows} >= {
        "transformer_posattn", "transformer_lm_posattn", "attentive_lstm_lm", "positional_attentive_lstm_lm"}
    helps: Dict[Tuple[str, str], str] = {}
    for task, arch, flags, command_line in rows:
        text = helps.setdefault((task, arch), help_text(task, arch))
        for flag in (word for word in flags if word.startswith("--")):
            assert re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", text), f"{flag} not in -h of {task} {arch}"
        if command_line:  # the row's flags and values parse (argparse exits on a bad one)
            parse_model_args(["--task", task, "--arch", arch, *flags])


def test_every_architecture_of_the_readme_is_registered():
    (rows,) = [rows for header, rows in readme_tables() if header.startswith("| architecture |")]
    names = [span[1:-1] for row in rows for span in CODE_SPAN.findall(row[0])]
    assert len(names) >= 10 and all(arch in ARCH_MODEL_REGISTRY for arch in names), names


def test_the_option_tables_are_what_make_docs_writes():
    assert docs_tables.problems() == []


def test_a_changed_help_text_or_a_method_without_its_table_is_reported(tmp_path):
    for document in docs_tables.DOCUMENTS:
        (tmp_path / document).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / document).write_text((ROOT / document).read_text(encoding="utf-8"), encoding="utf-8")
    methods = tmp_path / "docs/methods.md"
    text = methods.read_text(encoding="utf-8")
    methods.write_text(text.replace("odd width k of the attention convolution", "a width"), encoding="utf-8")
    assert docs_tables.problems(tmp_path) == [
        "docs/methods.md: the option tables differ from the registry's; run `make docs`"]
    assert docs_tables.write(tmp_path) == ["docs/methods.md"] and docs_tables.problems(tmp_path) == []
    start = text.index(docs_tables.start_line("alibi"))
    end = text.index(docs_tables.END, start) + len(docs_tables.END)
    methods.write_text(text[:start] + text[end:], encoding="utf-8")
    assert [line.split(":")[1].strip() for line in docs_tables.problems(tmp_path)] == ["no table of the method 'alibi'"]


def test_the_readme_is_a_front_page():
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 250, f"README.md has {len(lines)} lines; the reference goes to docs/ and examples/"


def test_the_version_has_one_source():
    setup = (ROOT / "setup.py").read_text(encoding="utf-8")
    assert "version=VERSION" in setup and not re.search(r"version=['\"]", setup)
    newest = re.search(r"^## (\S+)", (ROOT / "CHANGELOG.md").read_text(encoding="utf-8"), re.M).group(1)
    assert newest == posattn.__version__ == fairseq_posattn.__version__
