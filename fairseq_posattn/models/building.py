"""Build a model as ``fairseq-train`` does, without data on disk: fairseq's training parser with
``--user-dir fairseq_posattn``, the hydra config it converts to, then ``models.build_model``.

The benchmark (``scripts/posattn_benchmark``) and the tests build their models through here, so both
see exactly the options, defaults and validation that a command-line run gets.
"""

import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence, Tuple

from fairseq import models, options
from fairseq.dataclass.utils import convert_namespace_to_omegaconf

USER_DIR = Path(__file__).resolve().parent.parent


@dataclass
class DictionaryTask:
    """What ``build_model`` reads from a task: its dictionaries, and the ``net_input`` keys of the side data it
    collates beside the tokens (``--task translation_structural``: ``src_structure``, each source sentence's
    parse)."""

    source_dictionary: Any
    target_dictionary: Any
    collated_side_data: Tuple[str, ...] = ()


def parse_model_args(argv: Sequence[str]) -> argparse.Namespace:
    """``argv`` (``--arch``, ``--task`` and model options, no data directory) parsed by fairseq's
    training parser with this plug-in as ``--user-dir``."""
    parser = options.get_training_parser()
    return options.parse_args_and_arch(parser, ["unused-data-dir", "--user-dir", str(USER_DIR), *argv])


def build_model(argv: Sequence[str], task: Any) -> Any:
    """The model of ``argv`` for ``task`` (see :class:`DictionaryTask`), built as fairseq-train does."""
    cfg = convert_namespace_to_omegaconf(parse_model_args(argv))
    return models.build_model(cfg.model, task)
