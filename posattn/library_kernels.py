"""Outside libraries' fused kernels, each computing a whole attention with one term, imported only where used.

A term that declares a library kernel (:class:`~posattn.position_terms.base.LibraryAttention`, e.g. PaTH with
flash-linear-attention's ``parallel_path_attn``) names the module it needs; this file imports it the first time a
layer could take it and remembers the outcome, so that a model without the library, or on a device its kernels do
not run on, never imports it. The libraries are optional extras (``pip install ".[fla]"``); the core needs torch
alone.

The libraries' kernels are Triton kernels: they run on CUDA tensors, and on CPU tensors under Triton's interpreter
(``TRITON_INTERPRET=1``, set before Triton is imported), where ``tests/test_library_kernels.py`` runs them.
"""

import importlib
import os
from types import ModuleType
from typing import Dict, Tuple, Union

import torch

#: the module of each library imported so far, or why it could not be (its error's type and first line)
_IMPORTED: Dict[str, Union[ModuleType, str]] = {}


def triton_runs_on(device: torch.device) -> bool:
    """Triton's kernels run on ``device``: a CUDA device, or any under Triton's interpreter."""
    return device.type == "cuda" or os.environ.get("TRITON_INTERPRET") == "1"


def optional_module(name: str) -> Tuple[Union[ModuleType, None], str]:
    """The module ``name`` of an optional library and ``""``, or None and why it could not be imported (not
    installed, or failing at its import: a Triton too old for it, say); imported once per process."""
    if name not in _IMPORTED:
        try:
            _IMPORTED[name] = importlib.import_module(name)
        except Exception as error:  # noqa: BLE001 (whatever a library raises at import, the explicit path is right)
            _IMPORTED[name] = f"{type(error).__name__}: {next(iter(str(error).splitlines()), '')}"
    found = _IMPORTED[name]
    return (found, "") if isinstance(found, ModuleType) else (None, found)
