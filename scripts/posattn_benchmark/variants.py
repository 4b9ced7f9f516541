"""The models the benchmark compares, and the performance targets their ratios are checked against.

Every variant of every registered position method (``PositionMethod.variants`` in
:mod:`fairseq_posattn.modules.position_terms.registry`) gets a translation row, with the method on
every side it takes, and, where the method takes the decoder, a language-model row (``lm-`` prefix)
with it on the causal decoder; its ratio target is the one of the method's ``benchmark_target``.
Combinations that are no single method's variant (SAN+P+R, the structural variants, which need real
trees) and the vanilla references are listed here.
"""

from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Tuple

from fairseq_posattn.modules.position_terms.registry import REGISTRY, PositionMethod, variant_flags

VANILLA_ARCH = "transformer_iwslt_de_en"
POSATTN_ARCH = "transformer_posattn_iwslt_de_en"
VANILLA_LM_ARCH = "transformer_lm"
POSATTN_LM_ARCH = "transformer_lm_posattn"
TRANSLATION = "translation"
LANGUAGE_MODELING = "language_modeling"


@dataclass(frozen=True)
class Variant:
    """One model configuration: a key for ``--variants``, a paper-style label and its flags."""

    name: str
    label: str
    flags: Tuple[str, ...] = ()
    arch: str = POSATTN_ARCH

    @property
    def structural(self) -> bool:
        """True when the model reads the source's structural side data (``src_structure``)."""
        return "--encoder-structural-positions" in self.flags

    @property
    def task(self) -> str:
        """The fairseq task the model is built for: a language model or a translation model."""
        return LANGUAGE_MODELING if self.arch.startswith("transformer_lm") else TRANSLATION


@dataclass(frozen=True)
class Target:
    """Performance targets of a variant: largest time and memory ratios, smallest speed ratio."""

    time: Optional[float] = None
    memory: Optional[float] = None
    speed: Optional[float] = None


#: the second performance issue's bounds by kind of term (a method's ``benchmark_target``):
#: additive biases stay on the fused path, a temperature only rescales, and the scaling, relative
#: key/value and post-softmax terms materialise (length x length) matrices
TARGETS_BY_KIND: Dict[str, Target] = {
    "additive": Target(time=1.05, memory=1.05),
    "temperature": Target(time=1.05, memory=1.05),
    "scaling": Target(time=1.10, memory=1.10),
    "key_value": Target(time=1.10, memory=1.10),
    "post_softmax": Target(time=1.10, memory=1.10),
}
#: registry variants whose bound is wider than their method's: the 1d convolution's t x t channels
VARIANT_TARGETS: Dict[str, Target] = {"conv-1d": Target(time=1.20, memory=1.15)}
#: beam-search speed bound of the structural variants (relative to vanilla; above 1 is faster)
STRUCTURAL_SPEED = 0.95
#: decoding speed bound of every model with decoder terms (incremental decoding, relative to vanilla)
DECODER_SPEED = 0.90

#: paper-style labels of the registry's variants; a variant without one is labelled by its name
LABELS: Dict[str, str] = {
    "direct-absolute": "SAN+P", "direct-relative": "SAN+R", "direct-both-all-layers": "SAN+P+R, all layers",
    "temperature": "+Temp", "conv-1d": "+Conv", "conv-2d": "+Conv2d", "conv-2d-k5": "+Conv2d (k=5)",
    "distance-aware": "DA-Transformer", "shaw": "Transformer-RPR", "t5-bias": "T5 relative bias",
    "alibi": "ALiBi", "rotary": "RoPE",
}

VANILLA = Variant("vanilla", "Transformer (fairseq)", arch=VANILLA_ARCH)
VANILLA_LM = Variant("vanilla-lm", "Transformer LM (fairseq)", arch=VANILLA_LM_ARCH)
#: the baseline that every model of a task is compared with
REFERENCES: Dict[str, Variant] = {TRANSLATION: VANILLA, LANGUAGE_MODELING: VANILLA_LM}


def side_flags(sides: Tuple[str, ...], values: Mapping[str, Any]) -> Tuple[str, ...]:
    """The flags of a variant's option values on each of ``sides``."""
    return tuple(flag for side in sides for flag in variant_flags(side, values))


def method_target(method: PositionMethod, variant_name: str) -> Target:
    """The bound of a registry variant: its own, else its method's kind of term."""
    return VARIANT_TARGETS.get(variant_name, TARGETS_BY_KIND[method.benchmark_target])


def registry_rows(method: PositionMethod) -> List[Tuple[Variant, Target]]:
    """A translation row per variant of ``method`` (on every side it takes) and, when it takes the
    decoder, a language-model row (on the decoder), each with its target."""
    rows = []
    for name, values in method.variants.items():
        label, target = LABELS.get(name, name), method_target(method, name)
        if "decoder" in method.sides:  # decodes incrementally with its terms
            target = Target(target.time, target.memory, DECODER_SPEED)
        rows.append((Variant(name, label, side_flags(method.sides, values)), target))
        if "decoder" in method.sides:
            rows.append((Variant(f"lm-{name}", label, side_flags(("decoder",), values), POSATTN_LM_ARCH),
                         target))
    return rows


def combination_rows() -> List[Tuple[Variant, Target]]:
    """The architectures' defaults and SAN+P+R (Dufter et al. 2020) on the first layer of one side."""
    additive = TARGETS_BY_KIND[REGISTRY["direct-position"].benchmark_target]
    decoding = Target(additive.time, additive.memory, DECODER_SPEED)
    return [
        (Variant("defaults", "transformer_posattn, defaults"), Target()),
        (Variant("san-p-r", "SAN+P+R", ("--encoder-direct-position", "both")), additive),
        (Variant("dec-san-p-r", "SAN+P+R, decoder", ("--decoder-direct-position", "both")), decoding),
        (Variant("lm-defaults", "transformer_lm_posattn, defaults", arch=POSATTN_LM_ARCH), Target()),
        (Variant("lm-san-p-r", "SAN+P+R", ("--decoder-direct-position", "both"), POSATTN_LM_ARCH), decoding),
    ]


def structural_rows() -> List[Tuple[Variant, Target]]:
    """The structural variants (Wang et al. 2019), whose sources carry the side data of real trees:
    the bound of their kind of term, and a beam-search speed bound."""
    additive = TARGETS_BY_KIND["additive"]
    structural_kind = TARGETS_BY_KIND[REGISTRY["structural-positions"].benchmark_target]
    structural_absolute = Target(additive.time, additive.memory, STRUCTURAL_SPEED)
    structural_relative = Target(structural_kind.time, structural_kind.memory, STRUCTURAL_SPEED)
    structural = "--encoder-structural-positions"
    return [
        (Variant("struct-abs", "Structural abs (add)", (structural, "absolute")), structural_absolute),
        (Variant("struct-abs-nonlinear", "Structural abs (nonlinear)",
                 (structural, "absolute", "--encoder-structural-fusion", "nonlinear")), structural_absolute),
        (Variant("struct-rel", "Structural rel (r=16)", (structural, "relative")), structural_relative),
        (Variant("struct-both", "Structural abs + rel", (structural, "both")), structural_relative),
    ]


def all_rows() -> List[Tuple[Variant, Target]]:
    """Every benchmarked variant with its target: defaults and combinations, the registry's variants
    in registration order, the structural variants."""
    rows = combination_rows()
    for method in REGISTRY.values():
        rows += registry_rows(method)
    return rows + structural_rows()


ROWS = all_rows()
VARIANTS_BY_NAME: Dict[str, Variant] = {variant.name: variant for variant, _ in ROWS}
if len(VARIANTS_BY_NAME) != len(ROWS):
    raise ValueError("two benchmark variants share a name: rename a registry variant")
TARGETS: Dict[str, Target] = {variant.name: target for variant, target in ROWS
                              if target != Target()}
#: beam search of the structural and two sequential translation models, and of every language model
#: with decoder terms (every method's decoder variant and SAN+P+R)
DEFAULT_DECODE_VARIANTS = ("struct-abs", "struct-rel", "struct-both", "dec-san-p-r", "distance-aware",
                           *(name for name in VARIANTS_BY_NAME if name.startswith("lm-") and name != "lm-defaults"))
