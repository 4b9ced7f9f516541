"""Train short, test long in plain PyTorch: the fairseq recipe examples/length_extrapolation with a small
GPT-style model whose attention is ``posattn.SelfAttention`` (README.md beside this file).

    python examples/pytorch/extrapolation.py --methods alibi rotary --seeds 1 2 3
    python examples/pytorch/extrapolation.py --data-dir ../shared/data/ptb_lm --out pytorch-extrapolation-output
"""

import argparse
import shlex
import sys
from pathlib import Path
from typing import List, Optional

import torch

from data import load_corpus
from evaluation import MODES
from experiment import Protocol, run
from methods import method_names, method_options
from model import ModelSize
from posattn.errors import UserError
from reports import markdown, read_records, write_atomically, write_json
from training import Budget

SAMPLE = Path(__file__).resolve().parents[2] / "data" / "ptb_sample"


def parse_args(argv: Optional[List[str]]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-dir", type=Path, default=SAMPLE,
                        help="{train,valid,test}.txt(.gz) or ptb.{train,valid,test}.txt(.gz) "
                        "(default: the shipped sample)")
    parser.add_argument("--out", type=Path, default=Path("pytorch-extrapolation-output"))
    parser.add_argument("--methods", nargs="+", default=["alibi", "rotary"], help=f"of: {' '.join(method_names())}")
    parser.add_argument("--seeds", nargs="+", type=int, default=[1])
    parser.add_argument("--train-length", type=int, default=64)
    parser.add_argument("--lengths", nargs="+", type=int, default=[64, 128, 256, 512, 1024])
    parser.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    parser.add_argument("--subset", default="valid", help="the split scored")
    parser.add_argument("--eval-tokens", type=int, default=8192, help="tokens read per evaluation batch")
    parser.add_argument("--updates", type=int, default=500)
    parser.add_argument("--batch-size", type=int, default=32, help="blocks per update")
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--warmup", type=int, default=100, help="warm-up updates from 1e-7")
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--ffn-dim", type=int, default=512)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--dropout", type=float, default=0.1)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    args = parser.parse_args(argv)
    for method in args.methods:
        try:
            method_options(method)
        except KeyError as error:
            parser.error(error.args[0])
    for name in ("train_length", "eval_tokens", "updates", "batch_size", "dim", "layers", "heads"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be positive")
    if min(args.lengths) < 1:
        parser.error("--lengths must be positive")
    return args


def main(argv: Optional[List[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    size = ModelSize(args.dim, args.ffn_dim, args.layers, args.heads, args.dropout)
    budget = Budget(args.updates, args.batch_size, args.lr, args.warmup)
    protocol = Protocol(args.train_length, args.lengths, args.modes, args.eval_tokens)
    try:
        corpus = load_corpus(args.data_dir, args.subset)
        command = shlex.join(["python", sys.argv[0], *argv])
        results = [run(corpus, method, seed, size, budget, protocol, args.out, command)
                   for method in args.methods for seed in args.seeds]
    except (UserError, FileNotFoundError) as error:
        print(f"extrapolation.py: error: {error}", file=sys.stderr)
        return 2
    records = [record for path in results for record in read_records(path)]
    write_json(args.out / "results.json", records)
    write_atomically(args.out / "results.md",
                     markdown(records, args.methods, args.lengths, args.modes, args.train_length))
    print(f"==> {args.out / 'results.md'}, {args.out / 'results.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
