"""Command-line options of the position terms (SPEC.md section 9), their validation, and the
factory that turns one side's options into the position terms of each of its layers."""

import logging
from dataclasses import dataclass, field, fields, make_dataclass
from typing import Any, List, Tuple

from fairseq.dataclass import ChoiceEnum, FairseqDataclass
from fairseq.dataclass.utils import gen_parser_from_dataclass

from fairseq_posattn.modules.attention import PositionTerms
from fairseq_posattn.modules.position_terms.convolution import (
    ConvolvedAttention1d,
    ConvolvedAttention2d,
)
from fairseq_posattn.modules.position_terms.direct import (
    DirectAbsolutePositionBias,
    DirectRelativePositionBias,
)
from fairseq_posattn.modules.position_terms.distance_aware import DistanceAwareScaling
from fairseq_posattn.modules.position_terms.relative_embeddings import RelativePositionEmbeddings
from fairseq_posattn.modules.position_terms.structural import StructuralRelativeEmbeddings
from fairseq_posattn.modules.position_terms.temperature import LearnableTemperature

logger = logging.getLogger(__name__)

DIRECT_POSITION_CHOICES = ["none", "absolute", "relative", "both"]
DIRECT_POSITION_LAYER_CHOICES = ["first", "all"]
CONV_ATTENTION_CHOICES = ["none", "1d", "2d"]
STRUCTURAL_CHOICES = ["none", "absolute", "relative", "both"]
STRUCTURAL_FUSION_CHOICES = ["add", "nonlinear"]



class PositionOptionError(ValueError):
    """An impossible option value or combination, reported at start-up."""


def _side_fields(side: str) -> List[Tuple[str, Any, Any]]:
    """``(name, type, dataclass field)`` of every ``--{side}-*`` option of SPEC.md section 9."""
    what = "encoder self-attention" if side == "encoder" else "decoder (causal) self-attention"
    t = "--max-source-positions" if side == "encoder" else "--max-target-positions (LM: --tokens-per-sample)"

    def option(name: str, kind: Any, default: Any, help: str) -> Tuple[str, Any, Any]:
        return f"{side}_{name}", kind, field(default=default, metadata={"help": help})

    return [
        option("direct_position", ChoiceEnum(DIRECT_POSITION_CHOICES), "none",
               f"direct position interactions in the {what} (Dufter et al. 2020, 2.3), added to the "
               f"logits: a learnable t x t matrix per head (absolute, SAN+P), a vector over i - j per "
               f"head (relative, SAN+R) or both (SAN+P+R); t = {t}"),
        option("direct_position_layers", ChoiceEnum(DIRECT_POSITION_LAYER_CHOICES), "first",
               "layers with direct position interactions: first (as the paper) or all, each layer "
               "with its own parameters"),
        option("learnable_temperature", bool, False,
               f"learnable per-head temperatures gamma_q, gamma_k, gamma_v in every layer of the "
               f"{what} (Dufter et al. 2020, 2.4; +Temp)"),
        option("conv_attention", ChoiceEnum(CONV_ATTENTION_CHOICES), "none",
               f"convolve the post-softmax attention matrix in every layer of the {what} (Dufter et "
               f"al. 2020, 2.5): 1d (+Conv; t key channels, t = {t}) or 2d (+Conv2d; one k x k "
               f"filter per head)"),
        option("conv_attention_kernel", int, 3, "odd width k of the attention convolution"),
        option("distance_aware", bool, False,
               f"distance-aware attention in every layer of the {what} (Wu et al. 2021, "
               f"DA-Transformer): ReLU(QK^T) re-scaled by a learned function of |i - j| per head"),
        option("relative_positions", int, 0,
               f"Shaw et al. (2018) relative position representations with clip distance k in every "
               f"layer of the {what} (Transformer-RPR); 0 = off"),
    ]


def _structural_fields() -> List[Tuple[str, Any, Any]]:
    """The encoder-only structural options (Wang et al. 2019; SPEC.md section 6)."""
    return [
        ("encoder_structural_positions", ChoiceEnum(STRUCTURAL_CHOICES), field(default="none", metadata={
            "help": "structural positions of the source words from their dependency parse (Wang et "
                    "al. 2019; needs --task translation_structural): absolute = sinusoidal "
                    "embedding of the tree depth, relative = Shaw-style key/value embeddings of the "
                    "relative tree position in every encoder layer, or both"})),
        ("encoder_structural_fusion", ChoiceEnum(STRUCTURAL_FUSION_CHOICES), field(default="add", metadata={
            "help": "how the absolute structural embedding joins the sequential one: add (sum) or "
                    "nonlinear (tanh of a learned linear map of both)"})),
        ("encoder_structural_clip", int, field(default=16, metadata={
            "help": "clip r of the relative structural positions (Wang et al.: 16)"})),
    ]


EncoderPositionConfig = make_dataclass(
    "EncoderPositionConfig", _side_fields("encoder") + _structural_fields(), bases=(FairseqDataclass,))
DecoderPositionConfig = make_dataclass(
    "DecoderPositionConfig", _side_fields("decoder"), bases=(FairseqDataclass,))
SIDE_CONFIGS = {"encoder": EncoderPositionConfig, "decoder": DecoderPositionConfig}
#: per-side option name (without the side prefix) -> default
SIDE_OPTION_DEFAULTS = {
    f.name[len("decoder_"):]: f.default for f in fields(DecoderPositionConfig)
    if f.name.startswith("decoder_")
}
STRUCTURAL_OPTION_DEFAULTS = {
    f.name[len("encoder_"):]: f.default for f in fields(EncoderPositionConfig)
    if f.name.startswith("encoder_structural")
}


def add_position_args(parser: Any, side: str) -> None:
    """Add the ``--{side}-*`` options to an argparse model parser (legacy fairseq models).

    Defaults are left unset, as fairseq does for architectures: :func:`set_position_defaults`
    fills them, so presets can override them.
    """
    gen_parser_from_dataclass(parser, SIDE_CONFIGS[side](), delete_default=True)


def set_position_defaults(args: Any, sides: List[str]) -> None:
    """Fill every unset position option of ``sides`` with its default (architecture functions)."""
    for side in sides:
        defaults = dict(SIDE_OPTION_DEFAULTS, **(STRUCTURAL_OPTION_DEFAULTS if side == "encoder" else {}))
        for name, default in defaults.items():
            key = f"{side}_{name}"
            if getattr(args, key, None) is None:
                setattr(args, key, default)


@dataclass
class SidePositionOptions:
    """The position options of one side (``encoder`` or ``decoder``) and what they build."""

    side: str
    causal: bool
    max_positions: int
    max_positions_option: str
    direct_position: str = "none"
    direct_position_layers: str = "first"
    learnable_temperature: bool = False
    conv_attention: str = "none"
    conv_attention_kernel: int = 3
    distance_aware: bool = False
    relative_positions: int = 0
    structural_positions: str = "none"
    structural_fusion: str = "add"
    structural_clip: int = 16

    @classmethod
    def from_config(cls, cfg: Any, side: str, causal: bool, max_positions: int,
                    max_positions_option: str) -> "SidePositionOptions":
        defaults = dict(SIDE_OPTION_DEFAULTS, **(STRUCTURAL_OPTION_DEFAULTS if side == "encoder" else {}))
        values = {name: getattr(cfg, f"{side}_{name}", None) for name in defaults}
        values = {  # hydra configs hold choices as enum members: keep their string values
            name: defaults[name] if value is None else getattr(value, "value", value)
            for name, value in values.items()
        }
        options = cls(side=side, causal=causal, max_positions=max_positions,
                      max_positions_option=max_positions_option, **values)
        options.validate()
        return options

    def flag(self, name: str) -> str:
        return f"--{self.side}-{name.replace('_', '-')}"

    def validate(self) -> None:
        """Fail at start-up, naming the option to change, for impossible values or combinations."""
        if self.direct_position not in DIRECT_POSITION_CHOICES:
            raise PositionOptionError(
                f"{self.flag('direct_position')} must be one of {DIRECT_POSITION_CHOICES}, got {self.direct_position!r}")
        if self.direct_position_layers not in DIRECT_POSITION_LAYER_CHOICES:
            raise PositionOptionError(
                f"{self.flag('direct_position_layers')} must be one of {DIRECT_POSITION_LAYER_CHOICES}, "
                f"got {self.direct_position_layers!r}")
        if self.direct_position == "none" and self.direct_position_layers != "first":
            raise PositionOptionError(
                f"{self.flag('direct_position_layers')} {self.direct_position_layers} has no effect without "
                f"{self.flag('direct_position')}; add {self.flag('direct_position')} absolute|relative|both "
                f"or drop {self.flag('direct_position_layers')}")
        if self.conv_attention not in CONV_ATTENTION_CHOICES:
            raise PositionOptionError(
                f"{self.flag('conv_attention')} must be one of {CONV_ATTENTION_CHOICES}, got {self.conv_attention!r}")
        k = self.conv_attention_kernel
        if k < 1 or k % 2 == 0:
            raise PositionOptionError(
                f"{self.flag('conv_attention_kernel')} must be an odd positive width (3, 5, ...), got {k}")
        if self.conv_attention == "none" and k != SIDE_OPTION_DEFAULTS["conv_attention_kernel"]:
            raise PositionOptionError(
                f"{self.flag('conv_attention_kernel')} {k} has no effect without "
                f"{self.flag('conv_attention')} 1d|2d; add it or drop the kernel option")
        if self.relative_positions < 0:
            raise PositionOptionError(
                f"{self.flag('relative_positions')} is a clip distance k >= 1 (0 = off), got {self.relative_positions}")
        if self.structural_positions not in STRUCTURAL_CHOICES:
            raise PositionOptionError(
                f"{self.flag('structural_positions')} must be one of {STRUCTURAL_CHOICES}, got {self.structural_positions!r}")
        if self.structural_fusion not in STRUCTURAL_FUSION_CHOICES:
            raise PositionOptionError(
                f"{self.flag('structural_fusion')} must be one of {STRUCTURAL_FUSION_CHOICES}, got {self.structural_fusion!r}")
        if self.structural_clip < 1:
            raise PositionOptionError(f"{self.flag('structural_clip')} must be >= 1, got {self.structural_clip}")
        needs_t = self.direct_position != "none" or self.conv_attention == "1d"
        if needs_t and self.max_positions < 1:
            raise PositionOptionError(f"{self.max_positions_option} must be positive, got {self.max_positions}")
        if self.conv_attention == "1d" and self.max_positions > 256:
            logger.warning(
                "%s 1d builds a t x t x k filter bank per head with t = %s = %d; consider a smaller %s",
                self.flag("conv_attention"), self.max_positions_option, self.max_positions,
                self.max_positions_option)

    def is_active(self) -> bool:
        """True when some layer of the side gets a position term (else it is fairseq's own)."""
        return (
            self.direct_position != "none" or self.learnable_temperature or self.distance_aware
            or self.conv_attention != "none" or self.relative_positions > 0
            or self.structural_relative
        )

    def needs_context(self) -> bool:
        """True when the side runs its own layer loop with a per-batch :class:`PositionContext`:
        some layer has a position term, or the input gets the structural embedding."""
        return self.is_active() or self.structural_positions != "none"

    @property
    def structural_absolute(self) -> bool:
        return self.structural_positions in ("absolute", "both")

    @property
    def structural_relative(self) -> bool:
        return self.structural_positions in ("relative", "both")

    def build_terms(self, layer_index: int, num_heads: int, head_dim: int) -> PositionTerms:
        """The position terms of layer ``layer_index`` (0-based) of this side."""
        terms = PositionTerms()
        t, option = self.max_positions, self.max_positions_option
        direct_here = self.direct_position != "none" and (
            self.direct_position_layers == "all" or layer_index == 0
        )
        if direct_here and self.direct_position in ("absolute", "both"):
            terms.additive.append(DirectAbsolutePositionBias(num_heads, t, option))
        if direct_here and self.direct_position in ("relative", "both"):
            terms.additive.append(DirectRelativePositionBias(num_heads, t, option))
        if self.learnable_temperature:
            terms.temperature = LearnableTemperature(num_heads, head_dim)
        if self.distance_aware:
            terms.scaling = DistanceAwareScaling(num_heads)
        if self.relative_positions > 0:
            terms.key_value.append(RelativePositionEmbeddings(head_dim, self.relative_positions))
        if self.structural_relative:
            terms.key_value.append(StructuralRelativeEmbeddings(head_dim, self.structural_clip))
        k = self.conv_attention_kernel
        if self.conv_attention == "2d":
            terms.post_softmax = ConvolvedAttention2d(num_heads, k, self.causal)
        elif self.conv_attention == "1d":
            terms.post_softmax = ConvolvedAttention1d(num_heads, k, self.causal, t, option)
        return terms
