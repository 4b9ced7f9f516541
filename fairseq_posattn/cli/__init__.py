"""Command-line entry points (``posattn-*`` console scripts, see setup.py).

Each module is a thin argparse layer over library code (:mod:`fairseq_posattn.data` and friends).
Errors a user can fix (a malformed or non-UTF-8 input, a missing file, options that do not combine)
are reported by :func:`reported_errors` as one line ``posattn-xxx: error: ...`` and exit status 1,
without a traceback; docs/input_checks.md lists them.
"""

import argparse
import contextlib
import logging
import os
import sys
from typing import Callable, Iterator, Tuple, Type

#: Exit status after Ctrl-C (128 + SIGINT), as a shell reports it.
INTERRUPTED_EXIT_STATUS = 130


def setup_logging() -> None:
    """fairseq's log format, on stderr (stdout carries the commands' results).

    ``force=True``: importing fairseq already configured the root logger (its
    ``wav2vec2_classification`` module even sets it to DEBUG), which would make a plain
    ``basicConfig`` a no-op.
    """
    logging.basicConfig(
        force=True,
        format="%(asctime)s | %(levelname)s | %(name)s | %(message)s",
        datefmt="%Y-%m-%d %H:%M:%S",
        level=os.environ.get("LOGLEVEL", "INFO").upper(),
        stream=sys.stderr,
    )


def error_message(error: BaseException) -> str:
    """The text of an expected error; an ``OSError`` as ``FILE: reason`` (e.g. ``x.txt: No such file or
    directory``)."""
    if isinstance(error, OSError) and error.filename is not None and error.strerror:
        return f"{error.filename}: {error.strerror}"
    return str(error)


@contextlib.contextmanager
def reported_errors(prog: str, *errors: Type[BaseException]) -> Iterator[None]:
    """Run a command's work: ``ValueError``, ``OSError`` and ``errors`` end the process with the one line
    ``prog: error: MESSAGE`` on stderr and status 1; Ctrl-C ends it with ``prog: interrupted`` and 130.

    Atomic outputs (:mod:`fairseq_posattn.atomic_io`) have removed their temporary files by then.
    """
    try:
        yield
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        sys.exit(INTERRUPTED_EXIT_STATUS)
    except (ValueError, OSError, *errors) as error:
        sys.exit(f"{prog}: error: {error_message(error)}")


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def name_and_path(name: str) -> Callable[[str], Tuple[str, str]]:
    """An argparse ``type`` for ``NAME=PATH`` arguments, ``name`` being what the usage calls the part
    before ``=`` (``"LABEL"`` gives ``expected LABEL=PATH`` on a malformed one):
    ``"baseline=gen.txt"`` -> ``("baseline", "gen.txt")``."""
    def split(text: str) -> Tuple[str, str]:
        label, sep, path = text.partition("=")
        if not sep or not label or not path:
            raise argparse.ArgumentTypeError(f"expected {name}=PATH, got {text!r}")
        return label, path
    return split
