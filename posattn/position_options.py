"""The options of one side of a model (encoder or decoder) and what they build, from the registry's declarations.

Every registered method's options (:mod:`posattn.position_terms.registry`) with the side's own
(:data:`KERNEL_OPTIONS`), their validation, and the factory that turns one side's options into the position
terms of each of its layers. Front-ends read them from their own configurations (the fairseq plugin: the
``--{side}-*`` options); Python code builds them with :func:`position_options` (keyword arguments: the
command-line options' names without the side, their values and defaults; docs/methods.md lists them).

Nothing here names a method: :meth:`SidePositionOptions.build_terms` iterates over the registered methods.
"""

from typing import Any, Dict, List, Optional, Tuple

from posattn import position_terms  # noqa: F401  (registers every method)
from posattn.attention import KERNEL_CHOICES, PositionTerms, flex_attention
from posattn.kernel_self_check import SELF_CHECK_CHOICES
from posattn.position_terms.base import SequenceTooLongError
from posattn.position_terms.registry import (
    SIDES,
    LayerSpec,
    MethodOption,
    PositionMethod,
    PositionOptionError,
    method_of,
    methods_of,
    options_of,
)
from posattn.position_terms.side_inputs import BatchSideData, InputPositionEmbedding

__all__ = ["PositionOptionError", "SidePositionOptions", "position_options", "side_defaults", "side_options",
           "KERNEL_OPTIONS"]

#: the options of the side itself (its kernel, its checkpoints), not of a method
KERNEL_OPTIONS = (
    MethodOption("attention_kernel", "auto",
                 "kernel of the {what}: auto (fairseq's fused attention or SDPA where the position terms "
                 "allow it, flex_attention on CUDA where every term has a score_mod form, else the "
                 "explicit path), explicit (reference and inspection) or flex (wherever the terms allow it; "
                 "on the CPU flex_attention's unfused implementation)", choices=KERNEL_CHOICES),
    MethodOption("attention_self_check", "warn",
                 "the first time a configuration of the {what} takes a fused kernel (flex_attention, SDPA) in a "
                 "process, compare it with the explicit path on a random batch (outputs and, in training, "
                 "gradients): on a mismatch warn and take the explicit path from then on, stop with an error, "
                 "or do not check (off)", choices=SELF_CHECK_CHOICES),
    MethodOption("reset_position_options", False,
                 "load weights whose model was trained with other options that change what it computes (the "
                 "position options of the {what}, position embeddings, ...; fine-tuning one method from "
                 "another); refused otherwise, so that a resumed checkpoint never silently becomes another model"),
)


def side_options(side: str) -> List[MethodOption]:
    """Every ``--{side}-*`` option: the kernel's and the methods'."""
    return [*KERNEL_OPTIONS, *options_of(side)]


def side_defaults(side: str) -> Dict[str, Any]:
    """Option name (without the side prefix) -> default, for every method ``side`` can take."""
    return {option.name: option.default for option in side_options(side)}


class SidePositionOptions:
    """The position options of one side (``encoder`` or ``decoder``) and what they build.

    Every registered option of the side is an attribute (``options.<name>``: the option without the side);
    ``causal``, ``max_positions`` (t) and ``max_positions_option`` (the option that sets t) come from the model.
    Modules shared by a side's layers (a method's side-wide table) are kept in ``shared``.
    """

    def __init__(self, side: str, causal: bool, max_positions: int, max_positions_option: str, **values: Any):
        if side not in SIDES:
            raise ValueError(f"side must be one of {SIDES}, got {side!r}")
        defaults = side_defaults(side)
        unknown = set(values) - set(defaults)
        if unknown:
            raise TypeError(f"no {side} position option {sorted(unknown)}; known: {sorted(defaults)}")
        self.side, self.causal = side, causal
        self.max_positions, self.max_positions_option = max_positions, max_positions_option
        self.values = dict(defaults, **values)
        self.shared: Dict[str, Any] = {}
        #: the methods these (fixed) values switch on, and whether a term keeps parameters per position
        self._methods = tuple(method for method in methods_of(side) if method.is_on(self))
        self._needs_max_positions = any(method.needs_max_positions(self) for method in self._methods)

    def __getattr__(self, name: str) -> Any:
        values = self.__dict__.get("values", {})
        if name in values:
            return values[name]
        raise AttributeError(f"{type(self).__name__} has no option {name!r}")

    @classmethod
    def from_config(cls, cfg: Any, side: str, causal: bool, max_positions: int,
                    max_positions_option: str) -> "SidePositionOptions":
        """Read and validate the ``{side}_*`` options from a fairseq config (namespace or hydra)."""
        values = {}
        for name, default in side_defaults(side).items():
            value = getattr(cfg, f"{side}_{name}", None)
            # hydra configs hold choices as enum members: keep their string values
            values[name] = default if value is None else getattr(value, "value", value)
        options = cls(side, causal, max_positions, max_positions_option, **values)
        options.validate()
        return options

    def flag(self, name: str) -> str:
        return f"--{self.side}-{name.replace('_', '-')}"

    def methods(self) -> List[PositionMethod]:
        """The registered methods that this side's options switch on, in registration order."""
        return list(self._methods)

    def validate(self) -> None:
        """Fail at start-up, naming the option to change, for impossible values or combinations."""
        if self.attention_kernel not in KERNEL_CHOICES:
            raise PositionOptionError(f"{self.flag('attention_kernel')} must be one of {list(KERNEL_CHOICES)}, "
                                      f"got {self.attention_kernel!r}")
        for method in methods_of(self.side):
            for option in method.options:
                value = self.values[option.name]
                if option.choices and value not in option.choices:
                    raise PositionOptionError(
                        f"{self.flag(option.name)} must be one of {list(option.choices)}, got {value!r}")
            method.validate(self)
        if self.needs_max_positions() and self.max_positions < 1:
            raise PositionOptionError(f"{self.max_positions_option} must be positive, got {self.max_positions}")

    def needs_context(self) -> bool:
        """True when some method is on: the side then runs its own layer loop with a per-batch
        position context (else it is fairseq's own)."""
        return bool(self._methods)

    def needs_max_positions(self) -> bool:
        """True when some term keeps parameters per position up to t."""
        return self._needs_max_positions

    def check_length(self, length: int) -> None:
        """Refuse a batch longer than t, naming the option to raise (once per batch, by the side)."""
        if self.needs_max_positions() and length > self.max_positions:
            raise SequenceTooLongError(
                f"a sequence of {length} tokens is longer than the {self.max_positions} positions of the "
                f"{self.side}'s position terms; retrain with a larger {self.max_positions_option} (at "
                f"least {length}) or drop longer inputs (fairseq's --skip-invalid-size-inputs-valid-test)")

    def side_data(self) -> List[Tuple[str, BatchSideData]]:
        """The data that the methods on read from every batch beside its tokens, each with the option that
        asks for it (as errors name it)."""
        return [(method.asked_by(self), method.side_data) for method in self._methods
                if method.side_data is not None]

    def check_task(self, task: Any) -> None:
        """Refuse, at start-up, a task that does not collate the side data the methods on read: a task names
        the ``net_input`` keys it collates in ``collated_side_data``."""
        collated = getattr(task, "collated_side_data", ())
        for asked_by, data in self.side_data():
            if data.key not in collated:
                raise PositionOptionError(f"{asked_by} needs {data.what}, which the task {type(task).__name__} does "
                                          f"not collate: use {data.task}")

    def input_embedding(self, embed_dim: int, padding_idx: int,
                        sequential: bool) -> Optional[InputPositionEmbedding]:
        """The position embedding that a method on gives the side's input (None: the side's own), at most one."""
        built = [(method, method.input_embedding(self, embed_dim, padding_idx, sequential)) for method in self._methods]
        found = [(method, module) for method, module in built if module is not None]
        if len(found) > 1:
            raise PositionOptionError(f"{found[0][0].asked_by(self)} and {found[1][0].asked_by(self)} each replace "
                                      "the input's position embedding; keep one")
        return found[0][1] if found else None

    def build_terms(self, layer_index: int, num_heads: int, head_dim: int) -> PositionTerms:
        """The position terms of layer ``layer_index`` (0-based) of this side."""
        terms = PositionTerms(kernel=self.attention_kernel, self_check=self.attention_self_check,
                              where=f"{self.side} self-attention, layer {layer_index}", causal=self.causal,
                              max_positions=self.max_positions)
        layer = LayerSpec(layer_index, num_heads, head_dim, self.shared)
        for method in self.methods():
            for term in method.terms(self, layer):
                terms.add(term)
        if self.attention_kernel == "flex":
            self._check_flex(terms)
        return terms

    def build_layer(self, layer_index: int, num_heads: int, head_dim: int) -> Tuple[PositionTerms, Dict[str, Any]]:
        """:meth:`build_terms`, and the side-wide modules (:attr:`shared`) that this layer's terms made, by name:
        the first layer to read one makes it, and a model registers it there, once."""
        before = set(self.shared)
        terms = self.build_terms(layer_index, num_heads, head_dim)
        return terms, {name: module for name, module in self.shared.items() if name not in before}

    def _check_flex(self, terms: PositionTerms) -> None:
        """``--{side}-attention-kernel flex`` needs flex_attention and terms with pointwise forms."""
        if flex_attention is None:
            raise PositionOptionError(f"{self.flag('attention_kernel')} flex needs torch >= 2.5 "
                                      f"(torch.nn.attention.flex_attention); use auto or explicit")
        if terms.row_dependent is not None:
            raise PositionOptionError(f"{self.flag('attention_kernel')} flex: "
                                      f"{method_of(terms.row_dependent).asked_by(self)} computes its bias from the "
                                      "whole attention row; use auto or explicit")
        needs_matrix = [term for term in (terms.post_softmax, *terms.key_value)
                        if term is not None and (term is terms.post_softmax or term.values)]
        if needs_matrix:
            asking = sorted({method_of(term).asked_by(self) for term in needs_matrix})
            keys_only = [self.flag(option.name) for method in methods_of(self.side) for option in method.options
                         if option.keys_only]
            raise PositionOptionError(
                f"{self.flag('attention_kernel')} flex: {' and '.join(asking)} "
                f"{'need' if len(asking) > 1 else 'needs'} the whole attention matrix (a post-softmax transform, a "
                f"value term); use auto, or drop "
                f"{'them' if len(asking) > 1 else 'it'} (a value term: add {' / '.join(keys_only)})")


def position_options(causal: bool, max_positions: int = 1024, **values: Any) -> SidePositionOptions:
    """The validated options of a side built from Python: ``causal`` picks the side (a decoder's, else an
    encoder's); ``max_positions`` is t, the longest sequence the terms that keep parameters per position take;
    ``values`` are the side's options by the command-line name without the side, ``-`` written ``_``
    (``attention_kernel="explicit"``; every method's are in docs/methods.md), the others at their defaults.
    A value or combination that the command line refuses is refused with the same message."""
    side = "decoder" if causal else "encoder"
    options = SidePositionOptions(side, causal, max_positions, "max_positions", **values)
    options.validate()
    return options


def layer_options(options: Optional[SidePositionOptions], causal: bool, max_positions: int,
                  method_options: Dict[str, Any]) -> SidePositionOptions:
    """A layer's options: ``options`` (a model's, shared by its layers; built for ``causal``), or those of
    ``method_options`` (:func:`position_options`)."""
    if options is None:
        return position_options(causal, max_positions, **method_options)
    if method_options:
        raise TypeError(f"give the method's options either in options or as keywords, not both: "
                        f"{sorted(method_options)}")
    if options.causal != causal:
        raise ValueError(f"options built for causal={options.causal}, the layer asked for causal={causal}")
    return options
