"""The causal position methods the recipe trains: every decoder variant of the position registry by its name
(``all_variants("decoder")``: ``alibi``, ``rotary``, ``t5-bias``, ...) and ``none``, no position information
(the fairseq recipe's ``none``: its model without position embeddings)."""

from typing import Dict, List

import posattn
from posattn.position_options import SidePositionOptions
from posattn.position_terms.catalogue import all_variants

NO_POSITIONS = "none"


def method_names() -> List[str]:
    return list(all_variants("decoder")) + [NO_POSITIONS]


def method_options(method: str) -> Dict[str, object]:
    """The side options that switch ``method`` on; ``KeyError`` naming the known methods."""
    if method == NO_POSITIONS:
        return {}
    variants = all_variants("decoder")
    if method not in variants:
        raise KeyError(f"unknown method '{method}'; the methods: {', '.join(method_names())}")
    return dict(variants[method])


def side_options(method: str, train_length: int, longest_length: int) -> SidePositionOptions:
    """The model's position options. t (``max_positions``) is the longest evaluation length for a method without
    parameters per position (fairseq-eval-lm's ``max_target_positions`` override), the training length for one
    with them: such a model refuses the longer evaluations, as the fairseq recipe's do."""
    options = posattn.position_options(True, max_positions=longest_length, **method_options(method))
    if options.needs_max_positions():
        options = posattn.position_options(True, max_positions=train_length, **method_options(method))
    return options
