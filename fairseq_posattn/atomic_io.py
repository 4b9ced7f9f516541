"""Output files that appear complete or not at all, and the line reading that goes with them.

Every file the data-preparation code writes (tokenized and BPE text, label files, CoNLL-U parses and
their shards, binarized side data, tagging data folders) is first written under a temporary name in the
target's own directory and renamed into place (``os.replace``, atomic on POSIX) only once complete.
An exception, Ctrl-C or SIGTERM (a cluster scheduler's time limit, ``timeout``, ``kill``) removes the
temporary files instead: an interrupted run never leaves a half-written file under the final name, so a
later run that skips finished outputs can trust every file it finds.

SIGTERM normally kills Python without running ``finally`` blocks. While an atomic write is open in the
main thread, and only if the process has no SIGTERM handler of its own, SIGTERM therefore raises
``SystemExit(143)`` (the status a shell reports for a SIGTERM death) so the cleanup runs; the default
is restored when the outermost write ends, and processes forked meanwhile (e.g. parser workers) get the
default back at once.
"""

import contextlib
import io
import itertools
import os
import shutil
import signal
import tempfile
import threading
from typing import IO, Iterable, Iterator, List, Optional

#: Exit status of a process stopped by SIGTERM while an atomic write was open (128 + signal number).
TERMINATED_EXIT_STATUS = 128 + signal.SIGTERM


def _raise_system_exit(signum: int, frame: object) -> None:
    raise SystemExit(TERMINATED_EXIT_STATUS)


class _ForkGuard:
    """A child forked during an atomic write must die on SIGTERM as usual (``Pool.terminate`` relies on it).

    SIGTERM is blocked around ``fork`` and unblocked in the child only after the default action is back,
    so a SIGTERM sent right after the fork is neither lost nor turned into ``SystemExit``.
    """

    blocked = False

    @classmethod
    def before(cls) -> None:
        cls.blocked = signal.getsignal(signal.SIGTERM) is _raise_system_exit
        if cls.blocked:
            signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})

    @classmethod
    def after_in_parent(cls) -> None:
        if cls.blocked:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})

    @classmethod
    def after_in_child(cls) -> None:
        if cls.blocked:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})


os.register_at_fork(before=_ForkGuard.before, after_in_parent=_ForkGuard.after_in_parent,
                    after_in_child=_ForkGuard.after_in_child)


@contextlib.contextmanager
def _cleanup_on_sigterm() -> Iterator[None]:
    """Within the block, SIGTERM raises ``SystemExit`` so that ``finally``/``except`` cleanup runs.

    Only the main thread can install a handler, and a handler the process installed itself is left alone.
    """
    if threading.current_thread() is not threading.main_thread() \
            or signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        yield  # nested write, worker thread, or the application's own handler: nothing to change
        return
    signal.signal(signal.SIGTERM, _raise_system_exit)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


def _current_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _temporary_path(path: str) -> str:
    """A new empty file ``.NAME.XXXX.tmp`` next to ``path`` (same file system, so the rename is atomic)."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp_path = tempfile.mkstemp(dir=directory, prefix=f".{os.path.basename(path)}.", suffix=".tmp")
    os.close(fd)
    return tmp_path


@contextlib.contextmanager
def atomic_paths(*paths: str) -> Iterator[List[str]]:
    """Temporary paths to write ``paths`` under; all are renamed into place when the block exits normally.

    For files that other code opens by name (e.g. fairseq's indexed-dataset builders). If the block
    raises (or SIGTERM arrives), the temporary files are removed and no final name is touched.
    """
    with _cleanup_on_sigterm():
        tmp_paths: List[str] = []
        try:
            tmp_paths.extend(_temporary_path(path) for path in paths)
            yield list(tmp_paths)
            mode = 0o666 & ~_current_umask()  # mkstemp creates 0600 files
            for tmp_path, path in zip(tmp_paths, paths):
                os.chmod(tmp_path, mode)
                os.replace(tmp_path, path)
        except BaseException:
            for tmp_path in tmp_paths:
                with contextlib.suppress(FileNotFoundError):
                    os.remove(tmp_path)
            raise


@contextlib.contextmanager
def atomic_write(path: str) -> Iterator[IO[str]]:
    """Open a UTF-8 text file (``\\n`` line endings) that only appears under ``path`` once the block exits
    normally."""
    with atomic_paths(path) as (tmp_path,):
        with io.open(tmp_path, "w", encoding="utf-8", newline="\n") as out:
            yield out


@contextlib.contextmanager
def atomic_directory_update(destdir: str) -> Iterator[str]:
    """A temporary directory next to ``destdir`` whose files are moved into ``destdir`` (created if
    needed, other files kept) when the block exits normally; it is removed in every case.

    For outputs made of several files that belong together (a vocabulary and its binarized splits).
    """
    parent = os.path.dirname(os.path.abspath(destdir))
    os.makedirs(parent, exist_ok=True)
    with _cleanup_on_sigterm():
        staging = tempfile.mkdtemp(dir=parent, prefix=f".{os.path.basename(destdir)}.", suffix=".tmp")
        try:
            yield staging
            os.makedirs(destdir, exist_ok=True)
            for name in sorted(os.listdir(staging)):
                os.replace(os.path.join(staging, name), os.path.join(destdir, name))
        finally:
            shutil.rmtree(staging, ignore_errors=True)


def read_lines(path: str, max_lines: Optional[int] = None) -> Iterator[str]:
    """Yield the lines of a UTF-8 file without their line ending, at most ``max_lines`` of them."""
    with open(path, encoding="utf-8") as f:
        for line in itertools.islice(f, max_lines):
            yield line.rstrip("\r\n")


def count_lines(path: str) -> int:
    """Number of lines in a UTF-8 text file (a last line without newline counts)."""
    return sum(1 for _ in read_lines(path))


def write_lines(path: str, lines: Iterable[str]) -> int:
    """Atomically write ``lines`` (one per line) to ``path``; return how many were written."""
    n = 0
    with atomic_write(path) as out:
        for line in lines:
            out.write(line + "\n")
            n += 1
    return n
