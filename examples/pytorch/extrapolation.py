"""Train short, test long in plain PyTorch: the fairseq recipe examples/length_extrapolation with a small
GPT-style model whose attention is ``posattn.SelfAttention`` (README.md beside this file).

    python examples/pytorch/extrapolation.py --methods alibi rotary --seeds 1 2 3
    python examples/pytorch/extrapolation.py --data-dir ../shared/data/ptb_lm --out pytorch-extrapolation-output
"""

import argparse
import sys
from pathlib import Path
from typing import List, Optional

from experiment import add_run_arguments, check_positive, run, run_recipe
from methods import method_names, method_options
from model import ModelSize


def parse_args(argv: Optional[List[str]]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_run_arguments(parser, Path("pytorch-extrapolation-output"))
    parser.add_argument("--methods", nargs="+", default=["alibi", "rotary"], help=f"of: {' '.join(method_names())}")
    parser.add_argument("--warmup", type=int, default=100, help="warm-up updates from 1e-7")
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--ffn-dim", type=int, default=512)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--dropout", type=float, default=0.1)
    args = parser.parse_args(argv)
    for method in args.methods:
        try:
            method_options(method)
        except KeyError as error:
            parser.error(error.args[0])
    check_positive(parser, args, ("dim", "layers", "heads"))
    return args


def main(argv: Optional[List[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    size = ModelSize(args.dim, args.ffn_dim, args.layers, args.heads, args.dropout)
    return run_recipe(args, argv, size, run)


if __name__ == "__main__":
    sys.exit(main())
