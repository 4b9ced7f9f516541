"""The ``--{side}-*`` options of the position methods in fairseq: its option dataclasses, the argparse options
of the legacy models and the architectures' defaults, generated from the side's options of the library
(:mod:`posattn.position_options`, from the registry's declarations).

Nothing here names a method.
"""

from dataclasses import field, make_dataclass
from typing import Any, List, Tuple

from fairseq.dataclass import ChoiceEnum, FairseqDataclass
from fairseq.dataclass.utils import gen_parser_from_dataclass

from posattn.position_options import side_defaults, side_options
from posattn.position_terms.registry import MethodOption

__all__ = ["add_position_args", "set_position_defaults", "EncoderPositionConfig", "DecoderPositionConfig"]

#: the option that sets t, as help texts name it (the models pass the exact one at build time)
T_OPTION = {"encoder": "--max-source-positions", "decoder": "--max-target-positions (LM: --tokens-per-sample)"}
WHAT = {"encoder": "encoder self-attention", "decoder": "decoder (causal) self-attention"}


def _field(side: str, option: MethodOption) -> Tuple[str, Any, Any]:
    kind = ChoiceEnum(list(option.choices)) if option.choices else type(option.default)
    help_text = option.help.format(side=side, what=WHAT[side], t=T_OPTION[side])
    return f"{side}_{option.name}", kind, field(default=option.default, metadata={"help": help_text})


def _side_config(side: str) -> type:
    fields = [_field(side, option) for option in side_options(side)]
    return make_dataclass(f"{side.capitalize()}PositionConfig", fields, bases=(FairseqDataclass,))


EncoderPositionConfig = _side_config("encoder")
DecoderPositionConfig = _side_config("decoder")
SIDE_CONFIGS = {"encoder": EncoderPositionConfig, "decoder": DecoderPositionConfig}


def add_position_args(parser: Any, side: str) -> None:
    """Add the ``--{side}-*`` options to an argparse model parser (legacy fairseq models).

    Defaults are left unset, as fairseq does for architectures: :func:`set_position_defaults`
    fills them, so presets can override them.
    """
    gen_parser_from_dataclass(parser, SIDE_CONFIGS[side](), delete_default=True)


def set_position_defaults(args: Any, sides: List[str]) -> None:
    """Fill every unset position option of ``sides`` with its default (architecture functions)."""
    for side in sides:
        for name, default in side_defaults(side).items():
            if getattr(args, f"{side}_{name}", None) is None:
                setattr(args, f"{side}_{name}", default)


