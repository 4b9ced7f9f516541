"""Each side records the options that make its function in the weights, so that a checkpoint never silently
becomes another model.

fairseq-train resumes from the ``checkpoint_last.pt`` of its ``--save-dir`` (and ``--finetune-from-model``
loads any checkpoint) whenever the weights fit the model built from the command line. Many options add no
parameter (ALiBi, RoPE, structural absolute positions with ``add``, ``--encoder-no-token-positional-embeddings``,
the LSTM's normaliser N, the classifier's pooling, the activation, pre- or post-norm...), so the quickstart's
baseline, resumed with ``--encoder-structural-positions absolute``, would train on and be saved as a structural
model: one row of Wang et al.'s Table 1 silently another.

:class:`PositionOptionsRecord` is a child module of every side of every model of the plugin (the transformer's
encoder and decoder, the language models', the classifier's and the tagger's encoder, the LSTM language
models' decoder). Its one buffer holds, as JSON, the side's options: every option its model declares (its
``add_args`` or dataclass) that changes what it computes (all but :data:`NOT_RECORDED`), the options named
``{side}_*`` on their side and the model's other options on its first side, plus what a family derives
(the LSTM's N). :func:`record_model_options` fills it when a model is built. Loading weights whose record
differs from the model's, in an option both know, is refused, naming each difference, unless
``--{side}-reset-position-options`` says that this is meant (fine-tuning one model into another). Weights
saved before the record existed load as before; so do those whose record holds only the side's position
flags (the record's first form), which are compared as they were.
"""

import argparse
import contextlib
import functools
import inspect
import json
from typing import Any, Dict, Iterator, List, Optional, Tuple

import torch
from omegaconf import OmegaConf
from torch import nn

from posattn.position_options import PositionOptionError, side_defaults
from posattn.position_terms.registry import SIDES

#: options that do not change the function a trained model computes: the attention kernel and its self-check,
#: the reset itself, activation checkpointing and FSDP wrapping, ONNX export and the TPU switch
#: (the language models' --tokens-per-sample, too: the LSTM's N is recorded as what it is, below), and the
#: position limit t (a model tied to its positions has parameters of that size, which the weights' shapes
#: check; fairseq-eval-lm's --model-overrides raises it on purpose)
NOT_RECORDED = ("attention_kernel", "attention_self_check", "reset_position_options", "checkpoint_activations",
                "offload_activations", "min_params_to_wrap", "export", "tpu", "tokens_per_sample",
                "max_source_positions", "max_target_positions", "max_positions")
#: ... and those named so: initialisation and pretrained embeddings (replaced by the weights), regularisation
#: that acts only in training (dropout, LayerDrop, quantisation noise) and the layers LayerDrop prunes at
#: inference (fairseq's --model-overrides)
NOT_RECORDED_SUFFIXES = ("_init", "_embed_path", "layerdrop", "layers_to_keep")
NOT_RECORDED_PARTS = ("dropout", "quant_noise")
#: fairseq's commands that train: there a changed model is fine-tuned with the reset flag
TRAINING_ADVICE = ("give the checkpoint's options (or another --save-dir for a new model), or add {reset} to "
                   "fine-tune it into the new one (and --reset-optimizer where the two methods' parameters differ)")
#: everywhere else (fairseq-generate, -eval-lm, -validate, -interactive, the hub) the options come from the
#: checkpoint, changed only by overrides
LOADING_ADVICE = ("load it with the options it was trained with (drop them from --model-overrides, or from the "
                  "keyword arguments of from_pretrained), or also override {override} to load its weights into "
                  "the other model")

_trainer_loads = False
#: whether the trainer's load also loads the checkpoint's optimizer state (no --reset-optimizer)
_optimizer_loads = False


def is_recorded(name: str) -> bool:
    """Whether option ``name`` (``dropout``, ``encoder_alibi``, or ``alibi`` of a side) changes what a trained
    model computes."""
    bare = without_side(name)
    return not (bare in NOT_RECORDED or name.endswith(NOT_RECORDED_SUFFIXES)
                or any(part in bare for part in NOT_RECORDED_PARTS))


def without_side(name: str) -> str:
    """``encoder_alibi`` -> ``alibi``; a name without a side's prefix as it is."""
    side, _, rest = name.partition("_")
    return rest if side in SIDES else name


def recorded_flags(options: Any) -> str:
    """The side's non-default position flags as a command line would give them ("" for none): the record's
    first form, still compared for the weights it was saved with."""
    flags: List[str] = []
    for name, default in side_defaults(options.side).items():
        value = options.values[name]
        if not is_recorded(name) or value == default:
            continue
        flags += [options.flag(name)] + ([] if value is True else [str(value)])
    return " ".join(flags)


class PositionOptionsRecord(nn.Module):
    """The side's options as a buffer ``flags`` (the UTF-8 bytes of their JSON, as int64 so that fairseq's
    checkpoint averaging, which sums and floor-divides integer tensors, keeps them), checked when weights
    load. ``flag_names`` names each recorded option as a command line gives it."""

    def __init__(self, side: str, reset: bool = False, legacy_flags: Optional[str] = None):
        super().__init__()
        self.side, self.reset, self.legacy_flags = side, reset, legacy_flags
        self.values: Dict[str, Any] = {}
        self.flag_names: Dict[str, str] = {}
        self.register_buffer("flags", encode(json.dumps(self.values)))

    @classmethod
    def of_side(cls, options: Any) -> "PositionOptionsRecord":
        """The record of a position-aware side, holding its position options (``SidePositionOptions``)."""
        record = cls(options.side, bool(options.values.get("reset_position_options", False)),
                     legacy_flags=recorded_flags(options))
        record.record({f"{options.side}_{name}": (options.flag(name), value)
                       for name, value in options.values.items() if is_recorded(name)})
        return record

    def record(self, options: Dict[str, Tuple[str, Any]]) -> None:
        """Add ``name -> (flag, value)`` options to the record."""
        for name, (flag, value) in options.items():
            self.values[name] = json.loads(json.dumps(value, default=str))  # as it comes back from the buffer
            self.flag_names[name] = flag
        self.flags = encode(json.dumps(self.values, sort_keys=True))

    def _load_from_state_dict(self, state_dict: Dict[str, Any], prefix: str, *args: Any, **kwargs: Any) -> None:
        key = prefix + "flags"
        saved = state_dict.get(key)
        if saved is not None and not self.reset:  # else weights from before the record, or a change that is meant
            self.check(decode(saved))
        state_dict[key] = self.flags.clone()  # this model's record, whatever form (or none) the weights have
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def check(self, saved: str) -> None:
        """Refuse a saved record that differs from this one in an option both know."""
        if not saved.startswith("{"):  # the first form: the side's non-default position flags
            if self.legacy_flags is not None and saved != self.legacy_flags:
                self.refuse(f"position options '{saved or '(none)'}' in the checkpoint, "
                            f"'{self.legacy_flags or '(none)'}' here")
            return
        old = json.loads(saved)
        changed = [name for name in sorted(old.keys() & self.values.keys())
                   if None not in (old[name], self.values[name]) and old[name] != self.values[name]]
        if changed:
            self.refuse(", ".join(f"{self.flag_names[name]}: {shown(old[name])} in the checkpoint, "
                                  f"{shown(self.values[name])} here" for name in changed))

    def refuse(self, differences: str) -> None:
        """Raise the refusal, with the advice that works where the weights load (:func:`trainer_loads`)."""
        if _trainer_loads:
            built = "this command builds"
            advice = TRAINING_ADVICE.format(reset=f"--{self.side}-reset-position-options")
        else:
            built = "the model built to load it"
            advice = LOADING_ADVICE.format(override=f"{{'{self.side}_reset_position_options': True}}")
        raise PositionOptionError(f"the checkpoint's {self.side} was trained with other options than {built} "
                                  f"({differences}), which would change what it computes: {advice}")


def shown(value: Any) -> str:
    """An option's value as the refusal names it."""
    if isinstance(value, bool):
        return "on" if value else "off"
    return str(value)


def record_model_options(model: nn.Module, args: Any) -> None:
    """Record, in the records of ``model``'s sides, every option its class declares that changes what it
    computes, with the value it was built with (``args``, which fairseq's ``build_model`` has completed with
    the architecture's defaults): ``{side}_*`` options on their side, the others on the model's first side.
    Every family's ``build_model`` ends here (``PosattnHubMixin``)."""
    records = list(side_records(model))
    options: Dict[PositionOptionsRecord, Dict[str, Tuple[str, Any]]] = {record: {} for record in records}
    for name, (flag, default) in declared_options(type(model)).items():
        if is_recorded(name):
            for record in owners(name, records):
                options[record][name] = (flag, option_value(args, name, default))
    for record, recorded in options.items():
        record.record(recorded)


def side_records(model: nn.Module) -> Iterator[PositionOptionsRecord]:
    """The records of ``model``'s sides, the first side's first."""
    return (module for module in model.modules() if isinstance(module, PositionOptionsRecord))


def owners(name: str, records: List[PositionOptionsRecord]) -> List[PositionOptionsRecord]:
    """The records that hold option ``name``: its side's, or the model's first for an option of no side."""
    if without_side(name) == name:
        return records[:1]
    return [record for record in records if name.startswith(f"{record.side}_")]


@functools.lru_cache(maxsize=None)
def declared_options(model_class: type) -> Dict[str, Tuple[str, Any]]:
    """Option name -> (flag, default) of every option ``model_class`` declares (its ``add_args``, or fairseq's
    from its dataclass). The default stands for an option that the config does not hold (a flag that the
    model reads with ``getattr(args, name, False)``)."""
    parser = argparse.ArgumentParser(add_help=False)
    model_class.add_args(parser)
    return {action.dest: (action.option_strings[-1], action.default)
            for action in parser._actions if action.option_strings}


def option_value(args: Any, name: str, default: Any) -> Any:
    """Option ``name`` of a model's config (an argparse namespace or a hydra config; a choice as its string),
    ``default`` where the config does not hold it, None where a hydra interpolation does not resolve (a config
    outside its command's, which is not compared)."""
    if OmegaConf.is_config(args):
        value = OmegaConf.select(args, name, default=default, throw_on_resolution_failure=False)
    else:
        value = getattr(args, name, default)
    return getattr(value, "value", value)


def encode(text: str) -> torch.Tensor:
    return torch.tensor(list(text.encode("utf-8")), dtype=torch.long)


def decode(flags: torch.Tensor) -> str:
    return bytes(flags.tolist()).decode("utf-8")


@contextlib.contextmanager
def trainer_loads(optimizer: bool = False) -> Iterator[None]:
    """Marks fairseq's ``Trainer.load_checkpoint`` (fairseq-train's resume and ``--finetune-from-model``), where
    a refusal advises the reset flag; every other load takes the checkpoint's own options. ``optimizer``: the load
    restores the checkpoint's optimizer state too."""
    global _trainer_loads, _optimizer_loads
    before = _trainer_loads, _optimizer_loads
    _trainer_loads, _optimizer_loads = True, optimizer
    try:
        yield
    finally:
        _trainer_loads, _optimizer_loads = before


def optimizer_state_loads() -> bool:
    """Whether the load in progress restores the checkpoint's optimizer state (fairseq-train without
    ``--reset-optimizer``), which needs the checkpoint's parameters."""
    return _optimizer_loads


def install() -> None:
    """Wrap fairseq's ``Trainer.load_checkpoint`` in :func:`trainer_loads` (once per process)."""
    from fairseq.trainer import Trainer

    original = Trainer.load_checkpoint
    if getattr(original, "marks_training_loads", False):
        return

    signature = inspect.signature(original)

    @functools.wraps(original)
    def load_checkpoint(self: Any, *args: Any, **kwargs: Any) -> Any:
        call = signature.bind(self, *args, **kwargs)
        call.apply_defaults()
        with trainer_loads(optimizer=not call.arguments["reset_optimizer"]):
            return original(self, *args, **kwargs)

    load_checkpoint.marks_training_loads = True  # type: ignore[attr-defined]
    Trainer.load_checkpoint = load_checkpoint
