"""The packages' layers: the library ``posattn`` imports torch and itself only (never a front-end, fairseq or
transformers; it runs where torch alone is installed: ``test_core_install.py``), command lines (``cli/``) sit on
the plugin and never the other way round, ``structure/`` does not reach into ``data/``, the attention kernel knows
kinds of term and no method, the shared core (the library's files but the methods' own, the plugin's
``modules/``, the sides) names no method, the side object is the only place a model builds a context, and
every ``posattn-*`` command is a thin ``cli/`` module. The tools (``scripts/``, ``examples/evidence/``) sit on
the library, which never imports them, and the tests reach them through pytest's ``pythonpath``, never by
editing ``sys.path``."""

import ast
import io
import os
import re
import sys
import tokenize
from typing import Iterator, List, Tuple

from cli_helpers import run, run_failing
from model_helpers import REPO

PACKAGE = os.path.join(REPO, "fairseq_posattn")
LIBRARY = os.path.join(REPO, "posattn")
SST2 = os.path.join(REPO, "data", "sst2_sample")


def imported_modules(path: str) -> Iterator[Tuple[int, str]]:
    """(line, module) of every absolute import of a Python file."""
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), path)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from ((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            yield from ((node.lineno, f"{node.module}.{alias.name}") for alias in node.names)


def imports_of(folder: str, prefix: str) -> list:
    """``file:line module`` for each import of ``prefix`` (or a submodule) below ``PACKAGE/folder``."""
    found = []
    for root, _, files in os.walk(os.path.join(PACKAGE, folder)):
        for name in sorted(f for f in files if f.endswith(".py")):
            path = os.path.join(root, name)
            found += [f"{os.path.relpath(path, REPO)}:{line} {module}" for line, module in imported_modules(path)
                      if module == prefix or module.startswith(prefix + ".")]
    return found


def test_the_library_never_imports_the_command_lines():
    outside_cli = [hit for hit in imports_of("", "fairseq_posattn.cli")
                   if not hit.startswith(os.path.join("fairseq_posattn", "cli", ""))]
    assert outside_cli == []


def test_structure_does_not_import_data():
    assert imports_of("structure", "fairseq_posattn.data") == []


def library_imports() -> Iterator[Tuple[str, str]]:
    """``(file:line, module)`` of every absolute import in the library."""
    for root, _, files in os.walk(LIBRARY):
        for name in sorted(f for f in files if f.endswith(".py")):
            path = os.path.join(root, name)
            yield from ((f"{os.path.relpath(path, REPO)}:{line}", module) for line, module in imported_modules(path))


def test_the_library_imports_torch_and_itself_only():
    """No front-end, no fairseq, no transformers, nothing else installed: ``pip install .`` needs torch alone. The
    Hugging Face front-end is a package of its own, ``posattn_huggingface``, which the library never imports."""
    allowed = {"torch", "posattn", "__future__", *sys.stdlib_module_names}
    found = [f"{where} {module}" for where, module in library_imports() if module.split(".")[0] not in allowed]
    assert found == []


def test_importing_the_library_or_the_plugin_leaves_dynamo_unloaded():
    """torch's compiler stack (dynamo, which the flex path's availability check loads) costs about 2 s of every
    process that loads it: the library loads it on the flex path's first use, never at import, so a fairseq
    command with ``--user-dir`` starts as fast as fairseq itself. Negative control: that first use loads it."""
    loaded = "import sys; print(sorted(m for m in sys.modules if m.startswith('torch._dynamo'))[:1])"
    for module in ("posattn", "fairseq_posattn"):
        assert run("python", ["-c", f"import {module}; {loaded}"]).stdout.strip() == "[]", module
    first_use = "from posattn.attention import flex_functions; flex_functions(); "
    assert run("python", ["-c", first_use + loaded]).stdout.strip() != "[]"


def test_the_comparison_suite_imports_the_library_only():
    """``posattn_tasks`` needs torch and ``posattn``: no fairseq; transformers only through the Hugging Face
    front-end in the one file of the ``--model llama`` flag, and matplotlib only in the file that draws."""
    suite = os.path.join(REPO, "posattn_tasks")
    allowed = {"torch", "posattn", "posattn_tasks", "__future__", *sys.stdlib_module_names}
    optional = {"model_huggingface.py": {"posattn_huggingface", "transformers"}, "plots.py": {"matplotlib"}}
    found = []
    for root, _, files in os.walk(suite):
        for name in sorted(f for f in files if f.endswith(".py")):
            found += [f"{os.path.relpath(os.path.join(root, name), REPO)}:{line} {module}"
                      for line, module in imported_modules(os.path.join(root, name))
                      if module.split(".")[0] not in allowed | optional.get(name, set())]
    assert found == []


def test_the_kernel_knows_kinds_of_term_and_no_method():
    kernel = [os.path.join(LIBRARY, name) for name in ("attention.py", "kernel_self_check.py")]
    kernel.append(os.path.join(PACKAGE, "modules", "attention.py"))
    methods = [module for path in kernel for _, module in imported_modules(path)
               if module.startswith("posattn.position_terms.")
               and not module.startswith("posattn.position_terms.base.")]
    assert methods == []


#: the shared core, relative to the repository: every file of the library but the methods' own, the plugin's
#: modules/, the side's files under models/, inspection
SHARED_CORE = [
    *(os.path.join("posattn", name) for name in sorted(os.listdir(LIBRARY)) if name.endswith(".py")),
    *(os.path.join("posattn", "position_terms", name)
      for name in ("base.py", "registry.py", "catalogue.py", "quantities.py", "side_inputs.py")),
    *(os.path.join("fairseq_posattn", "modules", name)
      for name in sorted(os.listdir(os.path.join(PACKAGE, "modules"))) if name.endswith(".py")),
    *(os.path.join("fairseq_posattn", "models", name) for name in ("position_side.py", "position_options.py",
                                                                 "position_aware_transformer.py", "building.py")),
    *(os.path.join("fairseq_posattn", "inspect", name) for name in ("capture.py", "plots.py")),
]


def method_words() -> List[str]:
    """What names a registered method: its name, its variants' names and their labels."""
    from posattn.position_terms.registry import REGISTRY

    words = set()
    for method in REGISTRY.values():
        words.update((method.name, *method.variants, *method.labels.values()))
    return sorted(words)


def prose_and_names(path: str) -> Iterator[Tuple[int, str]]:
    """(line, text) of a Python file's comments, docstrings and identifiers; string constants that are data
    (an older checkpoint's key) are not prose."""
    with open(path, encoding="utf-8") as f:
        source = f.read()
    tree = ast.parse(source, path)
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef)) and ast.get_docstring(node):
            yield node.body[0].lineno, ast.get_docstring(node)
        if isinstance(node, ast.Name):
            yield node.lineno, node.id
        elif isinstance(node, ast.Attribute):
            yield node.lineno, node.attr
        elif isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            yield node.lineno, node.name
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            yield token.start[0], token.string


def test_the_shared_core_names_no_method():
    """A method is named in its own file only: the kernel, the context, the registry's shared files and the
    sides know kinds of term and declarations (posattn's help texts and the options' docs come from the
    methods' own files)."""
    patterns = {word: re.compile(r"(?<![\w-])" + re.escape(word).replace(r"\-", "[-_ ]") + r"(?![\w-])", re.I)
                for word in method_words()}
    found = [f"{name}:{line} names {word!r}" for name in SHARED_CORE
             for line, text in prose_and_names(os.path.join(REPO, name))
             for word, pattern in patterns.items() if pattern.search(text)]
    assert found == []


def test_the_side_object_is_the_only_place_a_model_builds_a_context():
    builders = ("from_tokens", "from_padding", "unpadded", "example")
    found = []
    for folder in ("models", "tasks"):
        for root, _, files in os.walk(os.path.join(PACKAGE, folder)):
            for name in sorted(f for f in files if f.endswith(".py")):
                path = os.path.join(root, name)
                with open(path, encoding="utf-8") as f:
                    tree = ast.parse(f.read(), path)
                found += [f"{os.path.relpath(path, REPO)}:{node.lineno}" for node in ast.walk(tree)
                          if isinstance(node, ast.Attribute) and node.attr in builders
                          and isinstance(node.value, ast.Name) and node.value.id == "PositionContext"]
    assert len(found) == 1 and found[0].startswith(os.path.join("fairseq_posattn", "models", "position_side.py:")), found


#: the folders of the tools: their modules are importable by name in the tests (pyproject.toml's pythonpath)
TOOL_FOLDERS = ("scripts", os.path.join("examples", "evidence"))


def tool_modules() -> set:
    """The top-level names of the tools' modules and packages (``posattn_tools``, ``gpu_check``, ``records``...)."""
    names = set()
    for folder in TOOL_FOLDERS:
        for name in os.listdir(os.path.join(REPO, folder)):
            path = os.path.join(REPO, folder, name)
            if name.endswith(".py"):
                names.add(name[:-3])
            elif any(os.path.exists(os.path.join(path, marker)) for marker in ("__init__.py", "__main__.py")):
                names.add(name)
    return names


def test_the_packages_never_import_the_tools():
    tools = tool_modules()
    assert {"posattn_tools", "posattn_benchmark", "gpu_check", "evidence", "results_readers"} <= tools
    found = []
    for root, _, files in (*os.walk(PACKAGE), *os.walk(LIBRARY)):
        for name in sorted(f for f in files if f.endswith(".py")):
            path = os.path.join(root, name)
            with open(path, encoding="utf-8") as f:
                tree = ast.parse(f.read(), path)
            for node in ast.walk(tree):
                modules = ([alias.name for alias in node.names] if isinstance(node, ast.Import) else
                           [node.module] if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module
                           else [])
                found += [f"{os.path.relpath(path, REPO)}:{node.lineno} {module}" for module in modules
                          if module.split(".")[0] in tools]
    assert found == []


def test_no_test_edits_sys_path():
    """The tests import their helpers and the tools by name: ``[tool.pytest.ini_options] pythonpath``."""
    edits = []
    for name in sorted(f for f in os.listdir(os.path.join(REPO, "tests")) if f.endswith(".py")):
        path = os.path.join(REPO, "tests", name)
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read(), path)
        for node in ast.walk(tree):
            target = node.func.value if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) else None
            if (isinstance(target, ast.Attribute) and target.attr == "path" and isinstance(target.value, ast.Name)
                    and target.value.id == "sys"):
                edits.append(f"tests/{name}:{node.lineno} sys.path.{node.func.attr}")
    assert edits == []


def test_every_console_script_is_a_cli_module():
    """The plugin's commands are modules of ``fairseq_posattn/cli/``; the comparison suite's is its ``cli.py``."""
    with open(os.path.join(REPO, "setup.py"), encoding="utf-8") as f:
        scripts = re.findall(r'"(posattn-[a-z-]+) = ([\w.]+):main"', f.read())
    assert "posattn-prepare-classification" in dict(scripts)
    assert dict(scripts).pop("posattn-tasks") == "posattn_tasks.cli"
    for name, module in scripts:
        if name != "posattn-tasks":
            assert module.startswith("fairseq_posattn.cli."), name
        assert os.path.exists(os.path.join(REPO, *module.split(".")) + ".py"), module


def test_prepare_classification_command_splits_sst2_and_refuses_bad_lines(tmp_path):
    train, dev = (os.path.join(SST2, f"stsa.binary.{split}") for split in ("train", "dev"))
    run("posattn-prepare-classification", ["--train", train, "--valid", dev, "--labels", "0", "1",
                                           "--destdir", str(tmp_path / "text")])
    assert sorted(os.listdir(tmp_path / "text")) == ["train.input0", "train.label", "valid.input0", "valid.label"]
    labels = (tmp_path / "text" / "valid.label").read_text(encoding="utf-8").splitlines()
    assert len(labels) == 200 and set(labels) == {"0", "1"}

    bad = tmp_path / "dev.txt"
    bad.write_text("1 a fine film\n2 a strange label\n", encoding="utf-8")
    result = run_failing("posattn-prepare-classification", ["--train", train, "--valid", str(bad), "--labels",
                                                             "0", "1", "--destdir", str(tmp_path / "bad")])
    assert f"posattn-prepare-classification: error: {bad}:2: label '2' is not one of 0, 1" in result.stderr
    assert not (tmp_path / "bad").exists()
