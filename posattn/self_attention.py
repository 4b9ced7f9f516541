"""Multi-head self-attention with a position method, for plain PyTorch models.

:class:`SelfAttention` replaces a model's attention module in one line (a nanoGPT block's
``CausalSelfAttention``)::

    self.attn = posattn.SelfAttention(n_embd, n_head, causal=True, dropout=0.1, **method_options)

Its projections have the names of fairseq's (``q_proj``, ``k_proj``, ``v_proj``, ``out_proj``) and its terms the
names of the fairseq plugin's attention, so one layer's state dict has the same keys in both. Several layers
share one method's side-wide modules (a bias table of the whole side) when they are built from one
:func:`~posattn.position_options.position_options` (``options=``, with ``layer_index``): the layer that makes such
a module registers it (``position_shared``), the others read it.
"""

import math
from typing import Any, Mapping, Optional, Tuple, Union

import torch.nn.functional as F
from torch import Tensor, nn

from posattn.attention import PositionKernel
from posattn.compat import autocast_dtype
from posattn.decoding import DecodingCache
from posattn.errors import ArgumentError, described
from posattn.functional import position_attention
from posattn.position_context import PositionContext
from posattn.position_method import check_sizes
from posattn.position_options import SidePositionOptions, check_flag, layer_options


class SelfAttention(PositionKernel):
    """Self-attention of ``(batch, length, embed_dim)`` inputs with a position method.

    Args:
        embed_dim: the model's width (a multiple of ``num_heads``).
        num_heads: attention heads.
        causal: a decoder's (causal) attention, else an encoder's.
        dropout: the attention dropout's probability.
        bias: the projections have biases.
        options: the side's options, shared by the model's layers (:func:`position_options`); None: built from
            ``causal``, ``max_positions`` and ``method_options``.
        layer_index: the layer's 0-based index, read by the methods that skip layers or number them and by
            ``layer_methods`` (each layer's methods); None (not given): 0, refused with ``layer_methods``.
        max_positions: t, the longest sequence that terms keeping parameters per position take (None: 1024, or
            the ``options``' own).
        method_options: the method's options by their command-line names without the side
            (:func:`~posattn.position_options.describe_options` lists them), with ``options`` None.

    Arguments of other types or values, and options of another side, are refused in one line (docs/pytorch.md).
    """

    def __init__(self, embed_dim: int, num_heads: int, *, causal: bool = False, dropout: float = 0.0,
                 bias: bool = True, options: Optional[SidePositionOptions] = None, layer_index: Optional[int] = None,
                 max_positions: Optional[int] = None, **method_options: Any):
        check_sizes(num_heads, dropout, layer_index, embed_dim=embed_dim)
        if embed_dim % num_heads:
            raise ArgumentError(f"embed_dim ({embed_dim}) must be a multiple of num_heads ({num_heads}): each head "
                                "takes embed_dim // num_heads dimensions")
        check_flag("bias", bias)
        options = layer_options(options, causal, max_positions, method_options)
        head_dim = embed_dim // num_heads
        terms, made = options.build_layer(layer_index, num_heads, head_dim)
        super().__init__(num_heads, head_dim, terms, dropout, embed_dim)
        self.options = options
        #: the side-wide modules this layer's terms made (the first layer's), registered once
        self.position_shared = nn.ModuleDict(made)
        self.q_proj, self.k_proj, self.v_proj, self.out_proj = (nn.Linear(embed_dim, embed_dim, bias=bias)
                                                                for _ in range(4))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """fairseq's initialisation of self-attention (``MultiheadAttention.reset_parameters``): Xavier-uniform
        weights (gain 1/sqrt(2) for q, k and v), the output's bias zero, the q, k and v biases as ``nn.Linear``
        drew them."""
        for projection in (self.q_proj, self.k_proj, self.v_proj):
            nn.init.xavier_uniform_(projection.weight, gain=1 / math.sqrt(2))
        nn.init.xavier_uniform_(self.out_proj.weight)
        if self.out_proj.bias is not None:
            nn.init.constant_(self.out_proj.bias, 0.0)

    def forward(self, x: Tensor, padding_mask: Optional[Tensor] = None, cache: Optional[DecodingCache] = None,
                context: Optional[PositionContext] = None, side_data: Optional[Mapping[str, Tensor]] = None,
                need_weights: bool = False) -> Union[Tensor, Tuple[Tensor, Tensor]]:
        """Self-attention of ``x`` ``(batch, length, embed_dim)``; the arguments as
        :func:`~posattn.functional.position_attention`'s (``padding_mask`` ``(batch, length)``, True at pads).

        Returns ``(batch, length, embed_dim)``, with ``need_weights`` also the weights ``(batch, heads, length,
        keys)``."""
        self._check_input(x)
        batch, length, _ = x.shape
        self.options.check_length((0 if cache is None or not isinstance(cache, DecodingCache) else cache.length)
                                  + length)
        q_w, k_w, v_w = self.scale_projections(self.q_proj.weight, self.k_proj.weight, self.v_proj.weight)

        def heads(weight: Tensor, projection: nn.Linear) -> Tensor:
            projected = F.linear(x, weight, projection.bias)
            return projected.view(batch, length, self.num_heads, self.head_dim).transpose(1, 2)

        result = position_attention(
            heads(q_w, self.q_proj), heads(k_w, self.k_proj), heads(v_w, self.v_proj), self,
            padding_mask=padding_mask, cache=cache, x=x, side_data=side_data, context=context,
            need_weights=need_weights)
        out, weights = result if need_weights else (result, None)
        out = self.out_proj(out.transpose(1, 2).reshape(batch, length, self.embed_dim))
        return (out, weights) if need_weights else out

    def _check_input(self, x: Tensor) -> None:
        """Refuse an ``x`` that is not ``(batch, length, embed_dim)`` on the layer's device, in its dtype (any under
        autocast, which casts the projections' inputs)."""
        weight = self.q_proj.weight
        if not isinstance(x, Tensor) or x.dim() != 3 or x.size(-1) != self.embed_dim:
            raise ArgumentError(f"{self.where}: x must be (batch, length, {self.embed_dim}) (batch, length, "
                                f"embed_dim), got {described(x)}; one sequence is x[None]")
        other_dtype = x.dtype != weight.dtype and autocast_dtype(x.device.type) is None  # autocast casts both
        if other_dtype or x.device != weight.device:
            raise ArgumentError(f"{self.where}: x is {x.dtype} on {x.device}, the layer's weights {weight.dtype} on "
                                f"{weight.device}: move one to the other (layer.to(x) or x.to(...)), or run the "
                                "model under torch.autocast")
