"""``transformer_posattn``: fairseq's transformer with position-aware self-attention.

Registered next to fairseq's ``transformer`` with the same size presets. With every position
option at its default it computes exactly what fairseq's ``transformer`` computes.
"""

import argparse
import copy
from typing import Any

from fairseq.models import register_model, register_model_architecture
from fairseq.models.transformer import TransformerConfig, TransformerModel
from fairseq.models.transformer.transformer_legacy import (
    base_architecture,
    transformer_iwslt_de_en,
    transformer_vaswani_wmt_en_de_big,
    transformer_wmt_en_de,
)
from omegaconf import OmegaConf

from fairseq_posattn.models.hub_loading import PosattnHubMixin
from fairseq_posattn.models.position_aware_transformer import (
    PositionAwareTransformerDecoder,
    PositionAwareTransformerEncoder,
)
from fairseq_posattn.models.position_options import add_position_args, set_position_defaults
from posattn.position_options import SidePositionOptions


def encoder_position_options(cfg: Any) -> SidePositionOptions:
    return SidePositionOptions.from_config(
        cfg, "encoder", causal=False, max_positions=cfg.max_source_positions,
        max_positions_option="--max-source-positions",
    )


def decoder_position_options(cfg: Any) -> SidePositionOptions:
    return SidePositionOptions.from_config(
        cfg, "decoder", causal=True, max_positions=cfg.max_target_positions,
        max_positions_option="--max-target-positions",
    )


@register_model("transformer_posattn")
class PositionAwareTransformerModel(PosattnHubMixin, TransformerModel):
    """Transformer whose encoder and decoder self-attention take the position options of docs/methods.md."""

    @classmethod
    def add_args(cls, parser):
        super().add_args(parser)
        add_position_args(parser, "encoder")
        add_position_args(parser, "decoder")
        parser.add_argument(
            "--encoder-no-token-positional-embeddings", action="store_true",
            help="no sequential position embeddings in the encoder; the decoder keeps its own "
                 "(fairseq's --no-token-positional-embeddings removes both). Wang et al.'s Table 1 "
                 "rows 1-3 and Dufter et al.'s SAN, SAN+P, SAN+R in a translation model")

    @classmethod
    def build_model(cls, args, task):
        if OmegaConf.is_config(args):
            # fairseq-hydra-train and its checkpoints hand the model section over as a DictConfig, of
            # which fairseq's TransformerConfig.from_namespace keeps only its own fields: the position
            # options would be dropped silently
            args = argparse.Namespace(**OmegaConf.to_container(args, resolve=True))
        posattn_base_architecture(args)
        model = super().build_model(args, task)
        model.encoder.position_options.check_task(task)
        model.built_from = args  # as fairseq completed it (--share-all-embeddings sets the decoder's sharing)
        return model

    def forward(self, src_tokens, src_lengths, prev_output_tokens, return_all_hiddens: bool = True,
                features_only: bool = False, alignment_layer=None, alignment_heads=None, **side_inputs):
        """fairseq's forward, passing the side data that the task collated into ``net_input`` (``side_inputs``,
        by key) on to the encoder."""
        encoder_out = self.encoder(src_tokens, src_lengths=src_lengths,
                                   return_all_hiddens=return_all_hiddens, **side_inputs)
        return self.decoder(
            prev_output_tokens, encoder_out=encoder_out, features_only=features_only,
            alignment_layer=alignment_layer, alignment_heads=alignment_heads,
            src_lengths=src_lengths, return_all_hiddens=return_all_hiddens,
        )

    @classmethod
    def build_encoder(cls, args, src_dict, embed_tokens):
        cfg = TransformerConfig.from_namespace(args)
        if getattr(args, "encoder_no_token_positional_embeddings", False):
            cfg = copy.copy(cfg)  # fairseq hands encoder and decoder the same config object
            cfg.no_token_positional_embeddings = True
        return PositionAwareTransformerEncoder(cfg, src_dict, embed_tokens, encoder_position_options(cfg))

    @classmethod
    def build_decoder(cls, args, tgt_dict, embed_tokens):
        cfg = TransformerConfig.from_namespace(args)
        return PositionAwareTransformerDecoder(
            cfg, tgt_dict, embed_tokens, decoder_position_options(cfg),
            no_encoder_attn=cfg.no_cross_attention,
            right_padded=not getattr(args, "left_pad_target", False),
        )


@register_model_architecture("transformer_posattn", "transformer_posattn")
def posattn_base_architecture(args):
    set_position_defaults(args, ["encoder", "decoder"])
    base_architecture(args)


@register_model_architecture("transformer_posattn", "transformer_posattn_iwslt_de_en")
def posattn_iwslt_de_en(args):
    set_position_defaults(args, ["encoder", "decoder"])
    transformer_iwslt_de_en(args)


@register_model_architecture("transformer_posattn", "transformer_posattn_wmt_en_de")
def posattn_wmt_en_de(args):
    set_position_defaults(args, ["encoder", "decoder"])
    transformer_wmt_en_de(args)


@register_model_architecture("transformer_posattn", "transformer_posattn_vaswani_wmt_en_de_big")
def posattn_vaswani_wmt_en_de_big(args):
    set_position_defaults(args, ["encoder", "decoder"])
    transformer_vaswani_wmt_en_de_big(args)
