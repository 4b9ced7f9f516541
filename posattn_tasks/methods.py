"""The methods the suite compares: every causal variant of the position registry by its name (a method registered
later joins with no edit here), no position information at all (``nope``) and the sinusoidal absolute position
embedding added to the input (``absolute``, Vaswani et al. 2017), the baseline the papers call absolute PE."""

from typing import Dict, List

import posattn
from posattn.position_options import SidePositionOptions
from posattn.position_terms.catalogue import all_variants, variant_label

NO_POSITIONS = "nope"
ABSOLUTE = "absolute"
BASELINES = {NO_POSITIONS: "NoPE", ABSOLUTE: "APE (sinusoidal)"}


class UnknownMethod(posattn.UserError, KeyError):
    """A method the suite does not know."""

    def __str__(self) -> str:
        return str(self.args[0])


def method_names() -> List[str]:
    """Every method: the baselines, then the registry's causal variants in registration order."""
    return list(BASELINES) + list(all_variants("decoder"))


def method_label(method: str) -> str:
    return BASELINES.get(method) or variant_label(method)


def method_options(method: str) -> Dict[str, object]:
    """The side options that switch ``method`` on (none for the baselines)."""
    if method in BASELINES:
        return {}
    variants = all_variants("decoder")
    if method not in variants:
        raise UnknownMethod(f"unknown method {method!r}; the methods: {', '.join(method_names())}")
    return dict(variants[method])


def side_options(method: str, train_tokens: int, longest_tokens: int) -> SidePositionOptions:
    """The model's position options. t (``max_positions``) is the longest test length for a method without
    parameters per position, the training length for one with them: such a model refuses longer tests in one
    line, which the suite records as refused."""
    options = posattn.position_options(True, max_positions=longest_tokens, **method_options(method))
    if options.needs_max_positions():
        options = posattn.position_options(True, max_positions=train_tokens, **method_options(method))
    return options
