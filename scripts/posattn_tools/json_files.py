"""Reading back the JSON files the tools and recipes wrote (the evidence runner's manifest, its records and their
settings, the recipes' ``results.json``): a file cut short or damaged (a full disk, a machine that went down
while it was written, an edit or a merge by hand) ends the command in one line that names the file and says what
to do, never in a ``JSONDecodeError`` traceback. Standard library only: the plain-PyTorch recipe reads its results
with it too."""

import json
import sys
from pathlib import Path
from typing import Union


class DamagedFile(SystemExit):
    """A file that does not hold the JSON its writer writes. Not caught, it ends the command with its message, one
    line on stderr, and status 1 (a :class:`SystemExit`: no traceback, whichever code read the file)."""


def read_json(path: Union[str, Path], remedy: str, kind: type = dict) -> object:
    """The JSON value of ``path``, which must be a ``kind`` (``dict`` or ``list``); :class:`DamagedFile` naming
    the file, what is wrong with it and ``remedy`` (what to do: "delete it to redo that run", ...) if it does not
    parse or holds another kind of value. A missing file raises :class:`FileNotFoundError` as ``open`` does."""
    try:
        with open(path, encoding="utf-8") as f:
            value = json.load(f)
    except json.JSONDecodeError as error:
        raise damaged(path, f"not valid JSON: {error}", remedy) from None
    except UnicodeDecodeError as error:
        raise damaged(path, f"not UTF-8 text: byte {error.object[error.start]:#04x} at offset {error.start}",
                      remedy) from None
    if not isinstance(value, kind):
        raise damaged(path, f"a JSON {type(value).__name__} where its writer writes a {kind.__name__}", remedy)
    return value


def damaged(path: Union[str, Path], what: str, remedy: str) -> DamagedFile:
    """The one-line error of a damaged file: ``PROGRAM: error: PATH is cut short or damaged (WHAT): REMEDY``."""
    program = Path(sys.argv[0]).name if sys.argv and sys.argv[0] else "python"
    return DamagedFile(f"{program}: error: {path} is cut short or damaged ({what}): {remedy}")
