"""The options of one side of a model (encoder or decoder) and what they build, from the registry's declarations.

Every registered method's options (:mod:`posattn.position_terms.registry`) with the side's own
(:data:`KERNEL_OPTIONS`), their validation, and the factory that turns one side's options into the position
terms of each of its layers. Front-ends read them from their own configurations (the fairseq plugin: the
``--{side}-*`` options); Python code builds them with :func:`position_options` (keyword arguments: the
command-line options' names without the side, their values and defaults; docs/methods.md lists them).

Options given from Python get the types and values the command line enforces (:func:`checked_value`, from each
option's default and choices), and :func:`describe_options` lists them where docs/methods.md is not at hand.

Nothing here names a method: :meth:`SidePositionOptions.build_terms` iterates over the registered methods.
"""

import difflib
import numbers
import re
import textwrap
from typing import Any, Dict, List, Optional, Tuple

from posattn import position_terms  # noqa: F401  (registers every method)
from posattn.attention import KERNEL_CHOICES, PositionTerms, flex_functions
from posattn.errors import ArgumentError, MisuseError
from posattn.kernel_self_check import SELF_CHECK_CHOICES
from posattn.position_terms.base import SequenceTooLongError
from posattn.position_terms.registry import (
    SIDES,
    LayerSpec,
    MethodOption,
    PositionMethod,
    REGISTRY,
    PositionOptionError,
    method_of,
    methods_of,
    options_of,
)
from posattn.position_terms.side_inputs import BatchSideData, InputPositionEmbedding

__all__ = ["OptionTypeError", "PositionOptionError", "SidePositionOptions", "describe_options", "position_options",
           "side_defaults", "side_options", "KERNEL_OPTIONS", "TOO_LONG_IN_PYTORCH"]

#: whether a side's layers are causal (:func:`position_options` picks the side from ``causal``)
CAUSALITY = {"encoder": "bidirectional", "decoder": "causal"}

#: the remedy that :meth:`SidePositionOptions.check_length` gives by default, in plain PyTorch (a front-end gives
#: its own: the fairseq plugin's names its options); formatted with ``option`` (the option that sets t),
#: ``length`` (the sequence's) and ``limit`` (t)
TOO_LONG_IN_PYTORCH = ("build the layers with a larger {option} (at least {length}), or crop the input to at most "
                       "{limit} tokens")


class OptionTypeError(PositionOptionError, TypeError):
    """An option the side does not take, or a value of another type than the command line's (a flag given
    ``"False"``, an integer option ``2.5``)."""

#: the options of the side itself (its kernel, its layers' methods, its checkpoints), not of a method
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
    MethodOption("layer_methods", "",
                 "the methods of each layer of the {what}, as comma-separated entries repeated over the side's "
                 "layers: layer l takes entry l mod their number, a side of another number of layers cut at its "
                 "last (with M and N two methods, M,M,M,none is M in layers 0-2, none in layer 3, M in 4-6...); "
                 "an entry is registered method names joined by + (M+N), or none; each method named must be "
                 "switched on by its own options, and each method on must be named in some layer; empty: every "
                 "method on in every layer"),
    MethodOption("reset_position_options", False,
                 "load weights whose model was trained with other options that change what it computes (the "
                 "position options of the {what}, position embeddings, ...; fine-tuning one method from "
                 "another); refused otherwise, so that a resumed checkpoint never silently becomes another model"),
)


#: ``layer_methods``' syntax: what separates its entries, what joins an entry's methods, the entry of no method
LAYER_SEPARATOR, METHOD_JOINER, NO_METHOD = ",", "+", "none"
#: the width at which a method's input position embedding is built to ask whether the options give one
PROBE_WIDTH = 4


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
            raise ArgumentError(f"side must be one of {list(SIDES)}, got {side!r}")
        self.side, self.causal = side, causal
        self.max_positions, self.max_positions_option = max_positions, max_positions_option
        options = {option.name: option for option in side_options(side)}
        unknown = sorted(set(values) - set(options))
        if unknown:
            raise OptionTypeError(unknown_option(side, unknown[0]))
        self.values = {name: option.default for name, option in options.items()}
        self.values.update((name, checked_value(options[name], value, self.flag(name)))
                           for name, value in values.items())
        self.shared: Dict[str, Any] = {}
        #: the sizes ``(heads, head_dim)`` and indices of the layers built by :meth:`build_layer` (a model's layers)
        self._layers: Dict[int, Tuple[int, int]] = {}
        #: the methods these (fixed) values switch on, and whether a term keeps parameters per position
        self._methods = tuple(method for method in methods_of(side) if method.is_on(self))
        self._needs_max_positions = any(method.needs_max_positions(self) for method in self._methods)
        #: ``layer_methods`` parsed: the method names of each entry (() for none); () when every layer takes all
        self._layer_pattern = self._parsed_layer_methods()

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
        for option in side_options(self.side):
            value = self.values[option.name]
            if option.choices and value not in option.choices:
                raise PositionOptionError(
                    f"{self.flag(option.name)} must be one of {list(option.choices)}, got {value!r}")
        for method in methods_of(self.side):
            method.validate(self)
        if self.needs_max_positions() and self.max_positions < 1:
            raise PositionOptionError(f"{self.max_positions_option} must be positive, got {self.max_positions}")
        self._check_layer_methods()

    def _parsed_layer_methods(self) -> Tuple[Tuple[str, ...], ...]:
        """``layer_methods`` as the method names of each entry (() for ``none``), or () when it is empty; a name
        that is no method of the side, an empty entry, ``none`` joined to a method or a method named twice in an
        entry is refused."""
        text = self.values["layer_methods"].strip()
        if not text:
            return ()
        said = f"{self.flag('layer_methods')} {text}"
        pattern = []
        for position, entry in enumerate(text.split(LAYER_SEPARATOR)):
            names = tuple(name.strip() for name in entry.split(METHOD_JOINER))
            if names == (NO_METHOD,):
                pattern.append(())
                continue
            for name in names:
                if name not in {method.name for method in methods_of(self.side)}:
                    raise PositionOptionError(f"{said}: entry {position} ({entry.strip()!r}) "
                                              f"{self._not_a_method(name)}")
            if len(set(names)) < len(names):
                raise PositionOptionError(f"{said}: entry {position} ({entry.strip()!r}) names a method twice")
            pattern.append(names)
        return tuple(pattern)

    def _not_a_method(self, name: str) -> str:
        """Why ``name`` cannot be in an entry of ``layer_methods``, and what can."""
        if not name:
            return f"is empty: an entry is method names joined by {METHOD_JOINER}, or {NO_METHOD}"
        if name == NO_METHOD:
            return f"joins {NO_METHOD} (a layer without a method) to a method: write one or the other"
        taking = REGISTRY.get(name)
        if taking is not None:
            return (f"names {name}, a method of {' and '.join(CAUSALITY[side] for side in taking.sides)} sides "
                    f"only, not of this {CAUSALITY[self.side]} ({self.side}) one")
        names = [method.name for method in methods_of(self.side)]
        close = difflib.get_close_matches(name, names, n=3)
        nearest = f" (nearest: {', '.join(close)})" if close else ""
        return (f"names {name!r}, which is no registered method{nearest}; the {self.side}'s are "
                f"{', '.join(names)}, or {NO_METHOD}")

    def _check_layer_methods(self) -> None:
        """Refuse ``layer_methods`` beside a method that gives the side's input a position embedding (which every
        layer reads), naming a method that is off, or naming no layer for a method that is on (it would be
        unused)."""
        if not self._layer_pattern:
            return
        said = f"{self.flag('layer_methods')} {self.layer_methods}"
        for method in self._methods:
            if method.input_embedding(self, PROBE_WIDTH, 0, True) is not None:
                raise PositionOptionError(
                    f"{said}: {method.asked_by(self)} gives the side's input a position embedding, which every "
                    "layer reads and no layer can leave out; drop one of the two")
        named = {name for entry in self._layer_pattern for name in entry}
        for method in methods_of(self.side):
            if method.name in named and method not in self._methods:
                raise PositionOptionError(f"{said} names {method.name}, which is off: switch it on with its own "
                                          f"options ({self.flag(method.options[0].name)} ...), or name it nowhere")
        for method in self._methods:
            if method.name not in named:
                raise PositionOptionError(f"{said} names {method.name} in no layer, where {method.asked_by(self)} "
                                          "switches it on (it would be unused): name it in some layer's entry, "
                                          "or switch it off")

    def methods_of_layer(self, layer_index: int) -> List[PositionMethod]:
        """The methods on in layer ``layer_index`` (0-based), in registration order: every method on, or those
        that ``layer_methods``' entry of the layer names (the entries repeated as a period)."""
        if not self._layer_pattern:
            return self.methods()
        entry = self._layer_pattern[layer_index % len(self._layer_pattern)]
        return [method for method in self._methods if method.name in entry]

    def check_layer_count(self, num_layers: int) -> None:
        """Refuse ``layer_methods`` that names a method on only in entries past the side's ``num_layers`` layers
        (it would be unused); a front-end that knows the number calls it once it has built them."""
        used = {method.name for index in range(num_layers) for method in self.methods_of_layer(index)}
        for method in self._methods:
            if method.name not in used:
                raise PositionOptionError(
                    f"{self.flag('layer_methods')} {self.layer_methods} names {method.name} only past the side's "
                    f"{num_layers} layers (entries 0 to {num_layers - 1}), where {method.asked_by(self)} "
                    "switches it on (it would be unused): name it in an entry of theirs, or switch it off")

    def needs_context(self) -> bool:
        """True when some method is on: the side then runs its own layer loop with a per-batch
        position context (else it is fairseq's own)."""
        return bool(self._methods)

    def needs_max_positions(self) -> bool:
        """True when some term keeps parameters per position up to t."""
        return self._needs_max_positions

    def check_length(self, length: int, remedy: str = TOO_LONG_IN_PYTORCH) -> None:
        """Refuse a batch longer than t, naming the option to raise (once per batch, by the side); ``remedy`` is
        the front-end's advice (:data:`TOO_LONG_IN_PYTORCH`: plain PyTorch's), with the fields named there."""
        if self.needs_max_positions() and length > self.max_positions:
            advice = remedy.format(option=self.max_positions_option, length=length, limit=self.max_positions)
            raise SequenceTooLongError(
                f"a sequence of {length} tokens is longer than the {self.max_positions} positions of the "
                f"{self.side}'s position terms; {advice}")

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
        for method in self.methods_of_layer(layer_index):
            built = method.terms(self, layer)
            if self._layer_pattern and not built:
                raise PositionOptionError(
                    f"{self.flag('layer_methods')} {self.layer_methods} names {method.name} in layer {layer_index}, "
                    f"for which its own options ({method.asked_by(self)} ...) build no term (the method chooses its "
                    "layers): let its options give it every layer, or leave it out of that layer's entry")
            for term in built:
                terms.add(term)
        readers = [term for term in terms.logit_matrix if term.reads_bias]
        if readers and not terms.additive:
            raise PositionOptionError(
                f"{method_of(readers[0]).asked_by(self)} reads the additive biases of the logits, and layer "
                f"{layer_index} of the {self.side} self-attention has none: turn on a method that adds a bias (an "
                "additive bias, docs/design.md's kinds of term) in that layer")
        if self.attention_kernel == "flex":
            self._check_flex(terms)
        return terms

    def build_layer(self, layer_index: Optional[int], num_heads: int,
                    head_dim: int) -> Tuple[PositionTerms, Dict[str, Any]]:
        """:meth:`build_terms`, and the side-wide modules (:attr:`shared`) that this layer's terms made, by name:
        the first layer to read one makes it, and a model registers it there, once. With side-wide modules, the
        options belong to one model of one layer size: a layer index built twice (a second model) or a layer of
        other sizes is refused (it would read modules that another model registers, or of other sizes).
        ``layer_index`` None (not given) is layer 0, and refused with ``layer_methods`` (every layer would be
        layer 0)."""
        if layer_index is None:
            if self._layer_pattern:
                raise MisuseError(f"layer_methods={self.layer_methods!r} gives the {self.side}'s layers different "
                                  "methods, but the layer was built without its layer_index: give each layer its "
                                  "0-based layer_index=i")
            layer_index = 0
        self._check_layer(layer_index, num_heads, head_dim)
        before = set(self.shared)
        terms = self.build_terms(layer_index, num_heads, head_dim)
        return terms, {name: module for name, module in self.shared.items() if name not in before}

    def _check_layer(self, layer_index: int, num_heads: int, head_dim: int) -> None:
        """:meth:`build_layer`'s refusals (its docstring), before anything is built."""
        first = next(iter(self._layers.values()), (num_heads, head_dim))
        if self.shared and layer_index in self._layers:
            raise MisuseError(
                f"these {self.side} options already built layer {layer_index}, whose model registers their "
                f"side-wide modules ({', '.join(sorted(self.shared))}): a model's layers share one "
                "position_options(...), each index once; build another for another model")
        if self.shared and (num_heads, head_dim) != first:
            raise MisuseError(
                f"these {self.side} options' side-wide modules ({', '.join(sorted(self.shared))}) were built for "
                f"layers of {first[0]} heads of size {first[1]}, not {num_heads} of size {head_dim}: layers of "
                "other sizes need their own position_options(...)")
        self._layers[layer_index] = (num_heads, head_dim)

    def _check_flex(self, terms: PositionTerms) -> None:
        """``--{side}-attention-kernel flex`` needs flex_attention and terms with pointwise forms."""
        if flex_functions() is None:
            raise PositionOptionError(f"{self.flag('attention_kernel')} flex needs torch >= 2.5 "
                                      "(torch.nn.attention.flex_attention) with dynamo (on Python 3.13: torch >= 2.6); "
                                      "use auto or explicit")
        if terms.row_dependent is not None:
            raise PositionOptionError(f"{self.flag('attention_kernel')} flex: "
                                      f"{method_of(terms.row_dependent).asked_by(self)} computes its bias from the "
                                      "whole attention row; use auto or explicit")
        if terms.content is not None:
            raise PositionOptionError(f"{self.flag('attention_kernel')} flex: "
                                      f"{method_of(terms.content).asked_by(self)} computes the content logits itself "
                                      "(it has no pointwise form); use auto or explicit")
        if terms.logit_matrix:
            raise PositionOptionError(f"{self.flag('attention_kernel')} flex: "
                                      f"{method_of(terms.logit_matrix[0]).asked_by(self)} transforms every head's "
                                      "matrix of logits at once; use auto or explicit")
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


#: t when a layer or side is built without ``max_positions``
DEFAULT_MAX_POSITIONS = 1024


def position_options(causal: bool, max_positions: int = DEFAULT_MAX_POSITIONS, **values: Any) -> SidePositionOptions:
    """The validated options of a side built from Python: ``causal`` picks the side (a decoder's, else an
    encoder's); ``max_positions`` is t, the longest sequence the terms that keep parameters per position take;
    ``values`` are the side's options by the command-line name without the side, ``-`` written ``_``
    (``attention_kernel="explicit"``), the others at their defaults: :func:`describe_options` lists every
    option of a side with its values, default and meaning (docs/methods.md has the equations).

    Each value has the command line's type (a flag True or False, an integer option an int, a choice one of its
    strings), and a value or combination that the command line refuses is refused with the same message
    (:class:`PositionOptionError`; a name the side does not take or a value of another type:
    :class:`OptionTypeError`). One object is shared by a model's layers (``options=``), which then share its
    side-wide modules (docs/pytorch.md)."""
    check_flag("causal", causal)
    check_count("max_positions", max_positions)
    side = "decoder" if causal else "encoder"
    options = SidePositionOptions(side, causal, max_positions, "max_positions", **values)
    options.validate()
    return options


def layer_options(options: Optional[SidePositionOptions], causal: bool, max_positions: Optional[int],
                  method_options: Dict[str, Any]) -> SidePositionOptions:
    """A layer's options: ``options`` (a model's, shared by its layers; built for ``causal`` and, where given,
    ``max_positions``), or those of ``method_options`` (:func:`position_options`)."""
    check_flag("causal", causal)
    if options is None:
        return position_options(causal, DEFAULT_MAX_POSITIONS if max_positions is None else max_positions,
                                **method_options)
    if not isinstance(options, SidePositionOptions):
        raise ArgumentError(f"options must be the SidePositionOptions of posattn.position_options(...), got a "
                            f"{type(options).__name__}; give a method's options as keywords instead")
    if method_options:
        raise MisuseError(f"options= and the method's keywords {sorted(method_options)} were both given: give the "
                          "method's options in position_options(...) (shared by a model's layers) or as keywords, "
                          "not both")
    if options.causal != causal:
        raise MisuseError(
            f"options built for a {CAUSALITY[options.side]} side (position_options(causal={options.causal})) given to "
            f"a layer built with causal={causal}: build the layer with causal={options.causal}, or the options with "
            f"position_options(causal={causal}, ...)")
    if max_positions is not None and max_positions != options.max_positions:
        raise MisuseError(f"max_positions={max_positions} given with options built for max_positions="
                          f"{options.max_positions}: t is the options' (position_options(causal, max_positions, "
                          "...)); leave max_positions out")
    return options


def check_flag(name: str, value: Any) -> None:
    """Refuse a ``name`` argument that is not True or False (a truthy string would pass for True)."""
    if not isinstance(value, bool):
        raise ArgumentError(f"{name} must be True or False, got {value!r} ({type(value).__name__})")


def check_count(name: str, value: Any) -> None:
    """Refuse a ``name`` argument that is not a positive integer (a size)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ArgumentError(f"{name} must be a positive integer, got {value!r}")


def checked_value(option: MethodOption, value: Any, flag: str) -> Any:
    """``value`` of ``option`` with the type the command line gives it (its default's: a flag's bool, an int, a
    float; a choice's string), or a one-line :class:`OptionTypeError` naming it and ``flag``. Its value (a
    choice, a range) is the side's :meth:`~SidePositionOptions.validate`'s."""
    kind = type(option.default)
    if kind is bool:
        if isinstance(value, bool):
            return value
        expected = "True or False"
    elif kind is int:
        if isinstance(value, numbers.Integral) and not isinstance(value, bool):
            return int(value)
        expected = "an integer"
    elif kind is float:
        if isinstance(value, numbers.Real) and not isinstance(value, bool):
            return float(value)
        expected = "a number"
    elif isinstance(value, kind):
        return value
    else:
        expected = f"one of {list(option.choices)}" if option.choices else f"a {kind.__name__}"
    raise OptionTypeError(f"{option.name}={value!r}: the option {option.name} ({flag}) takes {expected}, not a "
                          f"{type(value).__name__}")


def unknown_option(side: str, name: str) -> str:
    """The refusal of ``name``, which ``side`` does not take: an option of the other side's methods only, or of
    none (with the nearest names)."""
    taking = [method for method in REGISTRY.values() if name in {option.name for option in method.options}]
    if taking:
        method = taking[0]
        sides = " and ".join(f"{CAUSALITY[taker]} ({taker})" for taker in method.sides)
        only = f"{CAUSALITY[method.sides[0]]}-only" if len(method.sides) == 1 else f"for {sides} sides"
        causal = side == "encoder"
        return (f"{name}: {method.name} ({method.citation}) is {only}, and a {CAUSALITY[side]} ({side}) side "
                f"takes no {name}: build the layer with causal={causal}, or leave {name} out")
    close = difflib.get_close_matches(name, side_defaults(side), n=3)
    nearest = f" (nearest: {', '.join(close)})" if close else ""
    return (f"no {side} position option {name!r}{nearest}; posattn.describe_options({side!r}) lists every option "
            "of the side")


def describe_options(side: Optional[str] = None) -> str:
    """Every position option of ``side`` (``"encoder"``: bidirectional layers, ``"decoder"``: causal ones; None:
    both) as a text table, from the registry: each method with its paper, then each option's keyword, values,
    default and meaning; what docs/methods.md's table says, where it is not installed.
    ``print(posattn.describe_options("decoder"))``."""
    if side not in (None, *SIDES):
        raise ArgumentError(f"side must be one of {list(SIDES)} or None (both), got {side!r}")
    blocks = []
    for shown in SIDES if side is None else (side,):
        lines = [f"{shown} options (causal={shown == 'decoder'}): the keywords of position_options, SelfAttention "
                 "and position_method; t is max_positions"]
        groups = [("the side's kernel", "", KERNEL_OPTIONS)]
        groups += [(method.name, method.citation, method.options) for method in methods_of(shown)]
        for name, citation, options in groups:
            lines.append(f"  {name}" + (f" ({citation})" if citation else ""))
            lines += [line for option in options for line in _described(option, shown)]
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks)


def _described(option: MethodOption, side: str) -> List[str]:
    """:func:`describe_options`' lines of ``option``: its keyword, values and default; its meaning in Python's
    words (the keywords instead of the command-line flags)."""
    if option.choices:
        values = " | ".join(repr(choice) for choice in option.choices)
    elif isinstance(option.default, bool):
        values = "True | False"
    else:
        values = type(option.default).__name__
    meaning = option.help.format(side=side, what=f"{side} ({CAUSALITY[side]}) self-attention", t="max_positions")
    meaning = re.sub(rf"--{side}-([a-z0-9-]+)", lambda found: found.group(1).replace("-", "_"), meaning)
    return [f"    {option.name}: {values}, default {option.default!r}",
            textwrap.fill(meaning, width=110, initial_indent=" " * 8, subsequent_indent=" " * 8)]
