"""Encoder and decoder that build position-aware layers and share one PositionContext per batch."""

from typing import Any, Dict, List, Optional

from fairseq.distributed import fsdp_wrap
from fairseq.models.transformer import TransformerDecoderBase, TransformerEncoderBase
from fairseq.modules.checkpoint_activations import checkpoint_wrapper
from torch import Tensor, nn

from fairseq_posattn.models.position_options import PositionOptionError, SidePositionOptions
from fairseq_posattn.modules.attention import bound_position_context, position_aware_attentions
from fairseq_posattn.modules.position_context import PositionContext
from fairseq_posattn.modules.structural_embedding import StructuralPositionalEmbedding
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
    """fairseq's encoder; its self-attention layers get the ``--encoder-*`` position terms, and its
    input the absolute structural embedding when ``--encoder-structural-positions`` asks for it."""

    def __init__(self, cfg: Any, dictionary: Any, embed_tokens: nn.Embedding,
                 position_options: SidePositionOptions, return_fc: bool = False):
        self.position_options = position_options
        self._layers_built = 0
        super().__init__(cfg, dictionary, embed_tokens, return_fc=return_fc)
        self.position_context: Optional[PositionContext] = None
        self.structural_embedding: Optional[StructuralPositionalEmbedding] = None
        if position_options.structural_absolute:
            if position_options.structural_fusion == "nonlinear" and self.embed_positions is None:
                raise PositionOptionError(
                    "--encoder-structural-fusion nonlinear fuses the structural with the sequential "
                    "position embeddings: drop --no-token-positional-embeddings and "
                    "--encoder-no-token-positional-embeddings, or use "
                    "--encoder-structural-fusion add")
            self.structural_embedding = StructuralPositionalEmbedding(
                embed_tokens.embedding_dim, self.padding_idx, cfg.max_source_positions,
                position_options.structural_fusion)

    def build_encoder_layer(self, cfg: Any) -> nn.Module:
        layer = PositionAwareEncoderLayer(cfg, self.position_options, self._layers_built,
                                          return_fc=self.return_fc)
        self._layers_built += 1
        return wrap_layer(layer, cfg)

    def forward(self, src_tokens: Tensor, src_lengths: Optional[Tensor] = None,
                return_all_hiddens: bool = False, token_embeddings: Optional[Tensor] = None,
                src_structure: Optional[Tensor] = None):
        """fairseq's encoder forward; ``src_structure`` ``(batch, 3, src_len)`` holds each source
        token's tree depth, ``tin`` and ``tout`` (collated by ``--task translation_structural``)."""
        ctx = PositionContext.from_tokens(
            src_tokens, self.padding_idx, self._structural_side_data(src_tokens, src_structure))
        with bound_position_context([self, *position_aware_attentions(self)], ctx):
            return self.forward_scriptable(src_tokens, src_lengths, return_all_hiddens, token_embeddings)

    def _structural_side_data(self, src_tokens: Tensor, src_structure: Optional[Tensor]):
        if self.position_options.structural_positions == "none":
            return None
        if src_structure is None:
            raise ValueError(
                "--encoder-structural-positions needs each sentence's parse: train, generate and "
                "translate interactively with --task translation_structural")
        if src_structure.shape != (src_tokens.size(0), 3, src_tokens.size(1)):
            raise ValueError(
                f"structural side data of shape {tuple(src_structure.shape)} does not match the "
                f"source batch {tuple(src_tokens.shape)}: re-run the structural prepare step on the "
                "same BPE text that fairseq-preprocess binarized")
        depth, tin, tout = src_structure.long().unbind(dim=1)
        return {"depth": depth, "tin": tin, "tout": tout}

    def forward_embedding(self, src_tokens: Tensor, token_embedding: Optional[Tensor] = None):
        """fairseq's ``forward_embedding``, with the structural embedding fused into the positions."""
        if self.structural_embedding is None:
            return super().forward_embedding(src_tokens, token_embedding)
        if token_embedding is None:
            token_embedding = self.embed_tokens(src_tokens)
        x = embed = self.embed_scale * token_embedding
        sequential = self.embed_positions(src_tokens) if self.embed_positions is not None else None
        depth = self.position_context.structural["depth"]
        x = embed + self.structural_embedding(depth, src_tokens.eq(self.padding_idx), sequential)
        if self.layernorm_embedding is not None:
            x = self.layernorm_embedding(x)
        x = self.dropout_module(x)
        if self.quant_noise is not None:
            x = self.quant_noise(x)
        return x, embed


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
