"""Encoder and decoder that build position-aware layers and share one PositionContext per batch."""

from typing import Any, Dict, List, Optional

from fairseq.distributed import fsdp_wrap
from fairseq.models.transformer import TransformerDecoderBase, TransformerEncoderBase
from fairseq.modules.checkpoint_activations import checkpoint_wrapper
from torch import Tensor, nn

from fairseq_posattn.models.position_options import SidePositionOptions
from fairseq_posattn.modules.attention import bound_position_context, position_aware_attentions
from fairseq_posattn.modules.position_context import PositionContext
from fairseq_posattn.modules.transformer_layer import (
    PositionAwareDecoderLayer,
    PositionAwareEncoderLayer,
)


def wrap_layer(layer: nn.Module, cfg: Any) -> nn.Module:
    """Activation checkpointing and FSDP wrapping exactly as fairseq's ``build_*_layer`` do."""
    checkpoint = cfg.checkpoint_activations
    if checkpoint:
        layer = checkpoint_wrapper(layer, offload_to_cpu=cfg.offload_activations)
    min_params_to_wrap = cfg.min_params_to_wrap if not checkpoint else 0
    return fsdp_wrap(layer, min_num_params=min_params_to_wrap)


class PositionAwareTransformerEncoder(TransformerEncoderBase):
    """fairseq's encoder; its self-attention layers get the ``--encoder-*`` position terms."""

    def __init__(self, cfg: Any, dictionary: Any, embed_tokens: nn.Embedding,
                 position_options: SidePositionOptions, return_fc: bool = False):
        self.position_options = position_options
        self._layers_built = 0
        super().__init__(cfg, dictionary, embed_tokens, return_fc=return_fc)

    def build_encoder_layer(self, cfg: Any) -> nn.Module:
        layer = PositionAwareEncoderLayer(cfg, self.position_options, self._layers_built,
                                          return_fc=self.return_fc)
        self._layers_built += 1
        return wrap_layer(layer, cfg)

    def position_context(self, src_tokens: Tensor) -> PositionContext:
        return PositionContext.from_tokens(src_tokens, self.padding_idx)

    def forward(self, src_tokens: Tensor, src_lengths: Optional[Tensor] = None,
                return_all_hiddens: bool = False, token_embeddings: Optional[Tensor] = None):
        ctx = self.position_context(src_tokens)
        with bound_position_context(position_aware_attentions(self), ctx):
            return self.forward_scriptable(src_tokens, src_lengths, return_all_hiddens, token_embeddings)


class PositionAwareTransformerDecoder(TransformerDecoderBase):
    """fairseq's decoder; its causal self-attention layers get the ``--decoder-*`` position terms."""

    def __init__(self, cfg: Any, dictionary: Any, embed_tokens: nn.Embedding,
                 position_options: SidePositionOptions, no_encoder_attn: bool = False,
                 output_projection: Optional[nn.Module] = None):
        self.position_options = position_options
        self._layers_built = 0
        super().__init__(cfg, dictionary, embed_tokens, no_encoder_attn=no_encoder_attn,
                         output_projection=output_projection)

    def build_decoder_layer(self, cfg: Any, no_encoder_attn: bool = False) -> nn.Module:
        layer = PositionAwareDecoderLayer(cfg, self.position_options, self._layers_built,
                                          no_encoder_attn=no_encoder_attn)
        self._layers_built += 1
        return wrap_layer(layer, cfg)

    def extract_features(
        self,
        prev_output_tokens: Tensor,
        encoder_out: Optional[Dict[str, List[Tensor]]] = None,
        incremental_state: Optional[Dict[str, Dict[str, Optional[Tensor]]]] = None,
        full_context_alignment: bool = False,
        alignment_layer: Optional[int] = None,
        alignment_heads: Optional[int] = None,
    ):
        if full_context_alignment and self.position_options.is_active():
            raise ValueError("--decoder-* position terms are causal; full-context alignment is not supported")
        ctx = PositionContext.from_tokens(prev_output_tokens, self.padding_idx)
        with bound_position_context(position_aware_attentions(self), ctx):
            return self.extract_features_scriptable(
                prev_output_tokens, encoder_out, incremental_state,
                full_context_alignment, alignment_layer, alignment_heads,
            )
