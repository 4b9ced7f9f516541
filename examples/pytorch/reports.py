"""The recipe's outputs: one ``results.json`` per run, then ``results.json`` and ``results.md`` over all runs
(perplexity per method and evaluation length, mean ± sd over the seeds, one table per mode). Every file is
written under a temporary name and renamed, so an interrupted run never leaves a half-written one."""

import json
import os
import statistics
import sys
from pathlib import Path
from typing import Dict, List, Sequence

sys.path.insert(1, str(Path(__file__).resolve().parents[2] / "scripts"))  # the tools' reader of JSON files, by name
from posattn_tools.json_files import read_json  # noqa: E402

Record = Dict[str, object]


def write_atomically(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    part = path.with_name(path.name + ".part")
    part.write_text(text, encoding="utf-8")
    os.replace(part, path)


def write_json(path: Path, value: object) -> None:
    write_atomically(path, json.dumps(value, indent=1) + "\n")


def read_records(path: Path) -> List[Record]:
    """A run's ``results.json``; a damaged one stops the command in one line naming it (delete its folder to redo
    that run)."""
    return read_json(path, f"delete its folder {path.parent} to redo that run", list)  # type: ignore[return-value]


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
             train_length: int, recipe: str = "Plain-PyTorch") -> str:
    """results.md: validation perplexity (exp of the mean token NLL) per mode; ``recipe`` names the recipe in the
    title."""
    parts = [f"# {recipe} length extrapolation: trained on {train_length} tokens\n",
             "Validation perplexity, mean ± sd over the seeds.\n"]
    for mode in modes:
        parts += [f"## {mode}\n", markdown_table(records, methods, lengths, mode), ""]
    return "\n".join(parts) + "\n"


def write_reports(out: Path, results: Sequence[Path], methods: Sequence[str], lengths: Sequence[int],
                  modes: Sequence[str], train_length: int, recipe: str = "Plain-PyTorch") -> None:
    """``OUT/results.json``, every run's records (``results``: the runs' files), and ``OUT/results.md``, their
    tables (:func:`markdown`), each written under a temporary name and renamed."""
    records = [record for path in results for record in read_records(path)]
    write_json(out / "results.json", records)
    write_atomically(out / "results.md", markdown(records, methods, lengths, modes, train_length, recipe=recipe))
    print(f"==> {out / 'results.md'}, {out / 'results.json'}")
