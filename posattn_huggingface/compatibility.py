"""The transformers and torch releases this front-end takes: the ranges of setup.py's extra ``hf``, which
``make test-matrix`` tests at both ends (docs/install.md, "Tested versions"; tests/test_support_matrix.py checks that
the ranges here are setup.py's). Importing ``posattn_huggingface`` beside a transformers outside its range, without
transformers, or beside an older torch, fails in one line naming the range and the install that fixes it. And the
differences within the range that the front-end bridges: the cache's keyword (here) and, before 5.24, ``generate``'s
``contiguous()`` of a static cache's mask (``mask_function.BatchPositions.contiguous``)."""

from importlib import metadata
from typing import Any, Mapping, Optional, Tuple

import torch

from posattn.errors import UserError

#: the oldest transformers release taken and the first release refused: the extra ``hf``. 5.0 to 5.3 hand the mask
#: function ``cache_position`` where later releases hand ``q_length`` and ``q_offset`` (89 of
#: tests/test_huggingface.py's 116 tests fail there); 5.4 to 5.12's prompt-lookup decoding fails inside transformers
#: (``isin`` of None)
TRANSFORMERS_RANGE: Tuple[str, str] = ("5.13", "6")
#: the oldest torch taken (the extra ``hf``): transformers turns PyTorch off below 2.4 (5.4 to 5.20) or 2.6 (5.21 on),
#: and below 2.10 dynamo cannot compile transformers' models for the static cache's generation
TORCH_MINIMUM = "2.10"
#: the keyword by which transformers hands a model and its self-attention modules the cache: ``cache`` from 5.24
#: on (which still takes ``past_key_values``, deprecated), ``past_key_values`` before; GPT-NeoX's modules take it as
#: ``layer_past``
CACHE_KEYWORDS = ("cache", "past_key_values", "layer_past")


class TransformersVersionError(UserError, ImportError):
    """transformers is missing or outside :data:`TRANSFORMERS_RANGE`, or torch is older than :data:`TORCH_MINIMUM`."""


def release(version: str) -> Tuple[int, ...]:
    """The release numbers of a version string (``"5.24.0"`` -> ``(5, 24, 0)``; ``"5.3.0.dev0"`` -> ``(5, 3, 0)``,
    ``"2.3.0+cu121"`` -> ``(2, 3, 0)``)."""
    numbers = []
    for part in version.split("+")[0].split("."):
        if not part.isdigit():
            break
        numbers.append(int(part))
    return tuple(numbers)


def require_versions(transformers: Optional[str] = None, torch_version: str = torch.__version__) -> None:
    """Raises :class:`TransformersVersionError` unless ``transformers`` (by default the installed distribution's
    version, read without importing it) lies in :data:`TRANSFORMERS_RANGE` and ``torch_version`` is at least
    :data:`TORCH_MINIMUM`."""
    oldest, refused = TRANSFORMERS_RANGE
    wanted = f"transformers>={oldest},<{refused}"
    if transformers is None:
        try:
            transformers = metadata.version("transformers")
        except metadata.PackageNotFoundError:
            raise TransformersVersionError(f"posattn_huggingface needs {wanted}, and transformers is not installed: "
                                           "pip install 'fairseq-posattn[hf]'") from None
    if not release(oldest) <= release(transformers) < release(refused):
        raise TransformersVersionError(f"posattn_huggingface needs {wanted} (the releases tested, docs/install.md), "
                                       f"not transformers {transformers}: pip install '{wanted}'")
    if release(torch_version) < release(TORCH_MINIMUM):
        raise TransformersVersionError(f"posattn_huggingface needs torch>={TORCH_MINIMUM} (the releases tested, "
                                       f"docs/install.md), not torch {torch_version}: "
                                       f"pip install 'torch>={TORCH_MINIMUM}'")


def cache_keyword() -> str:
    """The keyword of a model's ``forward`` that takes the cache in the installed transformers."""
    return CACHE_KEYWORDS[0] if release(metadata.version("transformers")) >= (5, 24) else CACHE_KEYWORDS[1]


def cache_argument(kwargs: Mapping[str, Any]) -> Any:
    """The cache among a self-attention module's keyword arguments (:data:`CACHE_KEYWORDS`), or None."""
    return next((kwargs[name] for name in CACHE_KEYWORDS if kwargs.get(name) is not None), None)
