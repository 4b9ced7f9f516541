"""fairseq's transformer layers with a position-aware self-attention where a side asks for one.

Only ``build_self_attention`` changes: a layer whose side has no position term for it keeps
fairseq's own :class:`~fairseq.modules.MultiheadAttention` (and its fused kernels).
"""

from typing import Any

from fairseq.modules.transformer_layer import (
    TransformerDecoderLayerBase,
    TransformerEncoderLayerBase,
)

from fairseq_posattn.compat import never_use_fused_encoder_layer
from fairseq_posattn.modules.attention import PositionAwareMultiheadAttention


def build_position_aware_attention(layer: Any, embed_dim: int, num_heads: int, cfg: Any):
    """Our attention for ``layer`` (its position options and index), or None if it has no terms."""
    terms = layer.position_options.build_terms(layer.layer_index, num_heads, embed_dim // num_heads)
    if terms.is_empty():
        return None
    return PositionAwareMultiheadAttention(
        embed_dim, num_heads, terms, dropout=cfg.attention_dropout,
        q_noise=layer.quant_noise, qn_block_size=layer.quant_noise_block_size,
    )


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
