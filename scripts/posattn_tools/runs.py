"""Running commands, building fairseq command lines and reading fairseq's logs: the one copy that the GPU
check (:mod:`posattn_tools.gpu_check`), ``scripts/gpu_verify.py``, the benchmark (``scripts/posattn_benchmark``)
and the evidence runner (``examples/evidence/``) use.

Commands:

- :func:`run` / :func:`run_together`: a command (or the ranks of one distributed training) with stdout and
  stderr in a log, killed with every process it started at a timeout or at the first failure;
  :class:`CommandError` carries the telling line of the log (:func:`last_error`);
- :func:`start` / :func:`signal_group`: a long command in a session of its own (the evidence runner's
  recipes), stopped with every process group of its session;
- :func:`capture`: a short command whose output is read (the benchmark's workers, ``git``);
- :func:`tool` and :func:`tool_env`: the virtualenv's console tools (``fairseq-train``, ``posattn-*``) first.

fairseq command lines: :func:`side_flags` (``--encoder-layers 2 --decoder-layers 2 ...``).

fairseq logs: the patterns of the lines fairseq-train, fairseq-validate and fairseq-eval-lm write, and
readers of the quantities the tools take from them (validation curves, overflow skips, perplexity, the
training device, the training time per epoch).
"""

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import IO, Dict, List, Mapping, Optional, Sequence, Tuple, Union

REPO_ROOT = Path(__file__).resolve().parents[2]
#: the console tools of this interpreter's environment (the virtualenv's bin)
BIN = Path(sys.executable).parent


# ------------------------------------------------------------------------------------ commands
class CommandError(RuntimeError):
    """A command that failed; the message is the last lines of its log."""


def tool(name: str) -> str:
    """The path of a console tool: the virtualenv's, else the one on PATH."""
    path = BIN / name
    if path.exists():
        return str(path)
    found = shutil.which(name)
    if found is None:
        raise FileNotFoundError(f"'{name}' is neither in {BIN} nor on PATH: run `make install` first")
    return found


def tool_env(extra: Mapping[str, str] = {}, base: Optional[Mapping[str, str]] = None) -> Dict[str, str]:
    """The environment of a command: ``base`` (default: this process's) with ``extra``, and the virtualenv's
    bin first on ``PATH``, so that a command's own ``fairseq-train`` or ``posattn-*`` is this checkout's."""
    env = {**(os.environ if base is None else base), **extra}
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    return env


def start(command: Sequence[str], output: IO[str], env: Mapping[str, str], cwd: Path = REPO_ROOT,
          stdin: Optional[int] = None) -> subprocess.Popen:
    """Start ``command`` with stdout and stderr into ``output``, in a session of its own: its process group
    (it and whatever it starts) can be signalled at once (:func:`signal_group`)."""
    return subprocess.Popen(list(command), stdout=output, stderr=subprocess.STDOUT, stdin=stdin, env=dict(env),
                            cwd=cwd, start_new_session=True)


def signal_group(process: subprocess.Popen, signum: int = signal.SIGKILL) -> None:
    """Send ``signum`` to the process group of ``process`` (started by :func:`start`, in a session of its own)
    and to every other process group of that session (a recipe runs its trainings in groups of their own:
    examples/lib/workers.sh); nothing to a group that has ended (it may end between a poll and the signal)."""
    for group in {process.pid, *session_groups(process.pid)}:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(group, signum)


def session_groups(session: int) -> set:
    """The process groups of the live processes of ``session`` (from /proc; empty where there is none)."""
    groups = set()
    for entry in os.listdir("/proc") if os.path.isdir("/proc") else []:
        if entry.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                state, _, group, owner = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[:4]
                if int(owner) == session and state != "Z":  # after the command: state, ppid, group, session
                    groups.add(int(group))
    return groups


def capture(command: Sequence[str], env: Optional[Mapping[str, str]] = None,
            cwd: Path = REPO_ROOT) -> subprocess.CompletedProcess:
    """Run a short command to its end, its stdout and stderr captured as text (``env``: the whole
    environment, default this process's)."""
    return subprocess.run(list(command), capture_output=True, text=True, cwd=cwd,
                          env=None if env is None else dict(env))


def run(command: Sequence[str], log: Path, env: Mapping[str, str], timeout: float, cwd: Path = REPO_ROOT) -> str:
    """Run ``command`` with stdout and stderr in ``log``; return the log's text, or raise
    :class:`CommandError` with its last lines if the command fails or runs past ``timeout`` s."""
    return run_together([command], [log], env, timeout, cwd)[0]


def run_together(commands: Sequence[Sequence[str]], logs: Sequence[Path], env: Mapping[str, str],
                 timeout: float, cwd: Path = REPO_ROOT) -> List[str]:
    """Run ``commands`` at once (e.g. the ranks of one distributed training), each with stdout and
    stderr in its log; return the logs' texts. As soon as one fails, or at ``timeout`` s, every one
    is killed with the processes it started (fairseq's one process per GPU) and
    :class:`CommandError` is raised with the first failure's last lines."""
    processes = []
    for command, log in zip(commands, logs):
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "w", encoding="utf-8") as handle:
            handle.write("$ " + " ".join(command) + "\n")
            handle.flush()
            processes.append(start(command, handle, env, cwd))
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        states = [process.poll() for process in processes]
        if None not in states or any(state not in (None, 0) for state in states):
            break
        time.sleep(0.2)
    killed = set()
    for index, process in enumerate(processes):
        if process.poll() is None:
            signal_group(process, signal.SIGKILL)
            process.wait()
            killed.add(index)
    texts = [read_log(log) for log in logs]
    failed = [index for index, process in enumerate(processes) if process.returncode != 0]
    if failed:
        first = min(failed, key=lambda index: (index in killed, index))  # the ones killed here last
        status = processes[first].returncode
        why = f"timed out after {timeout:.0f} s" if status < 0 and time.monotonic() >= deadline else \
            f"exit status {status}"
        output = texts[first].split("\n", 1)[-1]  # without the command line written first
        raise CommandError(f"{command_name(commands[first])} {why} (log: {logs[first]}): {last_error(output)}")
    return texts


def command_name(command: Sequence[str]) -> str:
    """``fairseq-train``, ``pytest`` (for ``python -m pytest``), ``posattn_benchmark`` (for ``python
    scripts/posattn_benchmark``), ``X.py`` (for ``python X.py``)."""
    program = Path(command[0]).name
    if not program.startswith("python"):
        return program
    if len(command) > 2 and command[1] == "-m":
        return command[2]
    if len(command) > 1 and (command[1].endswith(".py") or Path(command[1]).is_dir()):
        return Path(command[1]).name
    return program


def last_error(text: str) -> str:
    """The most telling line of a failed command's output: its last error line, else its last line."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    errors = [line for line in lines if re.search(r"(Error|Exception|error:|FAILED)", line)]
    return (errors or lines or ["no output"])[-1][-300:]


# ------------------------------------------------------------------------------------ fairseq command lines
def side_flags(sides: Sequence[str], options: Mapping[str, Union[int, float, str, None]]) -> List[str]:
    """``--<side>-<option> <value>`` for every side and every option whose value is not None, side by side
    (``--encoder-layers 2 --encoder-embed-dim 16 ... --decoder-layers 2 ...``)."""
    return [item for side in sides for option, value in options.items() if value is not None
            for item in (f"--{side}-{option}", str(value))]


# ------------------------------------------------------------------------------------ fairseq logs
#: a line's time stamp (``--log-format simple``)
STAMP = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d) \| ")
BEGIN_EPOCH = re.compile(r"\| begin training epoch (\d+)$")
END_EPOCH = re.compile(r"\| train \| epoch (\d+) \|")
#: fairseq-train's progress within an epoch: epoch, updates so far, updates per epoch, updates per second
TRAIN_INNER = re.compile(r"\| epoch (\d+): +(\d+) / (\d+) .*?\bups=([0-9.]+)")
VALID_PPL = re.compile(r"\| valid on 'valid' subset \|.*?\| ppl ([0-9.e+-]+|inf|nan) ")
#: an epoch's summary line: epoch, its training time (validation excluded)
TRAIN_WALL = re.compile(r"\| train \| epoch (\d+) \|.*?\| train_wall ([0-9.]+)")
#: the GPU fairseq-train names at its start (``rank 0: capabilities = ...; name = NVIDIA H100 80GB HBM3``)
CUDA_DEVICE = re.compile(r"\| rank +\d+: capabilities = .*?; name = (.+?) *$", re.M)
CUDA_RANK = re.compile(r"\| rank +(\d+): capabilities")
#: fairseq-validate's accuracy (a classification)
VALIDATE_ACCURACY = re.compile(r"valid on 'valid' subset \|.*?\| accuracy ([0-9.]+)")
#: fairseq-eval-lm's closing line
EVAL_LM_PERPLEXITY = re.compile(r"Perplexity: ([0-9.]+|inf|nan)")
#: the trainer's last line
DONE_TRAINING = "done training"
#: the loss scaler's note of an update skipped (``--fp16``, ``--amp``)
GRADIENT_OVERFLOW = "overflow detected"


def read_log(path: Path) -> str:
    """A log's text (undecodable bytes replaced: a command killed mid-write leaves a cut character)."""
    return Path(path).read_text(encoding="utf-8", errors="replace")


def validation_points(log: Path, metric: str = "loss", x: str = "num_updates") -> List[Tuple[float, float]]:
    """``(x, metric)`` of every validation in a fairseq-train log."""
    from fairseq_posattn.inspect.learning_curves import read_curve

    return read_curve(str(log), metric=metric, x=x).points


def validations(log: Path, x: str) -> Dict[float, Dict[str, float]]:
    """Every 'valid' validation of a fairseq-train log by ``x`` (``epoch`` or ``num_updates``), in order of
    ``x``; a later validation of the same x (a resumed training's) replaces an earlier one."""
    from fairseq_posattn.inspect.learning_curves import read_validations

    if not log.exists():
        return {}
    found = {stats[x]: stats for stats in read_validations(str(log)) if x in stats}
    return dict(sorted(found.items()))


def overflow_count(text: str) -> int:
    """How many updates fairseq's loss scaler (``--fp16``, ``--amp``) skipped for overflowing
    gradients: the trainer logs "NOTE: gradient overflow detected, ignoring gradient, ..." for each."""
    return sum(GRADIENT_OVERFLOW in line for line in text.splitlines())


def eval_lm_perplexity(text: str) -> Optional[float]:
    """The last perplexity fairseq-eval-lm printed, None if none."""
    found = EVAL_LM_PERPLEXITY.findall(text)
    return float(found[-1]) if found else None


def training_device(log: Path) -> str:
    """Where a training ran: ``CPU`` (fairseq's configuration has ``'cpu': True``, or there is no log), else
    the GPU fairseq-train names at its start, ``N x <name>`` for several, ``GPU`` if it names none."""
    if not log.exists():
        return "CPU"
    text = read_log(log)
    if "'cpu': True" in text:
        return "CPU"
    names = CUDA_DEVICE.findall(text)
    if not names:
        return "GPU"
    ranks = len(set(CUDA_RANK.findall(text)))
    return f"{ranks} x {names[0]}" if ranks > 1 else names[0]


def train_wall_by_epoch(log: Path) -> Dict[int, float]:
    """Per epoch, fairseq's train_wall of its summary line (seconds, validation excluded); a later line of
    the same epoch replaces an earlier one. Empty without a log."""
    per_epoch: Dict[int, float] = {}
    if log.exists():
        for match in TRAIN_WALL.finditer(read_log(log)):
            per_epoch[int(match[1])] = float(match[2])
    return per_epoch
