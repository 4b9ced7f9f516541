"""Each side records its position options in the weights, so that a checkpoint never silently becomes
another model.

fairseq-train resumes from the ``checkpoint_last.pt`` of its ``--save-dir`` (and ``--finetune-from-model``
loads any checkpoint) whenever the weights fit the model built from the command line. Several methods
add no parameter (ALiBi, RoPE, structural absolute positions with ``add``), so the quickstart's baseline,
resumed with ``--encoder-structural-positions absolute``, would train on and be saved as a structural
model: one row of Wang et al.'s Table 1 silently another. :class:`PositionOptionsRecord` is a child
module of every position-aware side whose one buffer holds the side's position flags; loading weights
whose record differs from the model's is refused, naming both, unless ``--{side}-reset-position-options``
says that this is meant (fine-tuning one method from another). Weights saved before the record existed
load as before. Initialisation options and the kernel choice do not make another model and are left out.
"""

from typing import Any, Dict, List

import torch
from torch import nn

from fairseq_posattn.models.position_options import PositionOptionError, side_defaults

#: options that do not change the function a trained model computes
NOT_RECORDED_SUFFIXES = ("_init",)
NOT_RECORDED = ("attention_kernel", "reset_position_options")


def recorded_flags(options: Any) -> str:
    """The side's non-default position flags as a command line would give them ("" for none)."""
    flags: List[str] = []
    for name, default in side_defaults(options.side).items():
        value = options.values[name]
        if name in NOT_RECORDED or name.endswith(NOT_RECORDED_SUFFIXES) or value == default:
            continue
        flags += [options.flag(name)] + ([] if value is True else [str(value)])
    return " ".join(flags)


class PositionOptionsRecord(nn.Module):
    """The side's position flags as a buffer ``flags`` (their UTF-8 bytes, as int64 so that fairseq's
    checkpoint averaging, which sums and floor-divides integer tensors, keeps them), checked when
    weights load."""

    def __init__(self, options: Any):
        super().__init__()
        self.side = options.side
        self.reset = bool(options.values.get("reset_position_options", False))
        self.register_buffer("flags", encode(recorded_flags(options)))

    def _load_from_state_dict(self, state_dict: Dict[str, Any], prefix: str, *args: Any, **kwargs: Any) -> None:
        key = prefix + "flags"
        saved = state_dict.get(key)
        if saved is None or self.reset:  # weights from before the record, or a change that is meant
            state_dict[key] = self.flags.clone()
        elif decode(saved) != decode(self.flags):
            raise PositionOptionError(
                f"the checkpoint's {self.side} was trained with position options "
                f"'{decode(saved) or '(none)'}' and this command builds '{decode(self.flags) or '(none)'}': "
                f"give the checkpoint's options (or another --save-dir for a new model), or add "
                f"--{self.side}-reset-position-options to fine-tune it into the new one")
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)


def encode(text: str) -> torch.Tensor:
    return torch.tensor(list(text.encode("utf-8")), dtype=torch.long)


def decode(flags: torch.Tensor) -> str:
    return bytes(flags.tolist()).decode("utf-8")
