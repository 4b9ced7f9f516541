"""Errors a user can fix, reported by fairseq's own commands as one line, without a traceback.

``fairseq-train``, ``fairseq-generate``, ``fairseq-eval-lm``... let an exception raised while they
build a model or load data end the process with Python's traceback, whose last line is the message.
For the plugin's own refusals (:class:`UserError`: an option that cannot work, data that does not fit
the model, also when fairseq re-raises one as another exception) the traceback says nothing more
than that line: :func:`install` (called when fairseq
imports the plugin) makes the process print ``COMMAND: error: MESSAGE`` instead, and exit with status
1, as the ``posattn-*`` tools do. Every other exception keeps its traceback. ``fairseq-hydra-train`` runs
inside hydra, which reports exceptions itself: :func:`install` has hydra hand the plugin's refusals on instead
(:func:`reraise_under_hydra`).
"""

import os
import sys
from types import TracebackType
from typing import Optional, Type

from posattn.errors import UserError


def install() -> None:
    """Report uncaught :class:`UserError` exceptions as one line (once per process)."""
    reraise_under_hydra()
    previous = sys.excepthook
    if getattr(previous, "reports_user_errors", False):
        return

    def excepthook(kind: Type[BaseException], error: BaseException, trace: Optional[TracebackType]) -> None:
        cause = user_error_in(error)
        if cause is not None:
            print(f"{os.path.basename(sys.argv[0]) or 'python'}: error: {cause}", file=sys.stderr)
        else:
            previous(kind, error, trace)

    excepthook.reports_user_errors = True  # type: ignore[attr-defined]
    sys.excepthook = excepthook


def user_error_in(error: Optional[BaseException]) -> Optional[UserError]:
    """``error`` or the exception it was raised from or while handling (fairseq's trainer wraps a failed
    weight load in "Cannot load model parameters..."), if that is a :class:`UserError`."""
    seen = set()
    while error is not None and id(error) not in seen:
        if isinstance(error, UserError):
            return error
        seen.add(id(error))
        error = error.__cause__ or error.__context__
    return None


def reraise_under_hydra() -> None:
    """``fairseq-hydra-train`` trains inside hydra's ``run_and_report``, which catches every exception and
    prints its traceback, unless the environment sets ``HYDRA_FULL_ERROR=1``: it asks ``_is_env_set`` while
    it handles the exception. Answer yes for a :class:`UserError`, so that hydra raises it on and
    :func:`install`'s hook prints it as one line; every other exception keeps hydra's report."""
    try:
        from hydra._internal import utils as hydra_utils
    except ImportError:  # no hydra, no fairseq-hydra-train
        return
    original = hydra_utils._is_env_set
    if getattr(original, "reraises_user_errors", False):
        return

    def _is_env_set(name: str) -> bool:
        if name == "HYDRA_FULL_ERROR" and user_error_in(sys.exc_info()[1]) is not None:
            return True
        return original(name)

    _is_env_set.reraises_user_errors = True  # type: ignore[attr-defined]
    hydra_utils._is_env_set = _is_env_set
