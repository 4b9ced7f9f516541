"""Step 3: the device-aware test files with ``pytest --device <device>``, one report row per file."""

import sys
import time
import xml.etree.ElementTree as ElementTree
from pathlib import Path
from typing import Dict, List

from posattn_tools.gpu_check.context import Context, Row
from posattn_tools.gpu_check.settings import PYTEST_FILES
from posattn_tools.runs import REPO_ROOT, CommandError, run


def junit_counts(path: Path) -> Dict[str, Dict[str, int]]:
    """Per test module (``test_compile``...): how many tests passed, failed, errored, were skipped."""
    counts: Dict[str, Dict[str, int]] = {}
    for case in ElementTree.parse(path).getroot().iter("testcase"):
        # a test's module is in its classname; a collection error's, in its name
        parts = case.get("classname", "").split(".") + case.get("name", "").split(".")
        module = next((part for part in parts if part.startswith("test_")), "")
        outcome = "passed"
        for child, name in (("failure", "failed"), ("error", "errors"), ("skipped", "skipped")):
            if case.find(child) is not None:
                outcome = name
                break
        counts.setdefault(module, dict.fromkeys(("passed", "failed", "errors", "skipped"), 0))[outcome] += 1
    return counts


def pytest_step(ctx: Context) -> List[Row]:
    """The device-aware test files with ``pytest --device <device>``, one row per file."""
    device = ctx.machine.kind
    setting = " ".join(("--device", device, *ctx.scale.pytest_args))
    present = [name for name in PYTEST_FILES if (REPO_ROOT / name).exists()]
    rows = [Row(f"pytest {name}", device, setting, "skipped", "not in this checkout")
            for name in PYTEST_FILES if name not in present]
    if not present:
        return rows
    junit = ctx.output / "pytest.xml"
    junit.unlink(missing_ok=True)
    command = [sys.executable, "-m", "pytest", "-q", "-rfE", "-p", "no:cacheprovider",
               "--continue-on-collection-errors", "--device", device, f"--junitxml={junit}",
               *ctx.scale.pytest_args, *present]
    started = time.monotonic()
    try:
        run(command, ctx.logs / "pytest.log", ctx.env(), ctx.cli.timeout)
        failure = ""
    except CommandError as error:
        failure = str(error)
    seconds = time.monotonic() - started
    try:
        counts = junit_counts(junit) if junit.exists() else {}
    except ElementTree.ParseError:  # pytest killed while writing it
        counts = {}
    for name in present:
        numbers = counts.get(Path(name).stem)
        if numbers is None:
            rows.append(Row(f"pytest {name}", device, setting, "FAILED" if failure else "skipped",
                            failure or "no test selected"))
            continue
        bad = numbers["failed"] + numbers["errors"]
        text = ", ".join(f"{value} {key}" for key, value in numbers.items() if value)
        rows.append(Row(f"pytest {name}", device, setting, "FAILED" if bad else "passed",
                        f"{text} ({seconds:.0f} s for all files)"))
    return rows

