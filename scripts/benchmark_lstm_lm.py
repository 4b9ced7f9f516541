#!/usr/bin/env python
"""Training speed (tokens/s) of the attentive LSTM language models at the paper's sizes on PTB.

The reference (docs/methods.md): the authors' code (gautierdag/pytorch-attentive-lm) trains at about 1,840
tokens/s on a 2-core machine at the paper sizes; ours must be clearly faster.

Each model is built through fairseq's own machinery (``options.parse_args_and_arch`` with
``--user-dir fairseq_posattn``, then ``models.build_model``) at its architecture defaults (the
paper's: embeddings and two LSTM layers of 400, tied output embedding, position generator of 20,
dropout 0.5 / 0.2 / 0.5), on a vocabulary built from the PTB training text (10,000 words + </s>,
fairseq's special symbols). A train step is the work fairseq-train does per batch, without its
trainer's bookkeeping: forward, the ``cross_entropy`` criterion's loss (log-softmax, sum over the
target tokens), backward, gradient-norm clipping at 0.25 (the paper's) and an SGD step (lr 30, the
paper's). Steps are timed with ``time.perf_counter`` after warm-up; the table gives the median step
and tokens/s = the non-pad *target* tokens of all timed steps / their total time.

The machine's 2 cores are easily shared with other processes, and PyTorch's threads then wait on
each other: check ``uptime`` first. The last column (target tokens per CPU-second of this process)
is the robust number on a busy machine: with ``--threads 1`` it is what one idle core would give,
a lower bound for the idle 2-core machine.

Batches (``--mode``):
  * ``eos`` (default, the paper's set-up): one sentence per row, as fairseq's language_modeling
    task builds it with ``--sample-break-mode eos --tokens-per-sample 35 --shorten-method truncate``
    (source ``</s> w_1 .. w_n``, target ``w_1 .. w_n </s>``, clipped at 35), ``--batch-size``
    sentences of similar length per batch (fairseq's length-ordered batching), right-padded.
  * ``block``: fairseq's default: contiguous 35-token blocks of the running text, no padding.

Usage::

    python scripts/benchmark_lstm_lm.py                       # both models (+ fairseq lstm_lm), eos mode
    python scripts/benchmark_lstm_lm.py --mode block --steps 20 --archs positional_attentive_lstm_lm
"""

import argparse
import gzip
import logging
import os
import platform
import random
import statistics
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Iterator, List, Sequence, Tuple

import torch

REPO_ROOT = Path(__file__).resolve().parent.parent
USER_DIR = REPO_ROOT / "fairseq_posattn"
DEFAULT_DATA = REPO_ROOT.parent / "shared" / "data" / "ptb_lm" / "ptb.train.txt.gz"
FALLBACK_DATA = REPO_ROOT / "data" / "ptb_sample" / "train.txt"
AUTHORS_TOKENS_PER_SECOND = 1840  # docs/methods.md, attentive LSTM language models
ARCHS = ["attentive_lstm_lm", "positional_attentive_lstm_lm", "lstm_lm"]


def read_lines(path: Path) -> List[List[str]]:
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as f:
        return [line.split() for line in f if line.strip()]


def build_dictionary(sentences: Sequence[Sequence[str]]):
    from fairseq.data import Dictionary

    dictionary = Dictionary()
    for word, _ in Counter(w for s in sentences for w in s).most_common():
        dictionary.add_symbol(word)
    return dictionary


def encode(sentences: Sequence[Sequence[str]], dictionary) -> List[torch.Tensor]:
    return [torch.tensor([dictionary.index(w) for w in s] + [dictionary.eos()]) for s in sentences]


def sentence_batches(encoded: List[torch.Tensor], batch_size: int, length: int, pad: int, eos: int,
                     seed: int) -> Iterator[Tuple[torch.Tensor, torch.Tensor]]:
    """``--sample-break-mode eos --tokens-per-sample 35 --shorten-method truncate`` batches, formed
    as fairseq forms them: sentences ordered by length, cut into batches of ``batch_size``, the
    batches shuffled; each batch right-padded to its longest sentence."""
    rng = random.Random(seed)
    rows = sorted((row[:length] for row in encoded), key=len)
    batches = [rows[i : i + batch_size] for i in range(0, len(rows) - batch_size + 1, batch_size)]
    while True:
        rng.shuffle(batches)
        for batch in batches:
            width = max(len(r) for r in batch)
            source = torch.full((len(batch), width), pad)
            target = torch.full((len(batch), width), pad)
            for b, row in enumerate(batch):
                target[b, : len(row)] = row
                source[b, 0] = eos
                source[b, 1 : len(row)] = row[:-1]
            yield source, target


def block_batches(encoded: List[torch.Tensor], batch_size: int, length: int,
                  seed: int) -> Iterator[Tuple[torch.Tensor, torch.Tensor]]:
    """Default ``--sample-break-mode none`` batches: contiguous blocks of the running text."""
    stream = torch.cat(encoded)
    blocks = (stream.numel() - 1) // length
    rng = random.Random(seed)
    while True:
        starts = [rng.randrange(blocks) * length for _ in range(batch_size)]
        source = torch.stack([stream[s : s + length] for s in starts])
        target = torch.stack([stream[s + 1 : s + 1 + length] for s in starts])
        yield source, target


class _Task:
    def __init__(self, dictionary):
        self.source_dictionary = self.target_dictionary = self.dictionary = dictionary


def build(arch: str, dictionary, tokens_per_sample: int):
    from fairseq import models, options
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    extra = []
    if arch == "lstm_lm":  # fairseq's own LSTM LM at the same sizes, for comparison
        extra = ["--decoder-embed-dim", "400", "--decoder-hidden-size", "400", "--decoder-layers", "2",
                 "--decoder-out-embed-dim", "400", "--share-decoder-input-output-embed", "--dropout", "0.5"]
    parser = options.get_training_parser()
    args = options.parse_args_and_arch(parser, [
        "unused", "--user-dir", str(USER_DIR), "--task", "language_modeling", "--arch", arch,
        "--tokens-per-sample", str(tokens_per_sample), *extra])
    cfg = convert_namespace_to_omegaconf(args)
    return models.build_model(cfg.model, _Task(dictionary))


def time_training(model, batches, steps: int, warmup: int, pad: int) -> Tuple[List[float], List[float], List[int]]:
    from fairseq import utils

    model.train()
    optimizer = torch.optim.SGD(model.parameters(), lr=30.0)
    times, cpu_times, tokens = [], [], []
    for step in range(warmup + steps):
        source, target = next(batches)
        start, cpu_start = time.perf_counter(), time.process_time()
        logits = model(source)[0]
        lprobs = torch.log_softmax(logits, dim=-1, dtype=torch.float32)
        loss = torch.nn.functional.nll_loss(lprobs.view(-1, lprobs.size(-1)), target.view(-1),
                                            ignore_index=pad, reduction="sum")
        optimizer.zero_grad()
        loss.backward()
        utils.clip_grad_norm_(model.parameters(), 0.25)
        optimizer.step()
        elapsed, cpu_elapsed = time.perf_counter() - start, time.process_time() - cpu_start
        if step >= warmup:
            times.append(elapsed)
            cpu_times.append(cpu_elapsed)
            tokens.append(int(target.ne(pad).sum()))
    return times, cpu_times, tokens


def main(argv: Sequence[str] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA if DEFAULT_DATA.exists() else FALLBACK_DATA,
                        help="PTB training text, plain or .gz (default: ../shared/data/ptb_lm/ptb.train.txt.gz)")
    parser.add_argument("--archs", nargs="+", default=ARCHS, choices=ARCHS)
    parser.add_argument("--mode", choices=["eos", "block"], default="eos")
    parser.add_argument("--batch-size", type=int, default=20, help="sentences or blocks per batch (paper: 20)")
    parser.add_argument("--tokens-per-sample", type=int, default=35)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    logging.disable(logging.WARNING)
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)

    sys.path.insert(0, str(REPO_ROOT))
    import fairseq_posattn  # noqa: F401  (registers the architectures)

    sentences = read_lines(args.data)
    dictionary = build_dictionary(sentences)
    encoded = encode(sentences, dictionary)
    pad, eos = dictionary.pad(), dictionary.eos()
    print(f"data: {args.data} ({len(sentences)} sentences, vocabulary {len(dictionary)} incl. specials)")
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
          f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    print(f"mode {args.mode}, batch {args.batch_size} x {args.tokens_per_sample}, {args.steps} timed steps "
          f"after {args.warmup} warm-up; forward + cross entropy + backward + clip 0.25 + SGD step\n")
    print("| model | parameters | target tokens / step | median step (s) | tokens/s | vs authors' 1,840 "
          "| tokens per CPU-second |")
    print("|---|---|---|---|---|---|---|")
    for arch in args.archs:
        model = build(arch, dictionary, args.tokens_per_sample)
        if args.mode == "eos":
            batches = sentence_batches(encoded, args.batch_size, args.tokens_per_sample, pad, eos, args.seed)
        else:
            batches = block_batches(encoded, args.batch_size, args.tokens_per_sample, args.seed)
        times, cpu_times, tokens = time_training(model, batches, args.steps, args.warmup, pad)
        rate = sum(tokens) / sum(times)
        params = sum(p.numel() for p in model.parameters())
        print(f"| {arch} | {params / 1e6:.2f}M | {statistics.mean(tokens):.0f} | {statistics.median(times):.3f} "
              f"| {rate:,.0f} | {rate / AUTHORS_TOKENS_PER_SECOND:.1f}x | {sum(tokens) / sum(cpu_times):,.0f} |",
              flush=True)


if __name__ == "__main__":
    main()
