"""The check's outputs: ``report.md`` (what ran where, the table, the loss curves), ``results.json``, and the
output folder emptied of an earlier run's files."""

import json
import platform
import shutil
import time
from dataclasses import asdict
from pathlib import Path
from typing import Dict, List, Sequence

from posattn_tools.gpu_check.context import Context, Row
from posattn_tools.gpu_check.training import TrainResult, draw_curves


def training_lines(ctx: Context, results: Sequence[TrainResult]) -> List[str]:
    """The report's line on the trainings: data, sizes, budget, what passing means, the BLEU signature."""
    s = ctx.scale
    signatures = sorted({result.signature for result in results if result.signature})
    bleu = f"sacreBLEU `{signatures[0]}`" if len(signatures) == 1 else "sacreBLEU"
    return [
        f"- Trainings: the first {s.lines or 'all'} lines of every split of data/multi30k_sample (joint BPE, "
        f"{s.bpe_merges} merges; structural side data from spaCy's parse) and of data/ptb_sample; translation "
        f"models {s.layers}+{s.layers} layers, {s.embed_dim} dim, FFN {s.ffn_dim}, {s.heads} heads, "
        f"{s.max_tokens} tokens per update; the LSTM LM {s.lstm_dim} dim, 2 layers, {s.lm_batch_size} blocks "
        f"of 35 tokens per update (an all-devices run splits the batch over its devices); Adam lr {s.lr}, "
        f"{s.max_update} updates, validation every {s.validate_every}. A run passes when it finishes, every "
        "validation loss is finite and the last is below the first. From the last checkpoint, in a fresh "
        f"process: BLEU (beam 5, detokenized, {bleu}) or test perplexity (fairseq-eval-lm).",
    ]


def render(ctx: Context, rows: Sequence[Row], results: Sequence[TrainResult], pictures: Sequence[Path],
           seconds: float) -> str:
    """The report: what ran where, the table, the loss-curve pictures and where the logs are."""
    import fairseq

    counts: Dict[str, int] = {}
    for row in rows:
        counts[row.result] = counts.get(row.result, 0) + 1
    lines = [
        "# GPU check", "",
        f"- Device: {ctx.machine.describe()}; torch {ctx.machine.torch}, fairseq {fairseq.__version__}, "
        f"Python {platform.python_version()}.",
        f"- Mode: {ctx.scale.name} (`{' '.join(ctx.cli.argv) or 'no options'}`); {seconds / 60:.1f} minutes in "
        f"all, {ctx.jobs} runs at a time; {time.strftime('%Y-%m-%d %H:%M')}.",
        *(training_lines(ctx, results) if results else []),
        "- Results: " + ", ".join(f"{count} {result}" for result, count in sorted(counts.items())) + ".",
        "", "| check | device | setting | result | numbers |", "|---|---|---|---|---|",
        *(row.markdown() for row in rows),
    ]
    if pictures:
        lines += ["", "## Validation loss", ""]
        lines += [f"![{picture.stem}]({picture.name})" for picture in pictures]
    lines += ["", "Logs: `logs/` (one per command); the benchmark's own report: `benchmark.md`; every row as "
              "JSON: `results.json`."]
    return "\n".join(lines) + "\n"



def write_outputs(ctx: Context, rows: Sequence[Row], results: Sequence[TrainResult], seconds: float) -> Path:
    pictures = draw_curves(ctx, results)
    report = ctx.output / "report.md"
    report.write_text(render(ctx, rows, results, pictures, seconds), encoding="utf-8")
    curves = {result.run.name: result.points for result in results}
    (ctx.output / "results.json").write_text(json.dumps(
        {"device": asdict(ctx.machine), "mode": ctx.scale.name, "seconds": round(seconds, 1),
         "rows": [asdict(row) for row in rows], "valid_loss": curves}, indent=1), encoding="utf-8")
    return report


#: what a run writes into its output folder, removed before the next run (fairseq-preprocess refuses
#: an existing dictionary; an old checkpoint or log would be read as this run's)
OUTPUTS = ("data", "checkpoints", "generate", "logs", "report.md", "results.json", "benchmark.md", "pytest.xml")


def reset_output(output: Path) -> None:
    """Create ``output``, or empty it of an earlier run's files (and nothing else)."""
    output.mkdir(parents=True, exist_ok=True)
    for name in OUTPUTS:
        path = output / name
        if path.is_dir():
            shutil.rmtree(path)
        else:
            path.unlink(missing_ok=True)
    for picture in output.glob("loss-*.png"):
        picture.unlink()

