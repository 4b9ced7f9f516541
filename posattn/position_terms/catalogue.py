"""The catalogue the registry's declarations make: the variants the tests and the benchmark build (with their
paper-style labels and command-line flags), the all-at-once model of the tests, and the side data that the
methods read from batches (which the tests' and the benchmark's batches carry)."""

from typing import Any, Dict, List, Mapping, Optional

from posattn.position_terms.registry import REGISTRY
from posattn.position_terms.side_inputs import BatchSideData


def variant_flags(side: str, values: Mapping[str, Any]) -> List[str]:
    """Command-line flags of a variant's option values on ``side``."""
    flags: List[str] = []
    for name, value in values.items():
        flag = f"--{side}-{name.replace('_', '-')}"
        if value is True:
            flags.append(flag)
        elif value is not False:
            flags += [flag, str(value)]
    return flags


def all_variants(side: Optional[str] = None) -> Dict[str, Mapping[str, Any]]:
    """Every registered variant (of the methods ``side`` can take), by name."""
    found: Dict[str, Mapping[str, Any]] = {}
    for method in REGISTRY.values():
        if side is None or side in method.sides:
            found.update(method.variants)
    return found


def variant_label(name: str) -> str:
    """The paper-style label of a registered variant (its name where its method gives none)."""
    for method in REGISTRY.values():
        if name in method.variants:
            return method.labels.get(name, name)
    raise KeyError(f"no registered position method has a variant {name!r}")


def combined_options(side: Optional[str] = None) -> Dict[str, Any]:
    """The all-at-once model: every method's ``combined`` option values (of the methods ``side`` takes)."""
    found: Dict[str, Any] = {}
    for method in REGISTRY.values():
        if side is None or side in method.sides:
            found.update(method.combined)
    return found


def all_side_data(side: Optional[str] = None) -> Dict[str, BatchSideData]:
    """The side data that the registered methods (of ``side``) read from batches, by ``net_input`` key."""
    return {method.side_data.key: method.side_data for method in REGISTRY.values()
            if method.side_data is not None and (side is None or side in method.sides)}
