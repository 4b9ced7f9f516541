"""The recipe's outputs: one ``results.json`` per run, then ``results.json`` and ``results.md`` over all runs
(perplexity per method and evaluation length, mean ± sd over the seeds, one table per mode). Every file is
written under a temporary name and renamed, so an interrupted run never leaves a half-written one."""

import json
import os
import statistics
from pathlib import Path
from typing import Dict, List, Sequence

Record = Dict[str, object]


def write_atomically(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    part = path.with_name(path.name + ".part")
    part.write_text(text, encoding="utf-8")
    os.replace(part, path)


def write_json(path: Path, value: object) -> None:
    write_atomically(path, json.dumps(value, indent=1) + "\n")


def read_records(path: Path) -> List[Record]:
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def mean_sd(values: Sequence[float]) -> str:
    """``mean ± sd`` (the sample standard deviation) of several seeds, the value alone of one."""
    if len(values) == 1:
        return f"{values[0]:.1f}"
    return f"{statistics.mean(values):.1f} ± {statistics.stdev(values):.1f}"


def cell(records: List[Record]) -> str:
    """A table cell: the seeds' perplexities, or why there is none (``refuses``)."""
    ok = [float(r["ppl"]) for r in records if r["status"] == "ok"]
    if ok:
        return mean_sd(ok)
    return "refuses" if any(r["status"] == "refused" for r in records) else "-"


def markdown_table(records: List[Record], methods: Sequence[str], lengths: Sequence[int], mode: str) -> str:
    """One mode's table: a row per method, a column per evaluation length."""
    lines = [f"| method | {' | '.join(f'L={length}' for length in lengths)} | seeds |",
             "|---|" + "---:|" * len(lengths) + "---:|"]
    for method in methods:
        mine = [r for r in records if r["method"] == method and r["mode"] == mode]
        cells = [cell([r for r in mine if r["length"] == length]) for length in lengths]
        seeds = len({r["seed"] for r in mine})
        lines.append(f"| {method} | {' | '.join(cells)} | {seeds} |")
    return "\n".join(lines)


def markdown(records: List[Record], methods: Sequence[str], lengths: Sequence[int], modes: Sequence[str],
             train_length: int) -> str:
    """results.md: validation perplexity (exp of the mean token NLL) per mode."""
    parts = [f"# Plain-PyTorch length extrapolation: trained on {train_length} tokens\n",
             "Validation perplexity, mean ± sd over the seeds.\n"]
    for mode in modes:
        parts += [f"## {mode}\n", markdown_table(records, methods, lengths, mode), ""]
    return "\n".join(parts) + "\n"
