"""The registry of position methods: one declaration per method, in the file of its term.

A :class:`PositionMethod` says everything the rest of the library and its front-ends need to know about a
method:

- its options (a side's :class:`~posattn.position_options.SidePositionOptions`, the keyword arguments of
  :func:`~posattn.position_options.position_options`, and in a front-end its command-line options
  ``--{side}-{name}``, all generated from them);
- its validation, raising :class:`PositionOptionError` with the option to change;
- the position terms it builds for one layer of a side (the kernel sorts them by kind);
- whether it needs t (the side's ``--max-*-positions``), which the side then checks per batch;
- the data it reads from every batch beside the tokens, which a task collates (a
  :class:`~posattn.position_terms.side_inputs.BatchSideData`), and the position embedding it
  gives the side's input, if any (an
  :class:`~posattn.position_terms.side_inputs.InputPositionEmbedding`);
- the variants that the tests and the benchmark build (with their paper-style labels), its options
  in the all-at-once model the tests build, and the benchmark's ratio target.

What ``posattn-inspect`` shows of a method is said by its terms: each term's ``inspect(positions)``
returns its learned quantities as :class:`~posattn.position_terms.quantities.Quantity`
records, and :func:`method_of` finds the method a term belongs to (the one registered in the file
that defines the term's class), whose name is the kind that ``posattn-inspect`` draws it under. What the
tests and the benchmark build from the declarations (variants, labels, the all-at-once model) is
:mod:`~posattn.position_terms.catalogue`'s.

Adding a method is one file that defines its term(s) and ends with ``register(...)``, plus one
import line in :mod:`posattn.position_terms`; the registration order is the order
of the options in ``--help`` and of the terms within a kind.
"""

from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Tuple

from torch import Tensor, nn

from posattn.position_terms.quantities import SideDataTrace
from posattn.position_terms.side_inputs import BatchSideData, InputPositionEmbedding
from posattn.errors import UserError

SIDES = ("encoder", "decoder")


class PositionOptionError(UserError, ValueError):
    """An impossible option value or combination, reported at start-up (one line, no traceback)."""


@dataclass(frozen=True)
class MethodOption:
    """One ``--{side}-{name}`` option. ``help`` may use ``{what}`` (the side's attention, e.g.
    "encoder self-attention") and ``{t}`` (the option that sets t on that side)."""

    name: str
    default: Any
    help: str
    choices: Tuple[str, ...] = ()
    #: the option drops a term's value part (which has no pointwise form), keeping its key part
    keys_only: bool = False


@dataclass(frozen=True)
class LayerSpec:
    """The layer a method builds terms for, and the side-wide modules its layers share."""

    index: int
    num_heads: int
    head_dim: int
    shared: Dict[str, nn.Module] = field(default_factory=dict, compare=False)


class PositionMethod:
    """Base class of a method's declaration; see the module docstring."""

    #: unique name, also the key of the registry
    name: str = ""
    #: the paper (author year, section) the method implements
    citation: str = ""
    options: Tuple[MethodOption, ...] = ()
    sides: Tuple[str, ...] = SIDES
    #: the benchmark's ratio target for this method's rows (a key of the benchmark's targets)
    benchmark_target: str = "additive"
    #: variant name -> option values (without the side prefix), built by tests and the benchmark
    variants: Mapping[str, Mapping[str, Any]] = {}
    #: variant name -> its paper-style label (benchmark rows); a variant without one shows its name
    labels: Mapping[str, str] = {}
    #: the method's option values in the all-at-once model of the tests ({}: not in it)
    combined: Mapping[str, Any] = {}
    #: the data the method reads from every batch beside its tokens while it is on, which a task collates
    side_data: Optional[BatchSideData] = None

    def is_on(self, options: Any) -> bool:
        """True when the options ask for this method on the side."""
        raise NotImplementedError

    def validate(self, options: Any) -> None:
        """Raise :class:`PositionOptionError` for impossible values or combinations (choices are
        checked before this is called)."""

    def needs_max_positions(self, options: Any) -> bool:
        """True when a term keeps parameters per position up to t (longer inputs are refused)."""
        return False

    def terms(self, options: Any, layer: LayerSpec) -> List[nn.Module]:
        """The position terms of one layer of the side (empty where the method skips the layer)."""
        return []

    def input_embedding(self, options: Any, embed_dim: int, padding_idx: int,
                        sequential: bool) -> Optional[InputPositionEmbedding]:
        """The position embedding of the side's input, where the options ask for one; ``sequential``: the side
        has sequential position embeddings (which the module receives, to combine or replace)."""
        return None

    def trace_side_data(self, options: Optional[Any], rows: Mapping[str, Tensor]) -> Optional[SideDataTrace]:
        """What ``posattn-inspect`` shows of one sentence's :attr:`side_data` (``rows``: each ``(length,)``),
        under ``side_data.shown_as``; ``options``: the model's options of the side (None: the model has none,
        and the method's defaults apply)."""
        return None

    def asked_by(self, options: Any) -> str:
        """The option that switches the method on, with its value, as errors name it."""
        option = self.options[0].name
        return f"{options.flag(option)} {getattr(options, option)}"


REGISTRY: Dict[str, PositionMethod] = {}


def register(method: PositionMethod) -> PositionMethod:
    """Add a method's declaration to the registry (once per name)."""
    if method.name in REGISTRY:
        raise ValueError(f"position method {method.name!r} is registered twice")
    taken = {option.name for other in REGISTRY.values() for option in other.options}
    clash = taken & {option.name for option in method.options}
    if clash:
        raise ValueError(f"position method {method.name!r} redefines the options {sorted(clash)}")
    REGISTRY[method.name] = method
    return method


def method_of(term: nn.Module) -> PositionMethod:
    """The registered method declared in the file that defines ``term``'s class."""
    found = [m for m in REGISTRY.values() if type(m).__module__ == type(term).__module__]
    if len(found) != 1:
        raise LookupError(f"{type(term).__name__} is not defined next to exactly one registered position "
                          f"method (found {[m.name for m in found]}); define a term in its method's file")
    return found[0]


def methods_of(side: str) -> List[PositionMethod]:
    """The methods that ``side`` can take, in registration order."""
    return [method for method in REGISTRY.values() if side in method.sides]


def options_of(side: str) -> List[MethodOption]:
    return [option for method in methods_of(side) for option in method.options]
