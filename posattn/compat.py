"""What the library asks of torch that its oldest supported release spells otherwise (setup.py declares the
range; docs/install.md's support matrix is the range tested, ``make test-matrix``)."""

from typing import Optional

import torch


def autocast_dtype(device_type: str) -> Optional[torch.dtype]:
    """The dtype that autocast casts fp32 down to on ``device_type`` (``"cpu"``, ``"cuda"``, ...) where autocast is
    enabled there, else None. torch >= 2.4 asks by device (``torch.is_autocast_enabled(device_type)``,
    ``torch.get_autocast_dtype``); torch 2.3 has one query per device (CUDA: ``is_autocast_enabled()``, CPU:
    ``is_autocast_cpu_enabled()``) and no autocast on other devices that the library runs on."""
    if hasattr(torch, "get_autocast_dtype"):
        return torch.get_autocast_dtype(device_type) if torch.is_autocast_enabled(device_type) else None
    if device_type == "cuda":
        return torch.get_autocast_gpu_dtype() if torch.is_autocast_enabled() else None
    if device_type == "cpu":
        return torch.get_autocast_cpu_dtype() if torch.is_autocast_cpu_enabled() else None
    return None
