"""One run of the recipe (a method and a seed): train on blocks of the training length, then score the
evaluation split in every mode at every length; its records go to ``OUT/<method>/seed<N>/results.json``, its
log to ``train.log`` and its command, budget, wall time and commit to ``run.json`` beside it (the fields of the
evidence runs' ``run.json``). A run whose ``results.json`` exists is finished and is not redone."""

import datetime
import subprocess
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, List, Optional, Sequence

import torch

from data import PAD, Corpus, training_blocks
from evaluation import evaluate
from methods import side_options
from model import ModelSize, PositionLM
from posattn.errors import UserError
from reports import Record, write_atomically, write_json
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


def score(model: PositionLM, corpus: Corpus, protocol: Protocol, base: Record,
          log: Callable[[str], None]) -> List[Record]:
    """A record per mode and length: ``ok`` with the perplexity, or ``refused`` with the model's one line."""
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


def run(corpus: Corpus, method: str, seed: int, size: ModelSize, budget: Budget, protocol: Protocol,
        out: Path, command: str) -> Path:
    """Trains and scores one model unless its results exist; returns its ``results.json``. ``command``: the
    command line that runs it, for its ``run.json``."""
    folder = run_dir(out, method, seed)
    results = folder / RESULTS_FILE
    if results.is_file():
        print(f"{method} seed {seed}: finished already ({results})", flush=True)
        return results
    folder.mkdir(parents=True, exist_ok=True)
    started, start_clock = now(), time.perf_counter()
    lines: List[str] = []

    def log(line: str) -> None:
        line = f"{method} seed {seed} | {line}"
        print(line, flush=True)
        lines.append(line)

    model = build_model(corpus, method, size, protocol, seed)
    log(f"{model.parameter_count()} parameters, vocabulary {len(corpus.dictionary)}, "
        f"{corpus.train.numel()} training tokens, {corpus.valid.numel()} evaluation tokens")
    inputs, targets = training_blocks(corpus.train, protocol.train_length)
    train_seconds = train(model, inputs, targets, budget, seed, log)
    log(f"done training in {train_seconds:.1f} seconds")
    scoring_start = time.perf_counter()
    base: Record = {"method": method, "seed": seed, "params": model.parameter_count(),
                    "train_seconds": round(train_seconds, 3)}
    records = score(model, corpus, protocol, base, log)
    log(f"done scoring in {time.perf_counter() - scoring_start:.1f} seconds")
    seconds = round(time.perf_counter() - start_clock, 1)
    write_atomically(folder / LOG_FILE, "\n".join(lines) + "\n")
    write_json(folder / RUN_FILE, {
        "id": f"{method}/seed{seed}", "system": method, "seed": seed, "command": command, "commit": commit(),
        "budget": budget_text(size, budget, protocol), "seconds": seconds, "recorded": now(),
        "attempts": [{"start": started, "end": now(), "seconds": seconds, "outcome": "finished", "returncode": 0}],
        "settings": {"size": asdict(size), "budget": asdict(budget), "protocol": asdict(protocol)}})
    write_json(results, records)
    return results
