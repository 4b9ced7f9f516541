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
default back at once. Ctrl-C (SIGINT) raises ``KeyboardInterrupt`` and cleans up the same way.

A process killed without warning (SIGKILL, e.g. after a scheduler's grace period, an out-of-memory kill, a
power cut) cannot clean up. Every writer therefore holds an exclusive ``flock`` on its temporary file while
it writes, and the next write of the same target removes that target's temporaries whose lock is free:
their writer is gone. A locked one belongs to a live process writing the same file and is left alone.

Reading: :func:`read_lines` (and :func:`count_lines`) read UTF-8; a file that is not raises
:class:`NotUtf8Error` naming ``file:line`` of the first undecodable byte and how to convert the file. A
UTF-8 byte order mark at the start is dropped (with a warning), so that it does not become part of the
first word; a carriage return inside a line is an error naming ``file:line``, because Python (and fairseq)
would break the line there while ``wc -l`` and the other side of a parallel corpus do not. Windows line
endings (``\\r\\n``) are read like ``\\n``.

Writing over an input: :func:`refuse_output_that_is_an_input` is the check every command makes first.
"""

import contextlib
import fcntl
import functools
import io
import itertools
import logging
import os
import re
import shutil
import signal
import tempfile
import threading
from typing import IO, Callable, Iterable, Iterator, List, Optional, Tuple

logger = logging.getLogger(__name__)

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


def _stale_pattern(path: str) -> "re.Pattern[str]":
    """Names of the temporaries of ``path``: ``.NAME.`` + tempfile's 8 random characters + ``.tmp``."""
    return re.compile(re.escape(f".{os.path.basename(path)}.") + r"[a-z0-9_]{8}\.tmp")


def _writer_is_gone(temporary: str) -> bool:
    """True when no process holds the write lock of ``temporary`` (its writer was killed)."""
    fd = os.open(temporary, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False
    finally:
        os.close(fd)


def remove_stale_temporaries(path: str) -> List[str]:
    """Remove the temporary files (or staging directories) of ``path`` that killed runs left; return them.

    A temporary whose write lock is held belongs to a live process writing ``path`` right now: it is
    kept, with a warning (two runs writing one output would overwrite each other's work).
    """
    directory = os.path.dirname(os.path.abspath(path))
    pattern = _stale_pattern(path)
    removed = []
    for name in sorted(os.listdir(directory)) if os.path.isdir(directory) else []:
        temporary = os.path.join(directory, name)
        if not pattern.fullmatch(name):
            continue
        try:
            gone = _writer_is_gone(temporary)
        except FileNotFoundError:
            continue  # removed meanwhile
        except OSError as e:  # a file system without locks: nothing tells a killed writer from a live one
            logger.warning("%s may be left over by a killed run writing %s (cannot tell: %s); delete it if "
                           "no other process is writing that file", temporary, path, e.strerror)
            continue
        if not gone:
            logger.warning("another process is writing %s right now (its temporary %s is in use); two runs "
                           "writing one output overwrite each other", path, name)
            continue
        if os.path.isdir(temporary):
            shutil.rmtree(temporary, ignore_errors=True)
        else:
            with contextlib.suppress(FileNotFoundError):
                os.remove(temporary)
        logger.warning("removed %s, left by an earlier run that was killed while writing %s", temporary, path)
        removed.append(temporary)
    return removed


def _new_temporary(path: str, directory: bool = False) -> Tuple[str, int]:
    """A new empty file (or directory) ``.NAME.XXXXXXXX.tmp`` next to ``path`` (same file system, so the
    rename is atomic) and a descriptor holding its write lock; stale temporaries of ``path`` go first."""
    parent = os.path.dirname(os.path.abspath(path))
    os.makedirs(parent, exist_ok=True)
    remove_stale_temporaries(path)
    prefix = f".{os.path.basename(path)}."
    if directory:
        temporary = tempfile.mkdtemp(dir=parent, prefix=prefix, suffix=".tmp")
        fd = os.open(temporary, os.O_RDONLY)
    else:
        fd, temporary = tempfile.mkstemp(dir=parent, prefix=prefix, suffix=".tmp")
    with contextlib.suppress(OSError):  # no locks on this file system: the temporary is merely unmarked
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    return temporary, fd


@contextlib.contextmanager
def atomic_paths(*paths: str) -> Iterator[List[str]]:
    """Temporary paths to write ``paths`` under; all are renamed into place when the block exits normally.

    For files that other code opens by name (e.g. fairseq's indexed-dataset builders). If the block
    raises (or SIGTERM arrives), the temporary files are removed and no final name is touched.
    """
    with _cleanup_on_sigterm():
        temporaries: List[Tuple[str, int]] = []
        try:
            temporaries.extend(_new_temporary(path) for path in paths)
            yield [temporary for temporary, _ in temporaries]
            mode = 0o666 & ~_current_umask()  # mkstemp creates 0600 files
            for (temporary, _), path in zip(temporaries, paths):
                os.chmod(temporary, mode)
                os.replace(temporary, path)
        except BaseException:
            for temporary, _ in temporaries:
                with contextlib.suppress(FileNotFoundError):
                    os.remove(temporary)
            raise
        finally:
            for _, lock in temporaries:
                os.close(lock)


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
    with _cleanup_on_sigterm():
        staging, lock = _new_temporary(destdir, directory=True)
        try:
            yield staging
            os.makedirs(destdir, exist_ok=True)
            for name in sorted(os.listdir(staging)):
                os.replace(os.path.join(staging, name), os.path.join(destdir, name))
        finally:
            shutil.rmtree(staging, ignore_errors=True)
            os.close(lock)


class NotUtf8Error(ValueError):
    """A text input that is not UTF-8; the message names ``file:line`` and how to convert the file."""


def _not_utf8(path: str, open_binary: Callable[[], IO[bytes]], error: UnicodeDecodeError) -> NotUtf8Error:
    """The error for ``path``, naming the first line (1-based) that does not decode and its first bad byte."""
    convert = (f"zcat {path} | iconv -f latin1 -t utf-8 | gzip > {path[:-3]}.utf8.gz" if path.endswith(".gz")
               else f"iconv -f latin1 -t utf-8 {path} > {path}.utf8")
    fix = f"every input must be UTF-8: convert the file, e.g. `{convert}` for Latin-1 text (`file -i` guesses)"
    with open_binary() as f:
        for number, raw in enumerate(f, start=1):
            try:
                raw.decode("utf-8")
            except UnicodeDecodeError as e:
                shown = raw[max(0, e.start - 20):e.end + 20].rstrip(b"\r\n").decode("utf-8", "backslashreplace")
                return NotUtf8Error(f"{path}:{number}: not UTF-8 (byte {raw[e.start]:#04x} at column "
                                    f"{e.start + 1}: \"{shown}\"); {fix}")
    return NotUtf8Error(f"{path}: not UTF-8 ({error.reason}); {fix}")


@contextlib.contextmanager
def named_decode_errors(path: str, open_binary: Optional[Callable[[], IO[bytes]]] = None) -> Iterator[None]:
    """Within the block, a ``UnicodeDecodeError`` while reading ``path`` becomes :class:`NotUtf8Error`.

    ``open_binary`` opens the same bytes again to find the line (default: ``open(path, "rb")``; pass a
    ``gzip.open`` for compressed files).
    """
    try:
        yield
    except UnicodeDecodeError as error:
        raise _not_utf8(path, open_binary or (lambda: open(path, "rb")), error) from None


#: The UTF-8 byte order mark, as Python decodes it (``"utf-8"`` keeps it, ``"utf-8-sig"`` drops it).
BYTE_ORDER_MARK = "\ufeff"


class StrayCarriageReturnError(ValueError):
    """A carriage return inside a line of a text input; the message names ``file:line`` and the fix."""


def read_lines(path: str, max_lines: Optional[int] = None) -> Iterator[str]:
    """Yield the lines of a UTF-8 file without their line ending (``\\n`` or ``\\r\\n``), at most
    ``max_lines`` of them.

    A byte order mark at the start of the file is dropped, with a warning. Raises :class:`NotUtf8Error`
    naming ``path:line`` at the first line that is not UTF-8, and :class:`StrayCarriageReturnError` at the
    first line holding a carriage return that does not end it.
    """
    with open(path, encoding="utf-8", newline="\n") as f, named_decode_errors(path):
        for number, line in enumerate(itertools.islice(f, max_lines), start=1):
            line = line[:-1] if line.endswith("\n") else line
            line = line[:-1] if line.endswith("\r") else line
            if "\r" in line:
                raise _stray_carriage_return(path, number, line)
            if number == 1 and line.startswith(BYTE_ORDER_MARK):
                _warn_byte_order_mark(path)
                line = line[len(BYTE_ORDER_MARK):]
            yield line


def _stray_carriage_return(path: str, number: int, line: str) -> StrayCarriageReturnError:
    column = line.index("\r")
    shown = line[max(0, column - 20):column + 20].replace("\r", "\\r")
    return StrayCarriageReturnError(
        f"{path}:{number}: carriage return (\\r) inside the line, at column {column + 1}: \"{shown}\". Python "
        f"and fairseq would read it as a line break, while `wc -l` and the other files do not, so every later "
        f"line would be shifted. Replace it by a space, e.g. `sed -i 's/\\r$//; s/\\r/ /g' {path}` (which also "
        f"turns Windows line endings into plain ones)")


@functools.lru_cache(maxsize=None)
def _warn_byte_order_mark(path: str) -> None:
    """Warn once per file (a file is often read several times) that its byte order mark is dropped."""
    logger.warning("%s:1: starts with a UTF-8 byte order mark (BOM), which is dropped: it is not text and would "
                   "become part of the first word. fairseq-preprocess and subword-nmt keep it; to remove it from "
                   "the file: sed -i '1s/^\\xEF\\xBB\\xBF//' %s", path, path)


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


def refuse_output_that_is_an_input(output: str, *inputs: Optional[str]) -> None:
    """Raise ValueError when ``output`` is one of ``inputs`` (``None`` ones are skipped): writing it would
    replace the input, often before it is read in full.

    The same file can have several names (``./x``, a symbolic or hard link): existing files are compared
    with :func:`os.path.samefile`, others by their resolved paths.
    """
    for source in filter(None, inputs):
        if _same_file(output, source):
            named = "" if output == source else f" (under the name {source})"
            raise ValueError(f"{output}: the output is also an input{named}; writing it would destroy that input. "
                             "Write the output to another file")


def _same_file(first: str, second: str) -> bool:
    if os.path.exists(first) and os.path.exists(second):
        return os.path.samefile(first, second)
    return os.path.realpath(first) == os.path.realpath(second)
