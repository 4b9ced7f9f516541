"""Step 0: the machine the check runs on (``--device cuda``: its GPUs, or a clear refusal; ``--device cpu``)."""

import os
import platform
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Tuple


@dataclass(frozen=True)
class Machine:
    """The device the check runs on: ``cuda`` with its GPUs, or ``cpu``."""

    kind: str
    gpus: Tuple[str, ...]
    torch: str
    cuda: Optional[str]

    @property
    def count(self) -> int:
        """Devices for the all-devices step: the GPUs, or two gloo processes on a CPU."""
        return len(self.gpus) if self.kind == "cuda" else 2

    def describe(self) -> str:
        if self.kind == "cpu":
            return f"CPU ({cpu_name()}, {os.cpu_count()} cores)"
        names = sorted(set(self.gpus))
        return f"{len(self.gpus)} x {', '.join(names)} (CUDA {self.cuda})"


def cpu_name() -> str:
    """The CPU's model name (``/proc/cpuinfo``), else ``platform.processor()``."""
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


class NoDevice(RuntimeError):
    """The device asked for is not there; the message says what to do."""


def detect_machine(kind: str) -> Machine:
    """The machine for ``--device kind``; raises :class:`NoDevice` where CUDA is asked for and torch
    sees none."""
    import torch

    if kind == "cpu":
        return Machine("cpu", (), torch.__version__, None)
    if not torch.cuda.is_available():
        raise NoDevice(
            f"gpu_check: no CUDA device: torch {torch.__version__} (built for CUDA {torch.version.cuda}) "
            "sees no GPU (torch.cuda.is_available() is False). Run `make gpu-check` on a machine with an "
            "NVIDIA GPU and a CUDA build of torch; on a CPU, `python scripts/gpu_check.py --device cpu "
            "--tiny` runs the smoke version of every step.")
    gpus = tuple(torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count()))
    return Machine("cuda", gpus, torch.__version__, torch.version.cuda)


def cpu_supports_bf16() -> bool:
    """Whether torch runs a bfloat16 linear layer forward and backward on this CPU."""
    import torch

    try:
        layer = torch.nn.Linear(8, 8).to(torch.bfloat16)
        layer(torch.ones(2, 8, dtype=torch.bfloat16)).sum().backward()
    except RuntimeError:
        return False
    return True
