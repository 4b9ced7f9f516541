"""Atomic outputs (:mod:`fairseq_posattn.atomic_io`): a file appears complete or not at all, also when
the process is stopped by SIGTERM, and a command killed mid-write resumes from its finished outputs."""

import glob
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from cli_helpers import BIN, SAMPLE
from fairseq_posattn.atomic_io import (TERMINATED_EXIT_STATUS, atomic_directory_update, atomic_paths,
                                       atomic_write, read_lines, write_lines)
from fairseq_posattn.structure.conllu_io import read_conllu
from model_helpers import REPO


def python(script: str, *args: str) -> subprocess.Popen:
    """Start ``script`` in a fresh interpreter with this repository importable; stdout is a pipe."""
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(script), *args], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_files_appear_only_when_complete(tmp_path):
    target = tmp_path / "sub" / "lines.txt"
    with atomic_write(str(target)) as out:
        out.write("first\n")
        assert not target.exists() and len(os.listdir(tmp_path / "sub")) == 1  # only the temporary file
    assert target.read_text(encoding="utf-8") == "first\n"
    assert os.stat(target).st_mode & 0o777 == 0o666 & ~_umask()  # not mkstemp's 0600
    with pytest.raises(RuntimeError, match="stop"):
        with atomic_write(str(target)) as out:
            out.write("second\n")
            raise RuntimeError("stop")
    assert target.read_text(encoding="utf-8") == "first\n" and os.listdir(tmp_path / "sub") == ["lines.txt"]
    assert write_lines(str(target), ["a", "b c"]) == 2 and list(read_lines(str(target))) == ["a", "b c"]


def test_several_paths_are_renamed_together_or_not_at_all(tmp_path):
    data, index = str(tmp_path / "x.bin"), str(tmp_path / "x.idx")
    with pytest.raises(ValueError):
        with atomic_paths(data, index) as (tmp_data, tmp_index):
            Path(tmp_data).write_bytes(b"\x01")
            raise ValueError("the index was never written")
    assert os.listdir(tmp_path) == []
    with atomic_paths(data, index) as (tmp_data, tmp_index):
        Path(tmp_data).write_bytes(b"\x01")
        Path(tmp_index).write_bytes(b"\x02")
    assert sorted(os.listdir(tmp_path)) == ["x.bin", "x.idx"] and Path(index).read_bytes() == b"\x02"


def test_directory_update_keeps_other_files_and_leaves_no_staging(tmp_path):
    destdir = tmp_path / "data-bin"
    destdir.mkdir()
    (destdir / "dict.txt").write_text("old\n", encoding="utf-8")
    with pytest.raises(KeyError):
        with atomic_directory_update(str(destdir)) as staging:
            Path(staging, "dict.txt").write_text("half\n", encoding="utf-8")
            raise KeyError("split")
    assert os.listdir(tmp_path) == ["data-bin"] and (destdir / "dict.txt").read_text(encoding="utf-8") == "old\n"
    with atomic_directory_update(str(destdir)) as staging:
        Path(staging, "train.bin").write_text("new\n", encoding="utf-8")
    assert os.listdir(tmp_path) == ["data-bin"] and sorted(os.listdir(destdir)) == ["dict.txt", "train.bin"]


SIGTERM_MID_WRITE = """
    import multiprocessing, os, signal, sys, time
    from fairseq_posattn.atomic_io import atomic_write
    with atomic_write(sys.argv[1]) as out:
        out.write("partial\\n")
        out.flush()
        child = multiprocessing.get_context("fork").Process(target=time.sleep, args=(60,))
        child.start()
        child.terminate()  # a process forked during the write dies from SIGTERM as usual
        child.join(30)
        print(child.exitcode, flush=True)
        time.sleep(60)  # the parent's SIGTERM arrives here
"""


def test_sigterm_mid_write_removes_the_temporary_file(tmp_path):
    process = python(SIGTERM_MID_WRITE, str(tmp_path / "out.txt"))
    child_exit = process.stdout.readline().strip()
    assert len(os.listdir(tmp_path)) == 1  # the temporary file, while writing
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=60) == TERMINATED_EXIT_STATUS, process.stderr.read()
    assert child_exit == str(-signal.SIGTERM)
    assert os.listdir(tmp_path) == []  # no output, no temporary file


def test_sigterm_handling_ends_with_the_write_and_respects_the_applications_handler(tmp_path):
    process = python("""
        import os, signal, sys, time
        from fairseq_posattn.atomic_io import atomic_write
        caught = []
        signal.signal(signal.SIGTERM, lambda *_: caught.append(1))
        with atomic_write(sys.argv[1]) as out:
            os.kill(os.getpid(), signal.SIGTERM)  # the application's handler runs; the write goes on
            out.write("done\\n")
        assert caught == [1]
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        with atomic_write(sys.argv[2]) as out:
            out.write("done\\n")
        print(signal.getsignal(signal.SIGTERM) is signal.SIG_DFL, flush=True)
        time.sleep(60)  # killed as any process is once the write is over
    """, str(tmp_path / "a.txt"), str(tmp_path / "b.txt"))
    assert process.stdout.readline().strip() == "True"
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=60) == -signal.SIGTERM, process.stderr.read()
    assert sorted(os.listdir(tmp_path)) == ["a.txt", "b.txt"]


@pytest.mark.slow
def test_parse_killed_mid_shard_resumes_from_its_finished_shards(tmp_path):
    """posattn-parse (spaCy, 2 shards of the 3,000-line Multi30k sample) is stopped while shard 1 is being
    written: shard 0 stays, shard 1 leaves nothing; the rerun parses only shard 1 and merges."""
    text, out = os.path.join(SAMPLE, "train.en"), str(tmp_path / "train.conllu")
    command = [os.path.join(BIN, "posattn-parse"), "--backend", "spacy", "--input", text, "--output", out,
               "--num-shards", "2"]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    shard_1_in_progress = str(tmp_path / ".train.conllu.shard-1-of-2.*.tmp")
    deadline = time.monotonic() + 240
    while not glob.glob(shard_1_in_progress) and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert glob.glob(shard_1_in_progress), f"shard 1 was never in progress: {process.stderr.read()[-2000:]}"
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=60) == TERMINATED_EXIT_STATUS
    assert os.listdir(tmp_path) == ["train.conllu.shard-0-of-2"]
    shard_0 = os.stat(f"{out}.shard-0-of-2")

    rerun = subprocess.run(command, capture_output=True, text=True)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert "shard 0 of 2 already done" in rerun.stderr
    assert os.stat(f"{out}.shard-0-of-2").st_mtime_ns == shard_0.st_mtime_ns
    assert [s.words for s in read_conllu(out)] == [line.split() for line in read_lines(text)]


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
