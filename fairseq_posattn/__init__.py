"""fairseq-posattn: position-aware self-attention for fairseq (``--user-dir fairseq_posattn``), the fairseq
front-end of the library :mod:`posattn`.

Importing the package applies the compatibility shims (:mod:`fairseq_posattn.compat`, and
:mod:`fairseq_posattn.distributed_compat` for distributed training on CPU processes and under
torchrun), makes the plugin's own refusals one line in fairseq's commands
(:mod:`fairseq_posattn.user_errors`), registers the architectures and tasks with fairseq, and marks the
trainer's checkpoint loads (:mod:`fairseq_posattn.models.position_record`: a refusal there advises the
training flag that makes the change explicit).
"""

import importlib.util
import os
import sys

#: the extras a ``posattn-*`` command needs beyond ``[fairseq]`` (setup.py's console scripts)
COMMAND_EXTRAS = {"posattn-parse": "fairseq,parse"}


def _refusal(message: str, missing: str, extra: str) -> ImportError:
    """The import's refusal (``message``), an ImportError; in a ``posattn-*`` command of this front-end (setup.py's
    console scripts, which ``pip install`` without an extra installs too) the one line ``COMMAND: error: ...``
    naming the extra to install instead, and exit status 1."""
    command = os.path.basename(sys.argv[0]) if sys.argv else ""
    module = command[len("posattn-"):].replace("-", "_")  # each command is a module of cli/ (tests/test_layering.py)
    if command.startswith("posattn-") and os.path.isfile(os.path.join(os.path.dirname(__file__), "cli",
                                                                      f"{module}.py")):
        extra = COMMAND_EXTRAS.get(command, extra)
        raise SystemExit(f"{command}: error: {command} is a command of the fairseq front-end, which needs "
                         f"{missing}: pip install \"fairseq-posattn[{extra}]\" (the library posattn alone needs "
                         "torch only)")
    return ImportError(message)


try:
    import fairseq  # noqa: F401
except ImportError as e:
    raise _refusal(
        f"fairseq_posattn is a fairseq 0.12 plugin, and fairseq does not import here ({e}). Install it: "
        "on Python >= 3.11 `pip install --no-deps fairseq-fixed==0.12.3.1` (the official fairseq==0.12.2 "
        "does not import on 3.11), below 3.11 `pip install fairseq==0.12.2`; or `pip install "
        "'fairseq-posattn[fairseq]'`, which picks the right one (README: Install into your own environment)",
        f"fairseq 0.12 ({e})", "fairseq") from e

#: the import names of the front-end's libraries (setup.py's ``plugin`` extra), which ``pip install fairseq-posattn``
#: without an extra leaves out (the library ``posattn`` needs torch alone)
PLUGIN_LIBRARIES = ("sacrebleu", "sacremoses", "subword_nmt", "conllu", "tqdm", "matplotlib")
_missing = [name for name in PLUGIN_LIBRARIES if importlib.util.find_spec(name) is None]
if _missing:
    raise _refusal(f"the fairseq front-end needs {', '.join(_missing)}, which are not installed: "
                   "`pip install 'fairseq-posattn[plugin]'` (or [fairseq], which also installs fairseq); "
                   "the library `posattn` alone needs torch only", f"{', '.join(_missing)} (not installed)", "plugin")

from fairseq_posattn import compat, distributed_compat, user_errors  # noqa: E402

compat.apply_all()
distributed_compat.apply_all()
user_errors.install()

from fairseq_posattn import criterions, models, optim, tasks  # noqa: E402,F401  (registers them with fairseq)
from fairseq_posattn.data import encoders  # noqa: E402,F401  (--tokenizer posattn_moses, --bpe posattn_subword_nmt)
from fairseq_posattn.models import position_record  # noqa: E402

position_record.install()

compat.show_model_options_in_help()

from posattn import __version__  # noqa: E402,F401  (the library's: one distribution, one version)
