"""A progress bar on standard error for the runs of a command: done / total, the last run and its time, and an
estimate of the time left (written in place on a terminal, a line per run elsewhere)."""

import sys
import time
from typing import TextIO


class Progress:
    def __init__(self, total: int, stream: TextIO = sys.stderr, width: int = 24):
        self.total, self.done, self.stream, self.width = total, 0, stream, width
        self.start = time.monotonic()
        self.terminal = stream.isatty()

    def advance(self, what: str) -> None:
        self.done += 1
        elapsed = time.monotonic() - self.start
        left = elapsed / self.done * (self.total - self.done)
        filled = round(self.width * self.done / max(1, self.total))
        bar = "#" * filled + "." * (self.width - filled)
        line = f"[{bar}] {self.done}/{self.total} runs, {format_seconds(left)} left; {what}"
        self.stream.write(("\r\x1b[K" + line) if self.terminal else line + "\n")
        self.stream.flush()

    def close(self) -> None:
        if self.terminal and self.done:
            self.stream.write("\n")
        self.stream.flush()


def format_seconds(seconds: float) -> str:
    minutes, second = divmod(int(seconds), 60)
    hours, minute = divmod(minutes, 60)
    return f"{hours}h{minute:02d}m" if hours else f"{minute}m{second:02d}s"
