"""A recipe started as a user starts it, in a session of its own, and the processes it runs: found by that session
(never by name across the machine), so that a test can kill its real fairseq-train as the out-of-memory killer
would, or press Ctrl-C as a terminal does (SIGINT to the recipe's process group)."""

import os
import subprocess
import time
from pathlib import Path
from typing import Callable, Dict, List, Mapping, Optional

from cli_helpers import BIN
from model_helpers import REPO


def start_recipe(script: str, env: Mapping[str, str], *args: str) -> subprocess.Popen:
    """``bash SCRIPT ARGS`` from the repository root, the virtualenv's tools first on PATH, in a session of its own
    (its session id is its pid), stdout and stderr captured as text."""
    full_env = {**os.environ, "PATH": BIN + os.pathsep + os.environ.get("PATH", ""), "OMP_NUM_THREADS": "1", **env}
    return subprocess.Popen(["bash", script, *args], cwd=REPO, env=full_env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)


def session_commands(session: int) -> Dict[int, str]:
    """pid -> command line of every live process of ``session`` (a recipe's pid from :func:`start_recipe`)."""
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            command = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except (OSError, IndexError):
            continue  # ended meanwhile
        if int(fields[3]) == session and fields[0] != "Z":  # field 6 of stat: the session; zombies are gone
            found[int(entry)] = command
    return found


def wait_until(condition: Callable[[], object], timeout: float, what: str, process: Optional[subprocess.Popen] = None):
    """``condition()``'s first true value, polled every 50 ms; fails after ``timeout`` s, or when ``process`` ends
    first (with its output)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        if process is not None and process.poll() is not None:
            out, err = process.communicate()
            raise AssertionError(f"the recipe ended (status {process.returncode}) before {what}:\n{out[-2000:]}\n"
                                 f"{err[-2000:]}")
        time.sleep(0.05)
    raise AssertionError(f"no {what} after {timeout:.0f} s")


def running(session: int, tool: str) -> List[int]:
    """The pids of ``tool`` (``fairseq-train``, ``fairseq-eval-lm``) running in ``session``."""
    return [pid for pid, command in session_commands(session).items() if f"/{tool} " in command]
