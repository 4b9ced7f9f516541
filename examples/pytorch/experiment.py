"""One run of the recipe (a method and a seed): train on blocks of the training length, then score the
evaluation split in every mode at every length; its records go to ``OUT/<method>/seed<N>/results.json``, its
log to ``train.log`` and its command, budget, wall time and commit to ``run.json`` beside it (the fields of the
evidence runs' ``run.json``). A run whose ``results.json`` exists is finished and is not redone."""

import argparse
import datetime
import shlex
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Union

import torch

from data import PAD, Corpus, load_corpus, training_blocks
from evaluation import MODES, evaluate
from methods import side_options
from model import ModelSize, PositionLM
from posattn.errors import UserError
from reports import Record, write_atomically, write_json, write_reports
from training import Budget, train

RESULTS_FILE = "results.json"
LOG_FILE = "train.log"
RUN_FILE = "run.json"


@dataclass
class Protocol:
    """What the recipe measures: the training length, the evaluation lengths and modes, the tokens per
    evaluation batch (fairseq-eval-lm's ``--max-tokens``)."""

    train_length: int = 64
    lengths: Sequence[int] = (64, 128, 256, 512, 1024)
    modes: Sequence[str] = ("nonoverlapping", "sliding")
    eval_tokens: int = 8192


def budget_text(size: ModelSize, budget: Budget, protocol: Protocol) -> str:
    """The run's budget in words, as the evidence runs' ``run.json`` states theirs."""
    lengths = ", ".join(str(length) for length in protocol.lengths)
    return (f"one token stream cut into blocks of {protocol.train_length} tokens; {budget.updates} updates of "
            f"{budget.batch_size} blocks ({size.layers} post-norm layers x {size.dim}, FFN {size.ffn_dim}, "
            f"{size.heads} heads; tied embeddings; dropout {size.dropout}); Adam betas (0.9, 0.98), lr {budget.lr}, "
            f"inverse sqrt, {budget.warmup_updates} warm-up updates from {budget.warmup_init_lr}, clip-norm "
            f"{budget.clip_norm}; the evaluation split at L = {lengths} tokens, {' and '.join(protocol.modes)}")


def commit() -> Optional[str]:
    """The short hash of the checkout this file lies in, None outside git."""
    try:
        result = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                cwd=Path(__file__).parent, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    return result.stdout.strip() if result.returncode == 0 else None


def now() -> str:
    return datetime.datetime.now().isoformat(timespec="seconds")


def run_dir(out: Path, method: str, seed: int) -> Path:
    return out / method / f"seed{seed}"


def build_model(corpus: Corpus, method: str, size: ModelSize, protocol: Protocol, seed: int) -> PositionLM:
    torch.manual_seed(seed)
    options = side_options(method, protocol.train_length, max(protocol.lengths))
    return PositionLM(len(corpus.dictionary), PAD, size, options)


def score(model: torch.nn.Module, corpus: Corpus, protocol: Protocol, base: Record,
          log: Callable[[str], None]) -> List[Record]:
    """A record per mode and length: ``ok`` with the perplexity, or ``refused`` with the model's one line.
    ``model``: tokens to next-token logits, as :func:`evaluation.evaluate` takes it."""
    records = []
    for mode in protocol.modes:
        for length in protocol.lengths:
            record = dict(base, mode=mode, length=length)
            try:
                result = evaluate(model, corpus.valid, mode, length, protocol.eval_tokens)
            except UserError as error:
                record.update(status="refused", error=str(error))
                log(f"{mode} L={length}: refused: {error}")
            else:
                record.update(status="ok", ppl=result["ppl"], loss=result["loss"], tokens=result["tokens"],
                              wall_seconds=round(result["seconds"], 3))
                log(f"{mode} L={length}: ppl {result['ppl']:.2f} | loss {result['loss']:.4f} | tokens "
                    f"{result['tokens']} | {result['seconds']:.1f} s")
            records.append(record)
    return records


class RunLog:
    """A run's log: every line printed as it comes, after the run's method and seed, and kept for its train.log."""

    def __init__(self, method: str, seed: int):
        self.prefix = f"{method} seed {seed} | "
        self.lines: List[str] = []

    def __call__(self, line: str) -> None:
        line = self.prefix + line
        print(line, flush=True)
        self.lines.append(line)


def finished_results(folder: Path, method: str, seed: int) -> Optional[Path]:
    """The run's ``results.json`` if it exists (the run is finished and is not redone; said in one line)."""
    results = folder / RESULTS_FILE
    if not results.is_file():
        return None
    print(f"{method} seed {seed}: finished already ({results})", flush=True)
    return results


def write_run(folder: Path, log: RunLog, description: Dict[str, object], records: List[Record]) -> Path:
    """Writes the run's ``train.log``, its ``run.json`` (``description``: :func:`describe_run`) and, last, its
    ``results.json``, whose presence marks the run finished; returns that file."""
    write_atomically(folder / LOG_FILE, "\n".join(log.lines) + "\n")
    write_json(folder / RUN_FILE, description)
    write_json(folder / RESULTS_FILE, records)
    return folder / RESULTS_FILE


def describe_run(method: str, seed: int, command: str, budget: str, started: str, seconds: float,
                 settings: Dict[str, object]) -> Dict[str, object]:
    """A run's ``run.json``: the fields of the evidence runs' (one finished attempt)."""
    return {"id": f"{method}/seed{seed}", "system": method, "seed": seed, "command": command, "commit": commit(),
            "budget": budget, "seconds": seconds, "recorded": now(),
            "attempts": [{"start": started, "end": now(), "seconds": seconds, "outcome": "finished", "returncode": 0}],
            "settings": settings}


@dataclass
class Run:
    """One run under way: its folder, log and start (:func:`begin_run`), then :meth:`finish`."""

    method: str
    seed: int
    folder: Path
    log: RunLog
    started: str
    clock: float

    def introduce(self, params: int, corpus: Corpus) -> None:
        self.log(f"{params} parameters, vocabulary {len(corpus.dictionary)}, {corpus.train.numel()} training tokens, "
                 f"{corpus.valid.numel()} evaluation tokens")

    def finish(self, model: Callable[[torch.Tensor], torch.Tensor], params: int, train_seconds: float,
               corpus: Corpus, protocol: Protocol, command: str, budget: str, settings: Dict[str, object]) -> Path:
        """Scores the trained ``model`` (token ids to logits) and writes the run's files; returns its
        ``results.json``. ``budget``: the run's budget in words; ``settings``: its sizes and budget."""
        self.log(f"done training in {train_seconds:.1f} seconds")
        scoring_start = time.perf_counter()
        base: Record = {"method": self.method, "seed": self.seed, "params": params,
                        "train_seconds": round(train_seconds, 3)}
        records = score(model, corpus, protocol, base, self.log)
        self.log(f"done scoring in {time.perf_counter() - scoring_start:.1f} seconds")
        seconds = round(time.perf_counter() - self.clock, 1)
        description = describe_run(self.method, self.seed, command, budget, self.started, seconds,
                                   dict(settings, protocol=asdict(protocol)))
        return write_run(self.folder, self.log, description, records)


def begin_run(out: Path, method: str, seed: int) -> Union[Path, Run]:
    """The run's ``results.json`` where it is finished (it is not redone), else the :class:`Run` that starts."""
    folder = run_dir(out, method, seed)
    results = finished_results(folder, method, seed)
    if results is not None:
        return results
    folder.mkdir(parents=True, exist_ok=True)
    return Run(method, seed, folder, RunLog(method, seed), now(), time.perf_counter())


def run(corpus: Corpus, method: str, seed: int, size: ModelSize, budget: Budget, protocol: Protocol,
        out: Path, command: str) -> Path:
    """Trains and scores one model unless its results exist; returns its ``results.json``. ``command``: the
    command line that runs it, for its ``run.json``."""
    started = begin_run(out, method, seed)
    if isinstance(started, Path):
        return started
    model = build_model(corpus, method, size, protocol, seed)
    started.introduce(model.parameter_count(), corpus)
    inputs, targets = training_blocks(corpus.train, protocol.train_length)
    train_seconds = train(model, inputs, targets, budget, seed, started.log)
    return started.finish(model, model.parameter_count(), train_seconds, corpus, protocol, command,
                          budget_text(size, budget, protocol), {"size": asdict(size), "budget": asdict(budget)})


#: one run of a recipe: (corpus, method, seed, model size, budget, protocol, output folder, command) -> its results
RunOne = Callable[[Corpus, str, int, Any, Budget, Protocol, Path, str], Path]


def run_recipe(args: argparse.Namespace, argv: List[str], size: Any, run_one: RunOne, seeds_first: bool = False,
               recipe: str = "Plain-PyTorch") -> int:
    """Every (method, seed) run that a recipe's command line (``args``, from ``argv``) asks for, by ``run_one``
    (methods first, or seeds first), then the result files (:func:`reports.write_reports`); 2, after one line, where
    the data or a method is refused."""
    if args.threads:
        torch.set_num_threads(args.threads)
    budget = Budget(args.updates, args.batch_size, args.lr, args.warmup)
    protocol = Protocol(args.train_length, args.lengths, args.modes, args.eval_tokens)
    pairs = ([(method, seed) for seed in args.seeds for method in args.methods] if seeds_first
             else [(method, seed) for method in args.methods for seed in args.seeds])
    try:
        corpus = load_corpus(args.data_dir, args.subset)
        command = shlex.join(["python", sys.argv[0], *argv])
        results = [run_one(corpus, method, seed, size, budget, protocol, args.out, command) for method, seed in pairs]
    except (UserError, FileNotFoundError) as error:
        print(f"extrapolation.py: error: {error}", file=sys.stderr)
        return 2
    write_reports(args.out, results, args.methods, args.lengths, args.modes, args.train_length, recipe=recipe)
    return 0


SAMPLE = Path(__file__).resolve().parents[2] / "data" / "ptb_sample"


def add_run_arguments(parser: argparse.ArgumentParser, out: Path) -> None:
    """The options both recipes take: the data, the output folder (default ``out``), the seeds, the protocol, the
    budget but its warm-up, the threads."""
    parser.add_argument("--data-dir", type=Path, default=SAMPLE,
                        help="{train,valid,test}.txt(.gz) or ptb.{train,valid,test}.txt(.gz) "
                        "(default: the shipped sample)")
    parser.add_argument("--out", type=Path, default=out)
    parser.add_argument("--seeds", nargs="+", type=int, default=[1])
    parser.add_argument("--train-length", type=int, default=64)
    parser.add_argument("--lengths", nargs="+", type=int, default=[64, 128, 256, 512, 1024],
                        help="evaluation lengths (a model with positions is built for the longest)")
    parser.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    parser.add_argument("--subset", default="valid", help="the split scored")
    parser.add_argument("--eval-tokens", type=int, default=8192, help="tokens read per evaluation batch")
    parser.add_argument("--updates", type=int, default=500)
    parser.add_argument("--batch-size", type=int, default=32, help="blocks per update")
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")


def check_positive(parser: argparse.ArgumentParser, args: argparse.Namespace, sizes: Sequence[str]) -> None:
    """Refuse (``parser.error``) a size among ``sizes`` and the protocol's and budget's that is not positive."""
    for name in ("train_length", "eval_tokens", "updates", "batch_size", *sizes):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be positive")
    if min(args.lengths) < 1:
        parser.error("--lengths must be positive")
