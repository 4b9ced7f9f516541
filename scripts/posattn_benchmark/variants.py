"""The models the benchmark compares, and the performance targets their ratios are checked against.

Every variant of every registered position method (``PositionMethod.variants`` in
:mod:`posattn.position_terms.registry`) gets a translation row, with the method on
every side it takes, and, where the method takes the decoder, a language-model row (``lm-`` prefix)
with it on the causal decoder; its ratio target is the one of the method's ``benchmark_target``.
Combinations that are no single method's variant (SAN+P+R, the structural variants, which need real
trees) and the vanilla references are listed here. The Hugging Face group's rows (``hf-`` prefix) are every
variant of every method a causal model takes, each as the keyword options of
``posattn_huggingface.apply_position_method`` on a Llama; which of them the front-end refuses, its worker finds
by trying (nothing here imports transformers). The plain-PyTorch group's rows (``pt-`` prefix) are the layer
without a method and every variant of every method a causal layer takes, each as the keyword options of
``posattn.position_options``.
"""

from dataclasses import dataclass
from typing import Any, Callable, Dict, FrozenSet, List, Mapping, Optional, Tuple

from posattn.position_terms.catalogue import variant_flags, variant_label
from posattn.position_terms.registry import REGISTRY, PositionMethod, methods_of

VANILLA_ARCH = "transformer_iwslt_de_en"
POSATTN_ARCH = "transformer_posattn_iwslt_de_en"
VANILLA_LM_ARCH = "transformer_lm"
POSATTN_LM_ARCH = "transformer_lm_posattn"
TRANSLATION = "translation"
LANGUAGE_MODELING = "language_modeling"
#: the Hugging Face group's task: transformers' Llama, the reference on SDPA with its own RoPE
HUGGINGFACE = "huggingface"
LLAMA_ARCH = "LlamaForCausalLM"
#: the plain-PyTorch group's task: causal ``posattn.SelfAttention`` layers against a hand-written module of the same
#: projections on ``F.scaled_dot_product_attention(..., is_causal=True)``
PYTORCH = "pytorch"
SDPA_MODULE_ARCH = "SDPA module"
SELF_ATTENTION_ARCH = "posattn.SelfAttention"


@dataclass(frozen=True)
class Variant:
    """One model configuration: a key for ``--variants``, a paper-style label and its flags."""

    name: str
    label: str
    flags: Tuple[str, ...] = ()
    arch: str = POSATTN_ARCH

    @property
    def task(self) -> str:
        """The fairseq task the model is built for (a language model or a translation model), or the Hugging
        Face group's."""
        if self.arch == LLAMA_ARCH:
            return HUGGINGFACE
        if self.arch in (SDPA_MODULE_ARCH, SELF_ATTENTION_ARCH):
            return PYTORCH
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
#: beam-search speed bound of the structural variants (relative to vanilla; above 1 is faster)
STRUCTURAL_SPEED = 0.95
#: registry variants whose bound differs from their method's: the 1d convolution's t x t channels, and the
#: structural ones' beam search
VARIANT_TARGETS: Dict[str, Target] = {
    "conv-1d": Target(time=1.20, memory=1.15),
    **{name: Target(TARGETS_BY_KIND["key_value"].time, TARGETS_BY_KIND["key_value"].memory, STRUCTURAL_SPEED)
       for name in ("struct-rel", "struct-rel-keys-only")},
}
#: decoding speed bound of every model with decoder terms (incremental decoding, relative to vanilla)
DECODER_SPEED = 0.90
#: the greedy decoding group's bound where a step transforms the attention matrix over the cached rows
#: (the convolutions): a step's fixed costs weigh most at short contexts
POST_SOFTMAX_GREEDY_SPEED = 0.75

#: the Hugging Face group's bound on greedy generation with the cache (relative to the reference's speed)
HUGGINGFACE_SPEED = 0.90
#: the plain-PyTorch group's bound of the layer without a method (time and memory): SDPA's own causal kernel
NO_METHOD_TARGET = Target(time=1.05, memory=1.05)

VANILLA = Variant("vanilla", "Transformer (fairseq)", arch=VANILLA_ARCH)
VANILLA_LM = Variant("vanilla-lm", "Transformer LM (fairseq)", arch=VANILLA_LM_ARCH)
VANILLA_LLAMA = Variant("hf-llama", "Llama (transformers, SDPA, its RoPE)", arch=LLAMA_ARCH)
VANILLA_SDPA = Variant("pt-sdpa", "SDPA module (hand-written, is_causal=True)", arch=SDPA_MODULE_ARCH)
#: the baseline that every model of a task is compared with
REFERENCES: Dict[str, Variant] = {TRANSLATION: VANILLA, LANGUAGE_MODELING: VANILLA_LM, HUGGINGFACE: VANILLA_LLAMA,
                                  PYTORCH: VANILLA_SDPA}


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
        label, target = variant_label(name), method_target(method, name)
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
        (Variant("struct-both", "Structural abs + rel", (structural, "both")), structural_relative),
    ]


def huggingface_options() -> Dict[str, Mapping[str, Any]]:
    """The keyword options of every Hugging Face row by name (``apply_position_method(model, **options)``): the
    front-end without a method, and every variant of every method a causal model (Llama) takes."""
    options: Dict[str, Mapping[str, Any]] = {"hf-no-method": {}}
    for method in methods_of("decoder"):
        options.update((f"hf-{name}", values) for name, values in method.variants.items())
    return options


#: ``apply_position_method``'s keyword options of each Hugging Face row
HUGGINGFACE_OPTIONS = huggingface_options()


def huggingface_rows() -> List[Tuple[Variant, Target]]:
    """The Hugging Face group's rows, their flags the keyword options as written in Python; the train-step time
    bound of the method's kind of term (additive 1.05, explicit-path 1.10, as the fairseq rows) and the
    generation speed bound. Without a method: no target (the front-end's own cost)."""
    rows = [(Variant("hf-no-method", "posattn_huggingface, no method", arch=LLAMA_ARCH), Target())]
    for method in methods_of("decoder"):
        for name in method.variants:
            options = HUGGINGFACE_OPTIONS[f"hf-{name}"]
            flags = tuple(f"{option}={value!r}" for option, value in options.items())
            rows.append((Variant(f"hf-{name}", variant_label(name), flags, LLAMA_ARCH),
                         Target(time=method_target(method, name).time, speed=HUGGINGFACE_SPEED)))
    return rows


def pytorch_options() -> Dict[str, Mapping[str, Any]]:
    """The keyword options of every plain-PyTorch row by name (``posattn.position_options(True, **options)``): no
    method, and every variant of every method a causal layer takes."""
    options: Dict[str, Mapping[str, Any]] = {"pt-no-method": {}}
    for method in methods_of("decoder"):
        options.update((f"pt-{name}", values) for name, values in method.variants.items())
    return options


#: the keyword options of each plain-PyTorch row
PYTORCH_OPTIONS = pytorch_options()


def pytorch_rows() -> List[Tuple[Variant, Target]]:
    """The plain-PyTorch group's rows, their flags the keyword options as written in Python: the layer without a
    method (bound :data:`NO_METHOD_TARGET`), and every variant of every causal method with its kind's time and
    memory bounds (as the fairseq rows)."""
    rows = [(Variant("pt-no-method", "posattn.SelfAttention, no method", arch=SELF_ATTENTION_ARCH), NO_METHOD_TARGET)]
    for method in methods_of("decoder"):
        for name in method.variants:
            flags = tuple(f"{option}={value!r}" for option, value in PYTORCH_OPTIONS[f"pt-{name}"].items())
            target = method_target(method, name)
            rows.append((Variant(f"pt-{name}", variant_label(name), flags, SELF_ATTENTION_ARCH),
                         Target(time=target.time, memory=target.memory)))
    return rows


def all_rows() -> List[Tuple[Variant, Target]]:
    """Every benchmarked variant with its target: defaults and combinations, the registry's variants
    in registration order, the structural variants, the Hugging Face rows, the plain-PyTorch rows."""
    rows = combination_rows()
    for method in REGISTRY.values():
        rows += registry_rows(method)
    return rows + structural_rows() + huggingface_rows() + pytorch_rows()


ROWS = all_rows()
VARIANTS_BY_NAME: Dict[str, Variant] = {variant.name: variant for variant, _ in ROWS}
if len(VARIANTS_BY_NAME) != len(ROWS):
    raise ValueError("two benchmark variants share a name: rename a registry variant")
TARGETS: Dict[str, Target] = {variant.name: target for variant, target in ROWS
                              if target != Target()}
#: the greedy decoding group's speed bound of the language models whose terms transform the attention matrix
GREEDY_SPEED: Dict[str, float] = {
    f"lm-{name}": POST_SOFTMAX_GREEDY_SPEED for method in REGISTRY.values() if method.benchmark_target == "post_softmax"
    for name in method.variants}
#: beam search of the structural and two sequential translation models, and of every language model
#: with decoder terms (every method's decoder variant and SAN+P+R); greedy generation of every Hugging Face row
DEFAULT_DECODE_VARIANTS = ("struct-abs", "struct-rel", "struct-both", "dec-san-p-r", "distance-aware",
                           *(name for name in VARIANTS_BY_NAME if name.startswith("lm-") and name != "lm-defaults"),
                           *(name for name in VARIANTS_BY_NAME if name.startswith("hf-")))

#: the smallest sizes of a language model whose kernel paths :func:`cuda_training_paths` reads
TINY_LM_SIZE = ("--decoder-embed-dim", "16", "--decoder-ffn-embed-dim", "32", "--decoder-attention-heads", "2",
                "--decoder-layers", "1", "--tokens-per-sample", "16")


def cuda_training_paths(variant: Variant) -> FrozenSet[str]:
    """The kernel paths a language-model variant's attention layers take in a CUDA training step, as
    each layer derives them from its terms' declarations (a tiny model is built on the CPU; nothing runs)."""
    import torch
    from fairseq.data import Dictionary
    from fairseq_posattn.models.building import DictionaryTask, build_model
    from fairseq_posattn.modules.attention import PositionAwareMultiheadAttention

    dictionary = Dictionary()
    model = build_model(["--task", LANGUAGE_MODELING, "--arch", variant.arch, *TINY_LM_SIZE, *variant.flags],
                        DictionaryTask(dictionary, dictionary)).train()
    return frozenset(layer.path(False, torch.device("cuda"), decoding=False)[0]
                     for layer in model.modules() if isinstance(layer, PositionAwareMultiheadAttention))


def each_method() -> List[str]:
    """The first declared variant of every registered method (its translation row)."""
    return [next(iter(method.variants)) for method in REGISTRY.values() if method.variants]


def lm_each_kernel_path() -> List[str]:
    """Per registered method that takes the decoder, the language-model row of the first of its
    variants to take each set of CUDA kernel paths (e.g. Shaw's with values: explicit; keys only: flex)."""
    names = []
    for method in REGISTRY.values():
        seen = set()
        for name in method.variants:
            variant = VARIANTS_BY_NAME.get(f"lm-{name}")
            if variant is not None and (paths := cuda_training_paths(variant)) not in seen:
                seen.add(paths)
                names.append(variant.name)
    return names


#: names ``--variants`` also takes, each standing for the variants it derives from the registry
VARIANT_SETS: Dict[str, Callable[[], List[str]]] = {"each-method": each_method,
                                                      "lm-each-kernel-path": lm_each_kernel_path}


def expand_variant_sets(names: List[str]) -> List[str]:
    """``names`` with every name of :data:`VARIANT_SETS` replaced by the variants it stands for."""
    return [expanded for name in names
            for expanded in (VARIANT_SETS[name]() if name in VARIANT_SETS else [name])]
