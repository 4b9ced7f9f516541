"""Train short, test long with Hugging Face transformers: the fairseq recipe examples/length_extrapolation (and
its plain-PyTorch replica examples/pytorch) with a small LlamaForCausalLM switched to a position method by
posattn_huggingface and trained with transformers.Trainer (README.md beside this file).

    python examples/huggingface/extrapolation.py --methods alibi llama-rope --seeds 1 2
    python examples/huggingface/extrapolation.py --data-dir ../shared/data/ptb_lm --out huggingface-extrapolation-output
"""

import argparse
import sys
from pathlib import Path
from typing import List, Optional

sys.path.insert(1, str(Path(__file__).resolve().parents[1] / "pytorch"))  # examples/pytorch's modules, by name

from experiment import add_run_arguments, check_positive, run_recipe  # noqa: E402
from llama_model import LLAMA_ROPE, LlamaSize, check_method, method_names  # noqa: E402
from llama_run import run  # noqa: E402
from posattn.errors import UserError  # noqa: E402


def parse_args(argv: List[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_run_arguments(parser, Path("huggingface-extrapolation-output"))
    parser.add_argument("--methods", nargs="+", default=["alibi", LLAMA_ROPE], help=f"of: {' '.join(method_names())}")
    parser.add_argument("--warmup", type=int, default=100, help="warm-up updates from 0")
    parser.add_argument("--dim", type=int, default=128, help="hidden_size")
    parser.add_argument("--intermediate-size", type=int, default=344, help="the SwiGLU's width")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--attention-dropout", type=float, default=0.1)
    args = parser.parse_args(argv)
    check_positive(parser, args, ("dim", "intermediate_size", "layers", "heads"))
    for method in args.methods:
        try:
            check_method(method)
        except KeyError as error:
            parser.error(error.args[0])
        except UserError as error:
            parser.error(f"{method}: {error}")
    return args


def main(argv: Optional[List[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    size = LlamaSize(args.dim, args.intermediate_size, args.layers, args.heads, args.attention_dropout)
    return run_recipe(args, argv, size, run, seeds_first=True, recipe="Hugging Face (Llama, Trainer)")


if __name__ == "__main__":
    sys.exit(main())
