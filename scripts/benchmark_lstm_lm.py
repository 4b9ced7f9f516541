#!/usr/bin/env python
"""Training speed (tokens/s) of the attentive LSTM language models at the paper's sizes on PTB, and
its ratio to the authors' code (gautierdag/pytorch-attentive-lm) on the same batches, in one run.

Each of our models is built through fairseq's own machinery (``options.parse_args_and_arch`` with
``--user-dir fairseq_posattn``, then ``models.build_model``) at its architecture defaults (the
paper's: embeddings and two LSTM layers of 400, tied output embedding, position generator of 20,
dropout 0.5 / 0.2 / 0.5), on a vocabulary built from the PTB training text (10,000 words + </s>,
fairseq's special symbols). Our train step is the work fairseq-train does per batch, without its
trainer's bookkeeping: forward, the ``cross_entropy`` criterion's loss (log-softmax, sum over the
target tokens), backward, gradient-norm clipping at 0.25 (the paper's) and an SGD step (lr 30).

The authors' code (``--authors-code DIR``, a checkout of their repository; nothing of it is in this
repository): the script imports their ``AttentiveRNNLanguageModel`` from ``DIR/model.py`` at run
time and builds it at the same sizes (``attention=True`` for Salton's model, their default
positional attention for Dagan's; embeddings and two LSTM layers of 400, tied, dropout 0.5 / 0.2 /
0.5, position generator of 20). Their train step is their ``train.py`` loop body:
``model.zero_grad()``, ``model(data, pad_lengths)``, ``nn.CrossEntropyLoss(ignore_index=0,
reduction='sum')`` over the flattened logits, backward, ``clip_grad_norm_`` at 0.25 and their SGD
(lr 30, weight decay 1.2e-6, as their ``main.py``); their logging (``loss.item()``, word counts) is
left out, as fairseq's trainer bookkeeping is for ours. Their model is batch-first like ours and
starts every batch from a zero LSTM state (no hidden state is carried between batches), so both get
the very same token batches: the token ids are ours with our pad index and their pad index 0 swapped
(their loss ignores 0; index 0 is fairseq's ``<s>``, which never occurs), ``pad_lengths`` are the
rows' non-pad counts as a float tensor (as their DataLoader gives them), and the rows are sorted by
decreasing length as their ``sort_by_lengths`` does; this preparation is not timed. Their code runs
unchanged under torch 2.x (``pack_padded_sequence`` takes the float CPU lengths), so no shim is
applied; the benchmark runs on the CPU (their ``model.py`` puts its own tensors on CUDA whenever a
GPU is visible). Their own loader pads every sentence to 35 tokens; here they get our batches,
padded only to the batch's longest sentence. ``--authors-pad-to 35`` gives them their loader's
layout instead (the same sentences and target tokens, every row right-padded to 35 columns): their
released pipeline's speed, which is not the same-batch comparison.

All models are built first; then every batch is given to each model in turn (round robin, the
order rotated by one model per batch), so that they share the machine's load alike. Steps are timed
with ``time.perf_counter`` after warm-up; the table gives the median step and tokens/s = the non-pad
*target* tokens of all timed steps / their total time, and the ratio ours / theirs of the tokens/s.

The machine's 2 cores are easily shared with other processes, and PyTorch's threads then wait on
each other: check ``uptime`` (the script prints the load average before and after). The column
"tokens per CPU-second" (target tokens per CPU-second of this process) is the robust number on a
busy machine: with ``--threads 1`` it is what one idle core would give.

``--device cuda`` runs our models on the GPU (the authors' model stays on the CPU, so ``--authors-code``
is refused there), timing each step from a synchronised start to a synchronised end. ``--mu-recurrence
eager compiled`` trains Dagan's model once per named recurrence of its mu (``set_mu_recurrence`` in
``positional_attention.py``: the eager loop, or the compiled one, which is the default on CUDA), the
rows named ``positional_attentive_lstm_lm (mu eager)`` and so on, so that one run gives both speeds on
the same batches; the first (warm-up) step of each model, which includes the compilation, is printed
under the table.

Batches (``--mode``):
  * ``eos`` (default, the paper's set-up): one sentence per row, as fairseq's language_modeling
    task builds it with ``--sample-break-mode eos --tokens-per-sample 35 --shorten-method truncate``
    (source ``</s> w_1 .. w_n``, target ``w_1 .. w_n </s>``, clipped at 35), ``--batch-size``
    sentences of similar length per batch (fairseq's length-ordered batching), right-padded.
  * ``block``: fairseq's default: contiguous 35-token blocks of the running text, no padding.

Usage::

    python scripts/benchmark_lstm_lm.py                       # both models (+ fairseq lstm_lm), eos mode
    python scripts/benchmark_lstm_lm.py --threads 1 --authors-code /path/to/pytorch-attentive-lm
    python scripts/benchmark_lstm_lm.py --threads 1 --authors-code DIR --mode block
    python scripts/benchmark_lstm_lm.py --mode block --steps 20 --archs positional_attentive_lstm_lm
    python scripts/benchmark_lstm_lm.py --device cuda --batch-size 32 --steps 300 --warmup 5 \
        --archs positional_attentive_lstm_lm attentive_lstm_lm --mu-recurrence eager compiled
"""

import argparse
import gzip
import importlib.util
import logging
import os
import platform
import random
import statistics
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor

REPO_ROOT = Path(__file__).resolve().parent.parent
USER_DIR = REPO_ROOT / "fairseq_posattn"
DEFAULT_DATA = REPO_ROOT.parent / "shared" / "data" / "ptb_lm" / "ptb.train.txt.gz"
FALLBACK_DATA = REPO_ROOT / "data" / "ptb_sample" / "train.txt"
ARCHS = ["attentive_lstm_lm", "positional_attentive_lstm_lm", "lstm_lm"]
AUTHORS_PAD = 0  # their PAD_ID, ignored by their loss
# our architecture -> the authors' model that implements it (keyword arguments of their class)
AUTHORS_COUNTERPART = {
    "attentive_lstm_lm": {"attention": True, "positional_attention": False},
    "positional_attentive_lstm_lm": {"attention": False, "positional_attention": True},
}
PAPER_SIZES = {"embedding_size": 400, "hidden_size": 400, "n_layers": 2, "dropout_p_input": 0.5,
               "dropout_p_encoder": 0.2, "dropout_p_decoder": 0.5, "positioning_embedding": 20,
               "tie_weights": True}

Batch = Tuple[Tensor, Tensor]


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


def encode(sentences: Sequence[Sequence[str]], dictionary) -> List[Tensor]:
    return [torch.tensor([dictionary.index(w) for w in s] + [dictionary.eos()]) for s in sentences]


def sentence_batches(encoded: List[Tensor], batch_size: int, length: int, pad: int, eos: int,
                     seed: int) -> Iterator[Batch]:
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


def block_batches(encoded: List[Tensor], batch_size: int, length: int,
                  seed: int) -> Iterator[Batch]:
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


@dataclass
class Trainee:
    """A model with its train step; ``prepare`` turns our (source, target) batch into the step's
    inputs (not timed). Collects the per-step wall and CPU times and target tokens."""

    name: str
    model: torch.nn.Module
    prepare: Callable[[Batch], Tuple]
    step: Callable[..., None]
    counterpart: Optional["Trainee"] = None  # ours -> the authors' model it is compared with
    device: torch.device = torch.device("cpu")
    first_step: Optional[float] = None  # the first (warm-up) step's wall time, compilation included
    times: List[float] = field(default_factory=list)
    cpu_times: List[float] = field(default_factory=list)
    tokens: List[int] = field(default_factory=list)

    def run(self, batch: Batch, pad: int, timed: bool) -> None:
        inputs = self.prepare(batch)
        synchronize(self.device)
        start, cpu_start = time.perf_counter(), time.process_time()
        self.step(*inputs)
        synchronize(self.device)
        elapsed, cpu_elapsed = time.perf_counter() - start, time.process_time() - cpu_start
        if self.first_step is None:
            self.first_step = elapsed
        if timed:
            self.times.append(elapsed)
            self.cpu_times.append(cpu_elapsed)
            self.tokens.append(int(batch[1].ne(pad).sum()))

    def rate(self) -> float:
        return sum(self.tokens) / sum(self.times)

    def cpu_rate(self) -> float:
        return sum(self.tokens) / sum(self.cpu_times)

    def updates_per_second(self) -> float:
        return len(self.times) / sum(self.times)


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def our_trainee(arch: str, dictionary, tokens_per_sample: int, device: torch.device = torch.device("cpu"),
                mu_recurrence: Optional[str] = None) -> Trainee:
    """Our model (or fairseq's lstm_lm) with fairseq-train's work per batch; ``mu_recurrence``: the
    recurrence of Dagan's mu that its steps run (``set_mu_recurrence``; None: the default)."""
    from fairseq import utils
    from fairseq_posattn.models.attentive_lstm.positional_attention import set_mu_recurrence

    model = build(arch, dictionary, tokens_per_sample).to(device)
    model.train()
    optimizer = torch.optim.SGD(model.parameters(), lr=30.0)
    pad = dictionary.pad()

    def step(source: Tensor, target: Tensor) -> None:
        previous = set_mu_recurrence(mu_recurrence) if mu_recurrence else None
        try:
            forward_backward(source, target)
        finally:
            if previous:
                set_mu_recurrence(previous)

    def forward_backward(source: Tensor, target: Tensor) -> None:
        logits = model(source)[0]
        lprobs = torch.log_softmax(logits, dim=-1, dtype=torch.float32)
        loss = torch.nn.functional.nll_loss(lprobs.view(-1, lprobs.size(-1)), target.view(-1),
                                            ignore_index=pad, reduction="sum")
        optimizer.zero_grad()
        loss.backward()
        utils.clip_grad_norm_(model.parameters(), 0.25)
        optimizer.step()

    name = arch if mu_recurrence is None else f"{arch} (mu {mu_recurrence})"
    return Trainee(name, model, lambda batch: tuple(tokens.to(device) for tokens in batch), step, device=device)


def import_authors_model_class(directory: Path) -> Any:
    """``AttentiveRNNLanguageModel`` from ``directory/model.py`` (their checkout), imported under a
    private module name so that nothing of theirs shadows a module of ours."""
    path = directory / "model.py"
    if not path.is_file():
        raise SystemExit(f"--authors-code: {path} not found (a checkout of gautierdag/pytorch-attentive-lm)")
    spec = importlib.util.spec_from_file_location("authors_attentive_lm_model", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.AttentiveRNNLanguageModel


def to_authors_batch(batch: Batch, pad: int, width: Optional[int] = None) -> Tuple[Tensor, Tensor, Tensor]:
    """Our batch in their layout: our pad index and their pad index 0 swapped, float lengths (the
    rows' non-pad counts), rows sorted by decreasing length (their ``sort_by_lengths``). With
    ``width``, the rows are first right-padded to that many columns, as their loader pads every
    sentence (``lm_data_producer``, 35)."""
    source, target = batch
    if width is not None and width > source.size(1):
        source, target = (F.pad(tokens, (0, width - tokens.size(1)), value=pad) for tokens in (source, target))

    def swap(tokens: Tensor) -> Tensor:
        swapped = tokens.masked_fill(tokens == AUTHORS_PAD, pad)
        return swapped.masked_fill(tokens == pad, AUTHORS_PAD)

    lengths, order = source.ne(pad).sum(dim=1).float().sort(descending=True)
    return swap(source)[order], swap(target)[order], lengths


def authors_trainee(model_class: Any, arch: str, vocab_size: int, pad: int, width: Optional[int] = None) -> Trainee:
    """Their model for our ``arch`` at the paper's sizes, with their train loop's work per batch."""
    model = model_class(vocab_size, **PAPER_SIZES, **AUTHORS_COUNTERPART[arch])
    model.train()
    optimizer = torch.optim.SGD(model.parameters(), lr=30.0, weight_decay=12e-7)  # their main.py
    criterion = torch.nn.CrossEntropyLoss(ignore_index=AUTHORS_PAD, reduction="sum")

    def step(data: Tensor, targets: Tensor, pad_lengths: Tensor) -> None:
        model.zero_grad()
        output = model(data, pad_lengths)
        loss = criterion(output.view(-1, vocab_size), targets.view(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.25)
        optimizer.step()

    name = f"authors: {arch}" + ("" if width is None else f" (rows padded to {width})")
    return Trainee(name, model, lambda batch: to_authors_batch(batch, pad, width), step)


def round_robin(trainees: List[Trainee], batches: Iterator[Batch], steps: int, warmup: int, pad: int) -> None:
    """Every batch through every trainee, the order rotated by one per batch."""
    for index in range(warmup + steps):
        batch = next(batches)
        shift = index % len(trainees)
        for trainee in trainees[shift:] + trainees[:shift]:
            trainee.run(batch, pad, timed=index >= warmup)


def report(trainees: List[Trainee], authors: bool) -> None:
    print("| model | parameters | target tokens / step | median step (s) | tokens/s | ours / authors' "
          "(tokens/s) | tokens per CPU-second | ours / authors' (CPU) | updates/s |")
    print("|---|---|---|---|---|---|---|---|---|")
    for trainee in trainees:
        ratio = cpu_ratio = ""
        other = trainee.counterpart
        if other is not None:
            ratio = f"{trainee.rate() / other.rate():.2f}x"
            cpu_ratio = f"{trainee.cpu_rate() / other.cpu_rate():.2f}x"
        elif not authors and trainee.name in AUTHORS_COUNTERPART:
            ratio = cpu_ratio = "needs --authors-code"
        params = sum(p.numel() for p in trainee.model.parameters())
        print(f"| {trainee.name} | {params / 1e6:.2f}M | {statistics.mean(trainee.tokens):.0f} "
              f"| {statistics.median(trainee.times):.3f} | {trainee.rate():,.0f} | {ratio} "
              f"| {trainee.cpu_rate():,.0f} | {cpu_ratio} | {trainee.updates_per_second():.1f} |", flush=True)
    print("\nfirst (warm-up) step, compilation included: " + ", ".join(
        f"{trainee.name} {trainee.first_step:.2f} s" for trainee in trainees if trainee.first_step is not None))
    if not authors:
        print("\nThe authors' columns need --authors-code DIR (a checkout of gautierdag/pytorch-attentive-lm).")


def main(argv: Sequence[str] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA if DEFAULT_DATA.exists() else FALLBACK_DATA,
                        help="PTB training text, plain or .gz (default: ../shared/data/ptb_lm/ptb.train.txt.gz)")
    parser.add_argument("--archs", nargs="+", default=ARCHS, choices=ARCHS)
    parser.add_argument("--authors-code", type=Path, metavar="DIR",
                        help="a checkout of gautierdag/pytorch-attentive-lm: also time the authors' model "
                             "of each attentive arch on the same batches and report ours / theirs")
    parser.add_argument("--authors-pad-to", type=int, metavar="N",
                        help="give the authors' model every batch right-padded to N columns, as their own "
                             "loader pads every sentence to 35 (same sentences, their layout); default: our "
                             "batches unchanged")
    parser.add_argument("--mode", choices=["eos", "block"], default="eos")
    parser.add_argument("--batch-size", type=int, default=20, help="sentences or blocks per batch (paper: 20)")
    parser.add_argument("--tokens-per-sample", type=int, default=35)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--device", type=torch.device, default=torch.device("cpu"),
                        help="the device of our models: cpu (default) or cuda (without --authors-code)")
    parser.add_argument("--mu-recurrence", nargs="+", choices=["auto", "eager", "compiled"], metavar="KIND",
                        help="train Dagan's model once with each of these recurrences of mu (auto, eager, "
                             "compiled; the rows named after them); default: once, as set_mu_recurrence's default")
    args = parser.parse_args(argv)
    if args.device.type != "cpu" and args.authors_code:
        parser.error("--authors-code runs the authors' model on the CPU: leave --device at cpu")
    logging.disable(logging.WARNING)
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)

    sys.path.insert(0, str(REPO_ROOT))
    import fairseq_posattn  # noqa: F401  (registers the architectures)
    from fairseq_posattn.models.attentive_lstm.positional_attention import compiled_mu_failures

    sentences = read_lines(args.data)
    dictionary = build_dictionary(sentences)
    encoded = encode(sentences, dictionary)
    pad, eos = dictionary.pad(), dictionary.eos()
    print(f"data: {args.data} ({len(sentences)} sentences, vocabulary {len(dictionary)} incl. specials)")
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
          f"torch {torch.__version__}, {torch.get_num_threads()} threads, device {args.device}"
          f"{' (' + torch.cuda.get_device_name(args.device) + ')' if args.device.type == 'cuda' else ''}, "
          f"load average {os.getloadavg()[0]:.2f} at the start")
    print(f"mode {args.mode}, batch {args.batch_size} x {args.tokens_per_sample}, {args.steps} timed steps "
          f"after {args.warmup} warm-up, round robin over the models; forward + loss + backward + "
          f"clip 0.25 + SGD step\n")

    model_class = import_authors_model_class(args.authors_code) if args.authors_code else None
    trainees = [our_trainee(arch, dictionary, args.tokens_per_sample, args.device, recurrence)
                for arch in args.archs
                for recurrence in ((args.mu_recurrence or [None]) if arch == "positional_attentive_lstm_lm" else [None])]
    if model_class is not None:
        for ours in [t for t in trainees if t.name in AUTHORS_COUNTERPART]:
            ours.counterpart = authors_trainee(model_class, ours.name, len(dictionary), pad, args.authors_pad_to)
            trainees.append(ours.counterpart)
    if args.mode == "eos":
        batches = sentence_batches(encoded, args.batch_size, args.tokens_per_sample, pad, eos, args.seed)
    else:
        batches = block_batches(encoded, args.batch_size, args.tokens_per_sample, args.seed)
    round_robin(trainees, batches, args.steps, args.warmup, pad)
    report(trainees, authors=args.authors_code is not None)
    for device, cause in compiled_mu_failures().items():  # a compiled row that ran eager, said
        print(f"\nTHE COMPILED MU RECURRENCE FAILED on {device} ({cause}): every row after the failure ran the "
              "eager loop")
    print(f"\nload average {os.getloadavg()[0]:.2f} at the end")


if __name__ == "__main__":
    main()
