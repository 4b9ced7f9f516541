"""Build small models through fairseq's own argument parsing, as fairseq-train does."""

import os
from typing import List

from fairseq import options
from fairseq.data import Dictionary
from fairseq.models import ARCH_MODEL_REGISTRY

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
USER_DIR = os.path.join(REPO, "fairseq_posattn")

TINY = [
    "--encoder-layers", "2", "--decoder-layers", "2",
    "--encoder-embed-dim", "16", "--decoder-embed-dim", "16",
    "--encoder-ffn-embed-dim", "32", "--decoder-ffn-embed-dim", "32",
    "--encoder-attention-heads", "2", "--decoder-attention-heads", "2",
    "--max-source-positions", "24", "--max-target-positions", "24",
]


class TinyTask:
    """What ``build_model`` reads from a translation task: the two dictionaries."""

    def __init__(self, vocab_size: int = 20):
        self.source_dictionary = Dictionary()
        for i in range(vocab_size):
            self.source_dictionary.add_symbol(f"w{i}")
        self.target_dictionary = self.source_dictionary


def parse_model_args(arch: str, extra: List[str]):
    parser = options.get_training_parser()
    return options.parse_args_and_arch(
        parser, ["unused-data-dir", "--user-dir", USER_DIR, "--arch", arch, *TINY, *extra]
    )


def build_model(arch: str, extra: List[str], task: TinyTask = None):
    args = parse_model_args(arch, extra)
    return ARCH_MODEL_REGISTRY[args.arch].build_model(args, task or TinyTask())
