"""``posattn-inspect``: pictures (or JSON) of what a trained model does with one sentence.

Loads a checkpoint with the data directory it was trained on, runs the model once on one sentence
(``--sentence``, BPE'd as the training data, or ``--index`` of a split) and writes, per kind:
attention maps of every layer and head (encoder and decoder self-attention, cross-attention),
what each position method's terms have learned (one kind per method, named as the method: e.g.
direct-position shows A^p and a^r, learnable-temperature the gammas, distance-aware w, v and the
coefficients, conv-attention the filters and the attention before and after the convolution,
relative-positions and structural-positions the key/value embeddings, t5-relative-bias its table
and bias over i - j, alibi its bias over i - j, rotary the rotation's effect on the logits), the
sentence's structural positions (``--task translation_structural``) and the positional attentive
LSTM LM's mu, sigma and Gaussian attention. See :mod:`fairseq_posattn.inspect.plots` for the file
names.

A translation model's decoder is fed (teacher-forced) ``--target``, else the reference of
``--index``, else the model's own beam-search translation. The plugin is imported here: no
``--user-dir`` is needed. Runs on the CPU.
"""

import argparse
import json
import logging
import os
from typing import Any, List, Optional, Tuple

from fairseq import checkpoint_utils, tasks
from omegaconf import open_dict
from torch import nn

from fairseq_posattn.cli import reported_errors, setup_logging
from fairseq_posattn.inspect.capture import (Inspection, add_decoder_input, dataset_sample, inspect_model,
                                             kinds, sentence_sample)

logger = logging.getLogger("posattn-inspect")
JSON_NAME = "inspection.json"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="posattn-inspect", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("data", help="the data directory (fairseq-preprocess output) the model was trained on")
    parser.add_argument("--path", required=True, help="checkpoint file, e.g. checkpoints/checkpoint_best.pt")
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--sentence", help="one source sentence (LM: one text), tokenized and BPE'd as the "
                                          "training data")
    which.add_argument("--index", type=int, help="sentence id (as fairseq-generate's S-<id>) in --gen-subset")
    parser.add_argument("--gen-subset", default="test", help="split of --index (default: test)")
    parser.add_argument("--target", help="BPE'd target sentence to feed the decoder (default: the reference "
                                         "of --index, else the model's own translation)")
    parser.add_argument("--beam", type=int, default=5, help="beam size of that translation (default: 5)")
    parser.add_argument("--task", help="use this task instead of the checkpoint's, e.g. translation_structural "
                                       "to parse the sentence with spaCy for the structure picture")
    parser.add_argument("--kinds", nargs="+", choices=kinds(), metavar="KIND",
                        help=f"what to draw, of: {', '.join(kinds())} (default: all that the model has)")
    parser.add_argument("--positions", type=int, help="positions shown of position-indexed quantities (A^p, "
                        "a^r, DA coefficients, 1d filters, biases over i - j; default: the sentence length)")
    parser.add_argument("--output-dir", default="inspect-output", help="where the files go (default: inspect-output)")
    parser.add_argument("--format", choices=["png", "json"], default="png",
                        help=f"png pictures, or the same numbers as {JSON_NAME} (default: png)")
    parser.add_argument("--user-dir", help="accepted for symmetry with fairseq's tools; the plugin is always loaded")
    return parser


def load(path: str, data: str, task_name: Optional[str]) -> Tuple[nn.Module, Any]:
    """The checkpoint's model (eval mode, CPU) and task, the task optionally replaced by ``task_name``."""
    overrides = {"data": data}
    task = None
    if task_name is not None:
        cfg = checkpoint_utils.load_checkpoint_to_cpu(path, overrides)["cfg"].task
        with open_dict(cfg):
            cfg._name = task_name
        task = tasks.setup_task(cfg)
    models, _cfg, task = checkpoint_utils.load_model_ensemble_and_task([path], arg_overrides=overrides, task=task)
    return models[0].cpu().eval(), task


def chosen_kinds(requested: Optional[List[str]], inspection: Inspection) -> List[str]:
    """The requested kinds (all available ones by default); a requested kind the model lacks fails."""
    available = inspection.available_kinds()
    if requested is None:
        return available
    missing = [kind for kind in requested if kind not in available]
    if missing:
        raise ValueError(f"nothing to draw for {', '.join(missing)}: this model and input have only "
                         f"{', '.join(available) or 'none of the kinds'}")
    return [kind for kind in kinds() if kind in requested]


def write_json(inspection: Inspection, kinds: List[str], args: argparse.Namespace) -> str:
    os.makedirs(args.output_dir, exist_ok=True)
    path = os.path.join(args.output_dir, JSON_NAME)
    numbers = dict(inspection.to_json(kinds), checkpoint=os.path.abspath(args.path))
    with open(path, "w", encoding="utf-8") as f:
        json.dump(numbers, f)
    return path


def run(args: argparse.Namespace) -> List[str]:
    """Load, run once, write; return the written paths."""
    model, task = load(args.path, args.data, args.task)
    if args.sentence is not None:
        sample = sentence_sample(task, args.sentence)
    else:
        sample = dataset_sample(task, args.gen_subset, args.index)
    origin = add_decoder_input(model, task, sample, args.target, args.beam)
    inspection = inspect_model(model, task, sample, origin, args.positions)
    kinds = chosen_kinds(args.kinds, inspection)
    if args.format == "json":
        return [write_json(inspection, kinds, args)]
    from fairseq_posattn.inspect.plots import draw  # matplotlib only when drawing

    return draw(inspection, kinds, args.output_dir)


def main(argv: Optional[List[str]] = None) -> None:
    args = build_parser().parse_args(argv)
    setup_logging()
    with reported_errors("posattn-inspect", IndexError):
        paths = run(args)
    for path in paths:
        print(path)


if __name__ == "__main__":
    main()
