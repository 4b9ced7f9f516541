"""A layer's position method on its own, for :func:`~posattn.functional.position_attention` in a model that
keeps its own projections."""

import numbers
from typing import Any, Optional

from torch import nn

from posattn.attention import PositionKernel
from posattn.errors import ArgumentError
from posattn.position_options import SidePositionOptions, check_count, layer_options


def position_method(num_heads: int, head_dim: int, *, causal: bool = False, dropout: float = 0.0,
                    options: Optional[SidePositionOptions] = None, layer_index: Optional[int] = None,
                    max_positions: Optional[int] = None, **method_options: Any) -> PositionKernel:
    """The position method of one attention layer of ``num_heads`` heads of ``head_dim``: a module holding its
    terms (their parameters, where they learn), to pass to :func:`~posattn.functional.position_attention`.

    The arguments are :class:`~posattn.self_attention.SelfAttention`'s: ``options`` shared by a model's layers
    (:func:`~posattn.position_options.position_options`), or the method's options as keywords (the command-line
    options' names without the side). The side-wide modules the layer's terms make are registered on it
    (``position_shared``). Sizes and options of other types or values are refused in one line."""
    check_sizes(num_heads, dropout, layer_index, head_dim=head_dim)
    options = layer_options(options, causal, max_positions, method_options)
    terms, made = options.build_layer(layer_index, num_heads, head_dim)
    method = PositionKernel(num_heads, head_dim, terms, dropout)
    method.position_shared = nn.ModuleDict(made)
    return method


def check_sizes(num_heads: Any, dropout: Any, layer_index: Any, **sizes: Any) -> None:
    """Refuse a layer's sizes (``num_heads`` and ``sizes``, e.g. ``embed_dim``) that are not positive integers, a
    ``dropout`` outside [0, 1) and a negative or non-integer ``layer_index`` (None: not given)."""
    for name, value in (("num_heads", num_heads), *sizes.items()):
        check_count(name, value)
    if isinstance(dropout, bool) or not isinstance(dropout, numbers.Real) or not 0 <= dropout < 1:
        raise ArgumentError(f"dropout must be a probability in [0, 1), got {dropout!r}")
    if layer_index is None:
        return
    if isinstance(layer_index, bool) or not isinstance(layer_index, numbers.Integral) or layer_index < 0:
        raise ArgumentError(f"layer_index must be the layer's 0-based index (an integer >= 0), got {layer_index!r}")
