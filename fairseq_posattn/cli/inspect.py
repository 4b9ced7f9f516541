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

Translation models and language models are drawn; a checkpoint of another task (the tagger's
``pos_tagging``, a classifier's ``sentence_prediction``), a ``.pt`` file that fairseq-train did not write, and
a sentence longer than the positions a model's position terms were trained for are refused in one line.
"""

import argparse
import copy
import json
import logging
import os
import pickle
from typing import Any, Dict, List, Optional, Tuple

from fairseq import checkpoint_utils, tasks
from fairseq.dataclass.utils import convert_namespace_to_omegaconf
from fairseq.tasks.language_modeling import LanguageModelingTask
from fairseq.tasks.translation import TranslationTask
from omegaconf import DictConfig, open_dict
from torch import nn

from fairseq_posattn.cli import reported_errors, setup_logging
from fairseq_posattn.inspect.capture import (Inspection, Sample, add_decoder_input, dataset_sample, inspect_model,
                                             is_encoder_decoder, kinds, sentence_sample)
from posattn.position_terms.base import SequenceTooLongError

logger = logging.getLogger("posattn-inspect")
JSON_NAME = "inspection.json"
#: the tasks whose models posattn-inspect runs (their subclasses too, e.g. translation_structural)
INSPECTED_TASKS = (TranslationTask, LanguageModelingTask)
#: what the decoder reads, by the origin :func:`add_decoder_input` returns
DECODER_INPUTS = {"given": "--target", "reference": "the reference of --index",
                  "translation": "the model's own translation"}


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
    """The checkpoint's model (eval mode, CPU) and task, the task optionally replaced by ``task_name``.

    Raises ValueError for a file that is not a fairseq checkpoint, or one of a task posattn-inspect does not
    draw (:data:`INSPECTED_TASKS`), before the model is built."""
    overrides = {"data": data}
    state = read_checkpoint(path, overrides)
    config = checkpoint_config(state)
    check_inspected_task(path, task_name or config.task._name, config.model)
    task = None
    if task_name is not None:
        task_cfg = copy.deepcopy(config.task)
        with open_dict(task_cfg):
            task_cfg._name = task_name
        task = tasks.setup_task(task_cfg)
    models, _cfg, task = checkpoint_utils.load_model_ensemble_and_task([path], arg_overrides=overrides, task=task,
                                                                        state=state)
    return models[0].cpu().eval(), task


def read_checkpoint(path: str, overrides: Dict[str, Any]) -> Dict[str, Any]:
    """The checkpoint at ``path`` as fairseq reads it (upgraded, ``overrides`` applied); ValueError naming the
    file when it is not a checkpoint fairseq-train wrote (fairseq fails on it with a ``KeyError``, an unpickling
    or a torch error)."""
    try:
        return checkpoint_utils.load_checkpoint_to_cpu(path, overrides)
    except (KeyError, RuntimeError, pickle.UnpicklingError, EOFError) as error:
        raise ValueError(
            f"{path} is not a checkpoint that fairseq-train wrote (fairseq cannot read it: {type(error).__name__} "
            f"{error}); a bare state_dict, saved by torch.save(model.state_dict()), lacks the model's "
            f"configuration. Give --path a checkpoint of fairseq-train's --save-dir, e.g. "
            f"checkpoints/checkpoint_best.pt") from None


def checkpoint_config(state: Dict[str, Any]) -> DictConfig:
    """The configuration fairseq builds a checkpoint's task and model from (old checkpoints hold ``args``)."""
    if state.get("args") is not None:
        return convert_namespace_to_omegaconf(state["args"])
    return state["cfg"]


def check_inspected_task(path: str, task_name: str, model_cfg: Any) -> None:
    """Raise ValueError unless ``task_name`` is a task of :data:`INSPECTED_TASKS` (or one derived from them)."""
    task_class = tasks.TASK_REGISTRY.get(task_name)
    if task_class is not None and issubclass(task_class, INSPECTED_TASKS):
        return
    raise ValueError(
        f"{path} holds a {architecture(model_cfg)} of task {task_name}: posattn-inspect draws translation "
        f"models (tasks translation, translation_structural) and language models (task language_modeling), not "
        f"taggers (pos_tagging) or sentence classifiers (sentence_prediction). Give --path the checkpoint of a "
        f"translation model or a language model")


def architecture(model_cfg: Any) -> str:
    """The architecture's name in a checkpoint's model configuration (a DictConfig, or a Namespace)."""
    return getattr(model_cfg, "_name", None) or getattr(model_cfg, "arch", "model")


def too_long_for_positions(model: nn.Module, sample: Sample, origin: Optional[str], args: argparse.Namespace,
                           error: SequenceTooLongError) -> ValueError:
    """The refusal of an input longer than the positions of the model's position terms, naming the input (the
    sentence, or what its decoder reads) and what posattn-inspect can read instead."""
    net_input = sample["net_input"]
    sentence = "--sentence" if args.sentence is not None else f"sentence {args.index} of {args.gen_subset}"
    if is_encoder_decoder(model):
        source_limit, target_limit = model.max_positions()
        inputs = [(sentence, net_input["src_tokens"].size(1), source_limit, "--max-source-positions")]
        if origin is not None:
            inputs.append((DECODER_INPUTS[origin], net_input["prev_output_tokens"].size(1), target_limit,
                           "--max-target-positions"))
    else:
        inputs = [(sentence, net_input["src_tokens"].size(1), model.max_positions(), "--max-target-positions")]
    longer = [(what, length, limit, option) for what, length, limit, option in inputs if length > limit]
    if not longer:
        return ValueError(str(error))
    what, length, limit, option = longer[0]
    return ValueError(
        f"{what} has {length} tokens (BPE pieces and the end of sentence), more than the {limit} positions this "
        f"model's position terms were trained for ({option} {limit}), and they cannot read more. "
        f"posattn-inspect reads the sentence whole: give it one of at most {limit} tokens (--sentence, or --index "
        f"of a shorter sentence, and a --target that short), or retrain the model with a larger {option}")


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
    origin = None
    try:
        origin = add_decoder_input(model, task, sample, args.target, args.beam)
        inspection = inspect_model(model, task, sample, origin, args.positions)
    except SequenceTooLongError as error:
        raise too_long_for_positions(model, sample, origin, args, error) from None
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
