"""Step 2: the short trainings of every family in every precision, on one device and on all of them; each
checked from its log and scored from its checkpoint in a fresh process; the loss curves drawn."""

import math
import shutil
import socket
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, List, Optional, Sequence, Tuple

from posattn_tools.gpu_check.context import Context, Row
from posattn_tools.gpu_check.corpora import Corpora, prepare_corpora
from posattn_tools.gpu_check.settings import (FAMILIES_BY_NAME, LANGUAGE_MODELING, LOSS_TOLERANCE, PRECISION_FLAGS, SRC,
                                              TGT, USER_DIR, Family)
from posattn_tools.runs import (CommandError, eval_lm_perplexity, overflow_count, read_log, run, run_together,
                                side_flags, tool, validation_points)


@dataclass(frozen=True)
class TrainRun:
    """One short training: a family in one precision on one device or on ``devices`` of them."""

    family: Family
    precision: str
    devices: int = 1

    @property
    def name(self) -> str:
        return f"{self.family.name}-{self.precision}" + (f"-x{self.devices}" if self.devices > 1 else "")

    @property
    def label(self) -> str:
        return self.precision + (f", {self.devices} devices" if self.devices > 1 else "")


@dataclass
class TrainResult:
    """What a training and its evaluation gave: the report row and the validation-loss points."""

    run: TrainRun
    row: Row
    log: Optional[Path] = None
    points: List[Tuple[float, float]] = field(default_factory=list)
    #: sacreBLEU's signature of a translation run's BLEU
    signature: str = ""


def model_flags(ctx: Context, family: Family) -> List[str]:
    """Architecture, sizes and position flags of ``family`` at the check's scale."""
    s = ctx.scale
    if family.is_lm:
        return ["--arch", family.arch, *side_flags(("decoder",), {
            "embed-dim": s.lstm_dim, "hidden-size": s.lstm_dim, "out-embed-dim": s.lstm_dim, "layers": 2}),
            "--share-decoder-input-output-embed", *family.flags]
    sizes = side_flags(("encoder", "decoder"), {"layers": s.layers, "embed-dim": s.embed_dim,
                                                "ffn-embed-dim": s.ffn_dim, "attention-heads": s.heads})
    return ["--arch", family.arch, *sizes, "--share-all-embeddings", "--max-source-positions", "128",
            "--max-target-positions", "128", *family.flags]


#: the LM's data flags, for training and for fairseq-eval-lm: blocks of 35 tokens (Dagan's normalizer N)
LM_DATA_FLAGS = ("--tokens-per-sample", "35", "--max-target-positions", "35")


def train_command(ctx: Context, run_: TrainRun, corpora: Corpora, save_dir: Path) -> List[str]:
    """The ``fairseq-train`` command of ``run_`` (validating every ``validate_every`` updates and at
    the end only; the last checkpoint is the one scored). The batch of one update is the same on any
    number of devices: each takes its share."""
    s, family = ctx.scale, run_.family
    if family.is_lm:
        data = [str(corpora.lm), "--task", LANGUAGE_MODELING, *LM_DATA_FLAGS,
                "--batch-size", str(max(1, s.lm_batch_size // run_.devices)), "--clip-norm", "0.25"]
    else:
        data = [str(corpora.translation), "--task", family.task, "--source-lang", SRC, "--target-lang", TGT,
                "--criterion", "label_smoothed_cross_entropy", "--label-smoothing", "0.1",
                "--max-tokens", str(s.max_tokens // run_.devices)]
    schedule = (["--lr-scheduler", "inverse_sqrt", "--warmup-updates", str(s.warmup), "--warmup-init-lr", "1e-07"]
                if s.warmup else [])
    return [
        tool("fairseq-train"), *data, "--user-dir", str(USER_DIR), *model_flags(ctx, family), "--dropout", "0.1",
        "--optimizer", "adam", "--adam-betas", "(0.9, 0.98)", "--lr", str(s.lr), *schedule,
        "--max-update", str(s.max_update), "--validate-interval-updates", str(s.validate_every),
        "--validate-interval", "1000000", "--save-interval", "1000000", "--no-epoch-checkpoints",
        "--save-dir", str(save_dir), "--seed", "1", "--num-workers", "0", "--required-batch-size-multiple", "1",
        "--log-format", "simple", "--log-interval", str(max(1, s.validate_every // 2)),
        *PRECISION_FLAGS[run_.precision], *ctx.device_flags(),
    ]


def free_port() -> int:
    """A TCP port that nothing listens on now (for the gloo processes' rendezvous)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def train(ctx: Context, run_: TrainRun, corpora: Corpora, slot: int) -> Path:
    """Run the training; returns its log (rank 0's for several devices). Several GPUs: fairseq's own
    spawn with NCCL and ``--ddp-backend pytorch_ddp``; several CPU processes: launched here, gloo."""
    save_dir = ctx.output / "checkpoints" / run_.name
    shutil.rmtree(save_dir, ignore_errors=True)
    command = train_command(ctx, run_, corpora, save_dir)
    log = ctx.logs / "train" / f"{run_.name}.log"
    timeout = ctx.cli.timeout
    if run_.devices == 1:
        run(command, log, ctx.env(slot), timeout)
        return log
    distributed = ["--distributed-world-size", str(run_.devices), "--ddp-backend", ctx.cli.ddp_backend]
    if ctx.machine.kind == "cuda":
        run([*command, *distributed, "--distributed-backend", "nccl"], log, ctx.env(), timeout)
        return log
    port = free_port()
    ranks = [[*command, *distributed, "--distributed-backend", "gloo", "--distributed-no-spawn",
              "--distributed-init-method", f"tcp://127.0.0.1:{port}", "--distributed-rank", str(rank)]
             for rank in range(run_.devices)]
    logs = [log] + [log.with_name(f"{run_.name}.rank{rank}.log") for rank in range(1, run_.devices)]
    run_together(ranks, logs, ctx.env(), timeout)
    return log


def evaluate(ctx: Context, run_: TrainRun, corpora: Corpora, slot: int) -> Tuple[str, str]:
    """BLEU and its sacreBLEU signature, or test perplexity (and no signature), of the run's last
    checkpoint, in a fresh process."""
    checkpoint = ctx.output / "checkpoints" / run_.name / "checkpoint_last.pt"
    log = ctx.logs / "evaluate" / f"{run_.name}.log"
    if run_.family.is_lm:
        text = run([tool("fairseq-eval-lm"), str(corpora.lm), "--user-dir", str(USER_DIR), "--path", str(checkpoint),
                    "--gen-subset", "test", *LM_DATA_FLAGS, "--max-tokens", "4096", "--num-workers", "0",
                    *ctx.device_flags()], log, ctx.env(slot), ctx.cli.timeout)
        perplexity = eval_lm_perplexity(text)
        if perplexity is None:
            raise CommandError(f"fairseq-eval-lm printed no perplexity (log: {log})")
        return f"test ppl {perplexity:.1f}", ""
    from fairseq_posattn.data.generate_output import score_generate_output

    hypotheses = ctx.output / "generate" / f"{run_.name}.txt"
    hypotheses.parent.mkdir(parents=True, exist_ok=True)
    text = run([tool("fairseq-generate"), str(corpora.translation), "--user-dir", str(USER_DIR),
                "--task", run_.family.task, "--source-lang", SRC, "--target-lang", TGT, "--path", str(checkpoint),
                "--gen-subset", "test", "--beam", "5", "--max-len-a", "1.2", "--max-len-b", "10", "--remove-bpe",
                "--batch-size", "128", "--required-batch-size-multiple", "1", *ctx.device_flags()],
               log, ctx.env(slot), ctx.cli.timeout)
    hypotheses.write_text(text, encoding="utf-8")
    bleu = score_generate_output(str(hypotheses), str(corpora.reference), TGT)
    return f"BLEU {bleu.score:.2f}", bleu.signature


def train_and_evaluate(ctx: Context, run_: TrainRun, corpora: Corpora, slot: int) -> TrainResult:
    """Train, check the validation losses, evaluate; every failure becomes a FAILED row."""
    if run_.devices == 1:
        device = ctx.single_device()
    elif ctx.machine.kind == "cuda":
        device = f"{run_.devices} x cuda (NCCL)"
    else:
        device = f"cpu, {run_.devices} processes (gloo)"
    setting = " ".join(PRECISION_FLAGS[run_.precision]) or "fp32"
    if run_.devices > 1:
        setting += f", {run_.devices} devices, --ddp-backend {ctx.cli.ddp_backend}"
    row = Row(f"train {run_.family.label}", device, setting, "FAILED")
    result = TrainResult(run_, row)
    started = time.monotonic()
    try:
        result.log = train(ctx, run_, corpora, slot)
        result.points = validation_points(result.log)
        seconds = time.monotonic() - started
        losses = [loss for _, loss in result.points]
        trend = f"valid loss {losses[0]:.2f} -> {losses[-1]:.2f} ({int(result.points[-1][0])} updates)"
        overflows = overflow_count(read_log(result.log))
        skipped = f", {overflows} overflow skip{'s' * (overflows != 1)}" if run_.precision in ("fp16", "amp") else ""
        if not all(math.isfinite(loss) for loss in losses):
            row.numbers = f"{trend}: not finite{skipped}"
            return result
        if losses[-1] > losses[0] - LOSS_TOLERANCE:
            row.numbers = f"{trend}: did not fall{skipped}"
            return result
        score, result.signature = evaluate(ctx, run_, corpora, slot)
        row.result = "passed"
        row.numbers = f"{trend}; {score}; train {seconds:.0f} s{skipped}"
    except (CommandError, FileNotFoundError, ValueError) as error:
        row.numbers = str(error)
    return result


def draw_curves(ctx: Context, results: Sequence[TrainResult]) -> List[Path]:
    """One PNG per family: the validation loss of each of its runs against updates."""
    from fairseq_posattn.inspect.learning_curves import Curve, CurveGroup, draw

    pictures = []
    for family in dict.fromkeys(result.run.family for result in results):
        groups = [CurveGroup(result.run.label, [Curve(str(result.log), result.points)])
                  for result in results if result.run.family == family and result.points]
        if not groups:
            continue
        picture = ctx.output / f"loss-{family.name}.png"
        draw(groups, "loss", "num_updates", "valid", str(picture),
             title=f"{family.label}: validation loss ({ctx.machine.kind})")
        pictures.append(picture)
    return pictures


def training_runs(ctx: Context) -> Tuple[List[TrainRun], List[TrainRun]]:
    """The one-device runs (every family in every precision) and the all-devices runs (every family
    in the first precision) when the step is on and there is more than one device."""
    families = [FAMILIES_BY_NAME[name] for name in ctx.cli.families]
    single = [TrainRun(family, precision) for family in families for precision in ctx.precisions]
    multi = []
    if "multi" not in ctx.cli.skip and ctx.machine.count > 1:
        multi = [TrainRun(family, ctx.precisions[0], ctx.machine.count) for family in families]
    return single, multi


def one_device_note(ctx: Context) -> List[Row]:
    """A skipped row for the all-devices step where only one GPU is visible."""
    if "multi" in ctx.cli.skip or "train" in ctx.cli.skip or ctx.machine.count > 1:
        return []
    return [Row("train on all devices", ctx.single_device(), f"--ddp-backend {ctx.cli.ddp_backend}", "skipped",
                "one GPU visible: nothing to distribute")]


def training_step(ctx: Context, pool: ThreadPoolExecutor, log: Callable[[str], None]) -> List[TrainResult]:
    """Prepare the samples, train and evaluate every one-device run (``jobs`` at a time), then the
    all-devices runs one after the other (each takes every device)."""
    single, multi = training_runs(ctx)
    if not single and not multi:
        return []
    log("preparing the Multi30k and PTB samples")
    corpora = prepare_corpora(ctx, pool)
    log(f"training {len(single)} one-device runs, {ctx.jobs} at a time")
    futures = [pool.submit(train_and_evaluate, ctx, run_, corpora, slot) for slot, run_ in enumerate(single)]
    results = [future.result() for future in futures]
    for run_ in multi:
        log(f"training {run_.name} on {run_.devices} devices")
        results.append(train_and_evaluate(ctx, run_, corpora, 0))
    return results

