"""fairseq's transformer layers with a position-aware self-attention where a side asks for one.

``build_self_attention`` builds ours where the layer has position terms; a layer without keeps
fairseq's own :class:`~fairseq.modules.MultiheadAttention` (and its fused kernels). ``forward``
takes the batch's :class:`~posattn.position_context.PositionContext` explicitly
and hands it to the self-attention in the slot of its padding mask, which fairseq's layer code
passes on untouched (see :mod:`fairseq_posattn.modules.attention`); fairseq's own attention gets
the plain padding mask. The rest of the layer is fairseq's.
"""

from typing import Any, Optional, Union

from fairseq.modules.transformer_layer import (
    TransformerDecoderLayerBase,
    TransformerEncoderLayerBase,
)
from torch import Tensor

from fairseq_posattn.compat import never_use_fused_encoder_layer
from fairseq_posattn.modules.attention import PositionAwareMultiheadAttention
from posattn.position_context import PositionContext


def build_position_aware_attention(layer: Any, embed_dim: int, num_heads: int, cfg: Any):
    """Our attention for ``layer`` (its position options and index), or None if it has no terms."""
    terms = layer.position_options.build_terms(layer.layer_index, num_heads, embed_dim // num_heads)
    if terms.is_empty():
        return None
    return PositionAwareMultiheadAttention(
        embed_dim, num_heads, terms, dropout=cfg.attention_dropout,
        q_noise=layer.quant_noise, qn_block_size=layer.quant_noise_block_size,
    )


def self_attention_input(layer: Any, ctx: PositionContext, query_len: int) -> Union[PositionContext, Tensor]:
    """What ``layer`` hands its self-attention as ``key_padding_mask``: the whole context for ours;
    for fairseq's own attention, the padding mask of the ``query_len`` current tokens (fairseq's
    attention appends the cached steps' mask itself in incremental decoding)."""
    if not isinstance(ctx, PositionContext):
        raise TypeError(
            f"{type(layer).__name__} needs its batch's PositionContext (position_context=...), got "
            f"{type(ctx).__name__}: call it through a position-aware encoder or decoder")
    if isinstance(layer.self_attn, PositionAwareMultiheadAttention):
        return ctx
    return ctx.query_padding_mask(query_len)


class PositionAwareEncoderLayer(TransformerEncoderLayerBase):
    def __init__(self, cfg: Any, position_options: Any, layer_index: int, return_fc: bool = False):
        self.position_options = position_options
        self.layer_index = layer_index
        super().__init__(cfg, return_fc=return_fc)
        if isinstance(self.self_attn, PositionAwareMultiheadAttention):
            never_use_fused_encoder_layer(self)

    def build_self_attention(self, embed_dim: int, cfg: Any):
        attention = build_position_aware_attention(self, embed_dim, cfg.encoder.attention_heads, cfg)
        return attention if attention is not None else super().build_self_attention(embed_dim, cfg)

    def forward(self, x: Tensor, position_context: PositionContext, attn_mask: Optional[Tensor] = None):
        """fairseq's encoder layer, with the batch's context instead of the padding mask."""
        return super().forward(x, self_attention_input(self, position_context, x.size(0)), attn_mask=attn_mask)

    def _load_from_state_dict(self, *args, **kwargs):
        super()._load_from_state_dict(*args, **kwargs)
        if isinstance(self.self_attn, PositionAwareMultiheadAttention):
            never_use_fused_encoder_layer(self)


class PositionAwareDecoderLayer(TransformerDecoderLayerBase):
    def __init__(self, cfg: Any, position_options: Any, layer_index: int,
                 no_encoder_attn: bool = False, add_bias_kv: bool = False, add_zero_attn: bool = False):
        self.position_options = position_options
        self.layer_index = layer_index
        super().__init__(cfg, no_encoder_attn=no_encoder_attn, add_bias_kv=add_bias_kv,
                         add_zero_attn=add_zero_attn)

    def build_self_attention(self, embed_dim: int, cfg: Any, add_bias_kv: bool = False,
                             add_zero_attn: bool = False):
        attention = build_position_aware_attention(self, embed_dim, cfg.decoder.attention_heads, cfg)
        if attention is None:
            return super().build_self_attention(embed_dim, cfg, add_bias_kv, add_zero_attn)
        if add_bias_kv or add_zero_attn or cfg.cross_self_attention:
            raise ValueError(
                "decoder position terms need plain causal self-attention: drop --cross-self-attention "
                "(and add_bias_kv / add_zero_attn) or the --decoder-* position options")
        return attention

    def forward(
        self,
        x: Tensor,
        encoder_out: Optional[Tensor] = None,
        encoder_padding_mask: Optional[Tensor] = None,
        incremental_state: Optional[dict] = None,
        position_context: Optional[PositionContext] = None,
        self_attn_mask: Optional[Tensor] = None,
        need_attn: bool = False,
        need_head_weights: bool = False,
    ):
        """fairseq's decoder layer, with the batch's context instead of the self-attention padding
        mask (cross-attention keeps the source's ``encoder_padding_mask``)."""
        return super().forward(
            x, encoder_out, encoder_padding_mask, incremental_state,
            self_attn_mask=self_attn_mask,
            self_attn_padding_mask=self_attention_input(self, position_context, x.size(0)),
            need_attn=need_attn, need_head_weights=need_head_weights,
        )
