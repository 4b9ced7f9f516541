"""A layer's position method on its own, for :func:`~posattn.functional.position_attention` in a model that
keeps its own projections."""

from typing import Any, Optional

from torch import nn

from posattn.attention import PositionKernel
from posattn.position_options import SidePositionOptions, layer_options


def position_method(num_heads: int, head_dim: int, *, causal: bool = False, dropout: float = 0.0,
                    options: Optional[SidePositionOptions] = None, layer_index: int = 0, max_positions: int = 1024,
                    **method_options: Any) -> PositionKernel:
    """The position method of one attention layer of ``num_heads`` heads of ``head_dim``: a module holding its
    terms (their parameters, where they learn), to pass to :func:`~posattn.functional.position_attention`.

    The arguments are :class:`~posattn.self_attention.SelfAttention`'s: ``options`` shared by a model's layers
    (:func:`~posattn.position_options.position_options`), or the method's options as keywords (the command-line
    options' names without the side). The side-wide modules the layer's terms make are registered on it
    (``position_shared``)."""
    options = layer_options(options, causal, max_positions, method_options)
    terms, made = options.build_layer(layer_index, num_heads, head_dim)
    method = PositionKernel(num_heads, head_dim, terms, dropout)
    method.position_shared = nn.ModuleDict(made)
    return method
