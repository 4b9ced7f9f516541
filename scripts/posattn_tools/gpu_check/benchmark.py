"""Steps 4 and 5: ``scripts/posattn_benchmark`` on the device (train-step time and memory ratios, beam-search
speed) and its long language-model blocks; its report's rows become the check's."""

import sys
from pathlib import Path
from typing import Dict, List, Mapping, Optional, Sequence

from posattn_tools.gpu_check.context import Context, Row
from posattn_tools.gpu_check.settings import BENCHMARK
from posattn_tools.runs import CommandError, run


def markdown_tables(text: str) -> List[List[Dict[str, str]]]:
    """Every table of a markdown text as rows of ``{header: cell}``; a bold first cell (a row group's
    title) is put into the following rows as ``group``."""
    tables: List[List[Dict[str, str]]] = []
    header: Optional[List[str]] = None
    group = ""
    for line in text.splitlines() + [""]:
        if not line.startswith("|"):
            header = None
            continue
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if header is None:
            header, group = cells, ""
            tables.append([])
        elif set(line) <= set("|-: "):
            continue
        elif cells[0].startswith("**"):
            group = cells[0].strip("*")
        else:
            tables[-1].append({"group": group, **dict(zip(header, cells))})
    return tables


def benchmark_rows(report: str, device: str) -> List[Row]:
    """The benchmark report's train-step and beam-search rows as check rows."""
    rows = []
    for table in markdown_tables(report):
        for cells in table:
            if "time ratio" in cells:
                check = f"benchmark train step: {cells['variant']}"
                numbers = (f"time ratio {cells['time ratio'] or '-'}, memory ratio {cells['memory ratio'] or '-'}; "
                           f"{cells['step time (ms)']} ms, {cells['peak memory (MB)']} MB")
            elif "speed ratio" in cells:
                check = f"benchmark beam search: {cells['variant']}"
                numbers = f"speed ratio {cells['speed ratio'] or '-'}; {cells['sentences/s']} sentences/s"
            else:
                continue
            target = cells.get("target", "")
            crashed = any("crashed" in value for value in cells.values())
            result = ("FAILED" if crashed else "MISSED" if "MISSED" in target else "met" if "met" in target
                      else "measured")
            if target:
                numbers += f"; target {target.split(':')[0]}"
            rows.append(Row(check, device, cells["group"], result, numbers))
    return rows


def benchmark_command(device: str, args: Sequence[str], output: Path) -> List[str]:
    """``scripts/posattn_benchmark`` on ``device`` with ``args``, its report into ``output`` (the structural
    prepare timing skipped, glibc told to reuse freed memory as CUDA's allocator does)."""
    return [sys.executable, str(BENCHMARK), "--device", device, "--skip-prepare", "--malloc", "reuse", *args,
            "--output", str(output)]


def run_benchmark(device: str, args: Sequence[str], output: Path, log: Path, env: Mapping[str, str],
                  timeout: float) -> Optional[str]:
    """Run the benchmark (:func:`benchmark_command`); None once its report is in ``output`` (even if it then
    failed: a crashed variant is a row of the report), else why there is none."""
    try:
        run(benchmark_command(device, args, output), log, env, timeout)
    except CommandError as error:
        if not output.exists():
            return str(error)
    return None


def benchmark_step(ctx: Context) -> List[Row]:
    """``scripts/posattn_benchmark --device <device>`` at the scale's sizes; its report is kept beside ours."""
    device = ctx.machine.kind
    output = ctx.output / "benchmark.md"
    failure = run_benchmark(device, ctx.scale.benchmark_args, output, ctx.logs / "benchmark.log", ctx.env(),
                            ctx.cli.timeout)
    if failure is not None:
        return [Row("benchmark", device, " ".join(ctx.scale.benchmark_args), "FAILED", failure)]
    rows = benchmark_rows(output.read_text(encoding="utf-8"), device)
    return rows or [Row("benchmark", device, "", "FAILED", f"no table in {output}")]


def long_lm_step(ctx: Context) -> List[Row]:
    """The benchmark's language-model blocks groups at the scale's lengths (bf16 on CUDA); its report is
    kept beside ours as ``long-lm.md``."""
    device = ctx.machine.kind
    output = ctx.output / "long-lm.md"
    args = [arg for arg in ctx.scale.long_lm_args if not (device == "cpu" and arg in ("--precision", "bf16"))]
    failure = run_benchmark(device, ["--skip-short", "--lm", "--lm-blocks-only", *args], output,
                            ctx.logs / "long-lm.log", ctx.env(), ctx.cli.timeout)
    if failure is not None:
        return [Row("long LM blocks", device, " ".join(args), "FAILED", failure)]
    rows = [Row(f"long LM blocks, {row.check}", row.device, row.setting, row.result, row.numbers)
            for row in benchmark_rows(output.read_text(encoding="utf-8"), device)]
    return rows or [Row("long LM blocks", device, "", "FAILED", f"no table in {output}")]
