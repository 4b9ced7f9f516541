"""What every step reads and writes: the :class:`Context` (options, machine, scale, output folders, the
environment of its commands) and the report's :class:`Row`."""

import argparse
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Optional, Tuple

from posattn_tools.gpu_check.machine import Machine
from posattn_tools.gpu_check.settings import Scale
from posattn_tools.runs import tool_env


@dataclass
class Row:
    """One line of the report's table. ``result``: passed, FAILED, skipped, met, MISSED, measured."""

    check: str
    device: str
    setting: str
    result: str
    numbers: str = ""

    def markdown(self) -> str:
        cells = (self.check, self.device, self.setting, self.result, self.numbers)
        return "| " + " | ".join(cell.replace("|", "\\|").replace("\n", " ") for cell in cells) + " |"


@dataclass
class Context:
    """What every step reads: the options, the machine, the scale and the output folders."""

    cli: argparse.Namespace
    machine: Machine
    scale: Scale
    precisions: Tuple[str, ...]
    output: Path
    jobs: int

    @property
    def logs(self) -> Path:
        return self.output / "logs"

    @property
    def data(self) -> Path:
        return self.output / "data"

    def device_flags(self) -> Tuple[str, ...]:
        return ("--cpu",) if self.machine.kind == "cpu" else ()

    def single_device(self) -> str:
        return "cpu" if self.machine.kind == "cpu" else f"cuda ({self.machine.gpus[0]})"

    def env(self, slot: Optional[int] = None) -> Dict[str, str]:
        """The environment of a command: the virtualenv's bin first on PATH, its share of the CPU
        threads and, given a ``slot``, one GPU (round-robin over the visible ones); without a slot
        every visible GPU."""
        env = tool_env({"OMP_NUM_THREADS": str(max(1, (os.cpu_count() or 1) // self.jobs))})
        if self.machine.kind == "cuda" and slot is not None:
            visible = os.environ.get("CUDA_VISIBLE_DEVICES")
            ids = visible.split(",") if visible else [str(i) for i in range(len(self.machine.gpus))]
            env["CUDA_VISIBLE_DEVICES"] = ids[slot % len(ids)]
        return env
