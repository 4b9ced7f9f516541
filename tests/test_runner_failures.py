"""The recipes' failures, each reported as what it is and never as a number: every recipe that trains in the
background runs once per output folder (a second one stops at once, in one line naming the first one's process);
the language-model recipe's training that fails is named with its log and not evaluated; the plain-PyTorch recipe's
damaged results.json is one line naming it; the evidence runner's stop reaches the jobs a recipe runs in process
groups of their own. (The length-extrapolation recipe killed, interrupted and doubled:
tests/test_length_extrapolation.py; the evidence runner's damaged files and killed trainings: tests/test_evidence.py.)
"""

import fcntl
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Dict, List

import pytest

from cli_helpers import BIN, SAMPLE, preprocess_in_process
from model_helpers import REPO
from posattn_tools.runs import CommandError, run_together, session_groups, signal_group, start
from process_helpers import session_commands, wait_until

EXAMPLES = Path(REPO) / "examples"
EWT = Path(REPO) / "data" / "ud_ewt_sample"
PTB_SAMPLE = Path(REPO) / "data" / "ptb_sample"


def recipe(script: Path, args: List[str], env: Dict[str, str]) -> subprocess.CompletedProcess:
    """``bash SCRIPT ARGS`` from the repository root, the virtualenv's tools first on PATH."""
    full_env = {**os.environ, "PATH": BIN + os.pathsep + os.environ["PATH"], "OMP_NUM_THREADS": "1", **env}
    return subprocess.run(["bash", str(script), *args], capture_output=True, text=True, cwd=REPO, env=full_env,
                          timeout=300)


def ud_folder(root: Path) -> str:
    """A UD release folder holding one of the paper's treebanks, English-GUM, with EWT's samples in its files
    (run_ud_treebanks.sh's argument)."""
    treebank = root / "UD_English-GUM"
    treebank.mkdir(parents=True)
    for split in ("train", "dev"):
        (treebank / f"en_gum-ud-{split}.conllu").write_bytes((EWT / f"en_ewt-ud-{split}.sample.conllu").read_bytes())
    return str(root)


#: every recipe that starts trainings in the background: its script, its arguments, and the variable naming its
#: output folder
LOCKED_RECIPES = {
    "length_extrapolation": ("length_extrapolation/run.sh", lambda tmp: [], "OUT"),
    "language_model": ("language_model/run_ptb.sh", lambda tmp: [], "OUT"),
    "pos_tagging": ("pos_tagging/run.sh", lambda tmp: [str(EWT / "en_ewt-ud-train.sample.conllu"),
                                                      str(EWT / "en_ewt-ud-dev.sample.conllu")], "OUT"),
    "ud_treebanks": ("pos_tagging/run_ud_treebanks.sh", lambda tmp: [ud_folder(tmp / "ud")], "OUT_ROOT"),
    "sentence_classification": ("sentence_classification/run.sh",
                                lambda tmp: [str(Path(REPO) / "data" / "sst2_sample")], "OUT"),
    "multi30k_en_de": ("multi30k_en_de/run.sh", lambda tmp: [SAMPLE], "OUT"),
    "wmt14_en_de": ("wmt14_en_de/run.sh", lambda tmp: [], "OUT"),
    "nist_zh_en": ("nist_zh_en/run.sh", lambda tmp: [], "OUT"),
    "quickstart": ("quickstart/run.sh", lambda tmp: [], "OUT"),
}


@pytest.mark.parametrize("name", sorted(LOCKED_RECIPES))
def test_a_second_run_on_the_same_output_folder_stops_at_once_naming_the_first(name, tmp_path):
    """With the folder's lock held (as a first run holds it until every process it started has ended), the recipe
    stops before it writes anything, in one line naming the holder's process and how to stop it."""
    script, arguments, variable = LOCKED_RECIPES[name]
    out = tmp_path / "out"
    out.mkdir()
    with open(out / ".recipe.lock", "w", encoding="utf-8") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        lock.write(f"{os.getpid()}\n")
        lock.flush()
        second = recipe(EXAMPLES / script, arguments(tmp_path), {variable: str(out)})
    assert second.returncode == 1, second.stdout[-2000:] + second.stderr[-2000:]
    line, = second.stderr.splitlines()
    assert f"error: another run is working in {out} (process {os.getpid()}," in line
    assert line.endswith(f"wait for it, or stop it with kill -TERM {os.getpid()}")
    assert sorted(p.name for p in out.iterdir()) == [".recipe.lock"]


@pytest.mark.slow
def test_a_language_model_whose_training_fails_is_named_and_not_evaluated(tmp_path):
    """fairseq-train refuses the model (4 dimensions do not split into 3 heads) and exits 1: run_ptb.sh names the
    model and its log in one line, evaluates nothing (fairseq-eval-lm of a checkpoint that no training finished),
    writes the table of what finished (none) and exits 1. The sample is binarized in this process, as the recipe's
    step 2 does, to spare a process start."""
    out = tmp_path / "out"
    preprocess_in_process(["--only-source", "--task", "language_modeling", "--workers", "1", "--destdir",
                           out / "data-bin", *[arg for split in ("train", "valid", "test")
                                               for arg in (f"--{split}pref", PTB_SAMPLE / f"{split}.txt")]])
    result = recipe(EXAMPLES / "language_model" / "run_ptb.sh", [],
                    {"OUT": str(out), "PTB_DIR": str(PTB_SAMPLE), "MODELS": "tf_vanilla", "TF_DIM": "4",
                     "TF_FFN": "8", "TF_LAYERS": "1", "TF_HEADS": "3", "MAX_UPDATE": "2"})
    assert result.returncode == 1, result.stdout[-2000:] + result.stderr[-2000:]
    log = out / "logs" / "train.tf_vanilla.log"
    assert (f"run_ptb.sh: error: the training of tf_vanilla did not finish (fairseq-train: exit status 1; see {log}): "
            "it is not evaluated") in result.stderr
    assert "run_ptb.sh: error: 1 of 1 models did not finish" in result.stderr.splitlines()[-1]
    assert "+ fairseq-eval-lm" not in result.stdout and not list((out / "logs").glob("eval.*"))
    assert "| tf_vanilla |" in (out / "results.md").read_text(encoding="utf-8")


def test_the_pytorch_recipes_damaged_results_are_one_line_naming_the_file(tmp_path):
    """A run's results.json cut short: examples/pytorch/extrapolation.py stops in one line naming it and what to
    do, not in a JSONDecodeError traceback."""
    results = tmp_path / "out" / "alibi" / "seed1" / "results.json"
    results.parent.mkdir(parents=True)
    results.write_text('[{"method": "alibi", "seed": 1, "mode": "nonoverlapping", "length": 6', encoding="utf-8")
    ran = subprocess.run([sys.executable, str(EXAMPLES / "pytorch" / "extrapolation.py"), "--out",
                          str(tmp_path / "out"), "--methods", "alibi", "--seeds", "1"], capture_output=True, text=True,
                         cwd=REPO, timeout=300)
    assert ran.returncode == 1 and "Traceback" not in ran.stderr, ran.stderr
    line, = ran.stderr.splitlines()
    assert line.startswith(f"extrapolation.py: error: {results} is cut short or damaged (not valid JSON: ")
    assert line.endswith(f"delete its folder {results.parent} to redo that run")


def test_a_stopped_recipe_takes_the_jobs_in_process_groups_of_their_own_with_it():
    """The evidence runner stops a recipe with posattn_tools.runs.signal_group (SIGKILL once its grace is over):
    the signal reaches every process group of the recipe's session, also the jobs workers.sh puts in groups of
    their own, so that no training outlives its recipe."""
    with open(os.devnull, "w", encoding="utf-8") as output:
        recipe = start(["bash", "-c", "set -m; sleep 60 & sleep 60 & wait"], output, dict(os.environ))
        wait_until(lambda: len(session_groups(recipe.pid)) == 3, 30, "the two jobs in groups of their own")
        signal_group(recipe, signal.SIGKILL)
        recipe.wait(timeout=30)
    wait_until(lambda: not session_commands(recipe.pid), 10, "the end of every process of the recipe")


def test_ranks_run_together_name_the_one_that_failed_not_the_one_killed_after_it(tmp_path):
    """posattn_tools.runs.run_together (the GPU check's gloo ranks): when one rank aborts, the rank still running
    is killed, and the error names the aborted rank's command, exit status and log; the killed one is not blamed.
    Negative control: ranks that all finish return their logs."""
    abort = [sys.executable, "-c", "import os, sys; print('rank 1 aborts', file=sys.stderr); os.abort()"]
    wait = [sys.executable, "-c", "import time; print('rank 0 waits', flush=True); time.sleep(60)"]
    logs = [tmp_path / "rank0.log", tmp_path / "rank1.log"]
    with pytest.raises(CommandError) as failure:
        run_together([wait, abort], logs, dict(os.environ), timeout=50)
    program = Path(sys.executable).name  # the name the error gives the command: the interpreter's, as it runs here
    assert str(failure.value) == f"{program} exit status -{int(signal.SIGABRT)} (log: {logs[1]}): rank 1 aborts"
    texts = run_together([wait[:2] + ["print('rank 0')"], abort[:2] + ["print('rank 1')"]], logs, dict(os.environ),
                         timeout=50)
    assert [text.splitlines()[-1] for text in texts] == ["rank 0", "rank 1"]


def test_a_job_paused_and_continued_is_waited_for_not_counted_as_failed(tmp_path):
    """Under job control bash's ``wait`` also returns when a job stops: workers.sh waits for a job that was paused
    (SIGSTOP, to lend its core to another command) and continued until it ends, with its own exit status, and a
    paused job still holds its place among the LIMIT that run. Negative control: a job that fails is counted."""
    marks = tmp_path / "marks"
    script = f"""
source {REPO}/examples/lib/workers.sh
stop_jobs_with_the_recipe
job() {{ echo "$1 start $(date +%s.%N)" >> {marks}; sleep 2; echo "$1 end $(date +%s.%N)" >> {marks}; return "$2"; }}
pause() {{ sleep 0.5; kill -STOP -- "-$1"; sleep 1; kill -CONT -- "-$1"; }}
start_job 1 job first 0
pause $! > /dev/null 2>&1 &
start_job 1 job second 0
pause $! > /dev/null 2>&1 &
wait_jobs && echo "ok $FAILED_JOBS"
start_job 1 job third 3
wait_jobs || echo "failed $FAILED_JOBS"
"""
    completed = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=60)
    assert completed.stdout.split() == ["ok", "0", "failed", "1"], completed.stdout + completed.stderr
    times = {(name, event): float(time) for name, event, time in map(str.split, marks.read_text().splitlines())}
    assert sorted(times) == sorted((name, event) for name in ("first", "second", "third") for event in ("start", "end"))
    assert times["second", "start"] >= times["first", "end"]  # the paused first held its place until it ended
