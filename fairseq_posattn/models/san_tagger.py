"""``san_tagger``: the self-attention part-of-speech tagger of Dufter et al. (2020, section 2.1).

Word embeddings, optional learned position embeddings added (SAN+PE[add]) or concatenated
(SAN+PE[con]), then a character-CNN word vector concatenated; a stack of self-attention layers
(fairseq's encoder layer: attention and feed-forward block, each with its residual connection),
taking every ``--encoder-*`` position option (docs/methods.md); a residual connection from the
input of the first layer to the output of the last (Table 1a), and a softmax over the tags.

The layer width is the concatenation's width: ``word + char filters`` (add) or
``word + position + char filters`` (con), e.g. 128 + 64 = 192 at the paper's UD sizes.
Dufter et al.'s SAN+P / SAN+R models drop the position embeddings: ``--position-embedding none``.
"""

import argparse
import copy
from typing import Any, Dict, Optional

import torch
from fairseq import utils
from fairseq.models import FairseqEncoder, FairseqEncoderModel, register_model, register_model_architecture
from fairseq.models.transformer import TransformerConfig
from fairseq.modules import FairseqDropout, LayerNorm
from torch import Tensor, nn

from fairseq_posattn.models.hub_loading import PosattnHubMixin
from fairseq_posattn.models.position_options import add_position_args, set_position_defaults
from posattn.position_options import PositionOptionError, SidePositionOptions
from fairseq_posattn.models.position_side import (
    PositionSide,
    PositionSideOwner,
    add_layer_wrapping_args,
    set_layer_wrapping_defaults,
)
from fairseq_posattn.modules.char_cnn import CharCNNWordEncoder
from posattn.position_context import PositionContext
from fairseq_posattn.modules.transformer_layer import PositionAwareEncoderLayer

POSITION_EMBEDDING_CHOICES = ["none", "add", "concat"]


@register_model("san_tagger")
class SanTaggerModel(PosattnHubMixin, FairseqEncoderModel):
    """Encoder-only tagger for ``--task pos_tagging``; its output is ``(batch, words, tags)`` logits."""

    def __init__(self, encoder: "SanTaggerEncoder", num_tags: int):
        super().__init__(encoder)
        self.output_dropout = FairseqDropout(encoder.dropout_p, module_name=self.__class__.__name__)
        self.output_projection = nn.Linear(encoder.output_dim, num_tags)

    @staticmethod
    def add_args(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--word-embed-dim", type=int, metavar="N", help="word embedding dimension d")
        parser.add_argument("--position-embedding", choices=POSITION_EMBEDDING_CHOICES,
                            help="learned position embeddings added to the words (SAN+PE[add]), "
                                 "concatenated (SAN+PE[con]) or none (SAN+P, SAN+R)")
        parser.add_argument("--position-embed-dim", type=int, metavar="N",
                            help="position embedding dimension with --position-embedding concat "
                                 "(add uses --word-embed-dim)")
        parser.add_argument("--char-embed-dim", type=int, metavar="N", help="character embedding dimension")
        parser.add_argument("--char-cnn-filters", type=int, metavar="N", help="character CNN filters")
        parser.add_argument("--char-cnn-width", type=int, metavar="N", help="character CNN filter width")
        parser.add_argument("--encoder-layers", type=int, metavar="N", help="self-attention layers")
        parser.add_argument("--encoder-attention-heads", type=int, metavar="N", help="attention heads")
        parser.add_argument("--encoder-ffn-embed-dim", type=int, metavar="N", help="feed-forward dimension")
        parser.add_argument("--encoder-normalize-before", action="store_true",
                            help="layer norm before each block (pre-norm)")
        parser.add_argument("--activation-fn", choices=utils.get_available_activation_fns())
        parser.add_argument("--dropout", type=float, metavar="D")
        parser.add_argument("--attention-dropout", type=float, metavar="D")
        parser.add_argument("--activation-dropout", type=float, metavar="D")
        parser.add_argument("--max-source-positions", type=int, metavar="N",
                            help="largest sentence (piece) length t in words (the paper: 60)")
        add_layer_wrapping_args(parser)
        add_position_args(parser, "encoder")

    @classmethod
    def build_model(cls, args: argparse.Namespace, task: Any) -> "SanTaggerModel":
        san_tagger_base(args)
        check_pieces_fit(args.max_source_positions, task)
        options = SidePositionOptions.from_config(
            args, "encoder", causal=False, max_positions=args.max_source_positions,
            max_positions_option="--max-source-positions")
        options.check_task(task)
        encoder = SanTaggerEncoder(args, task.source_dictionary, task.char_dictionary, options)
        return cls(encoder, len(task.target_dictionary))

    def forward(self, src_tokens: Tensor, src_lengths: Optional[Tensor] = None,
                src_chars: Optional[Tensor] = None) -> Tensor:
        features = self.encoder(src_tokens, src_lengths, src_chars)["encoder_out"]
        return self.output_projection(self.output_dropout(features))

    def get_normalized_probs(self, net_output: Tensor, log_probs: bool, sample=None) -> Tensor:
        if log_probs:
            return utils.log_softmax(net_output, dim=-1)
        return utils.softmax(net_output, dim=-1)

    def max_positions(self) -> int:
        return self.encoder.max_positions()


def check_pieces_fit(max_source_positions: int, task: Any) -> None:
    """The data directory's sentence pieces (up to ``posattn-prepare-tagging --max-length`` words) must fit the
    model's positions: fairseq would drop the longer ones from training and, with
    ``--skip-invalid-size-inputs-valid-test``, from the accuracy."""
    settings = getattr(task, "settings", None)
    if settings is not None and settings.max_length > max_source_positions:
        raise PositionOptionError(
            f"the sentence pieces of {task.cfg.data} have up to {settings.max_length} words (posattn-prepare-tagging "
            f"--max-length {settings.max_length}) and the tagger reads at most {max_source_positions} "
            f"(--max-source-positions {max_source_positions}): fairseq would leave the longer pieces out of "
            f"training and of the accuracy. Give --max-source-positions {settings.max_length}, or prepare the data "
            f"with --max-length {max_source_positions}")


class SanTaggerEncoder(PositionSideOwner, FairseqEncoder):
    """Word (+ position) (+ character CNN) input, position-aware self-attention layers, and the
    residual from the input to the output (Dufter et al. 2020, Table 1a)."""

    def __init__(self, args: argparse.Namespace, words: Any, chars: Any, position_options: SidePositionOptions):
        self.position_side = PositionSide(position_options, right_padded=False, causal=False)
        super().__init__(words)
        self.padding_idx = words.pad()
        self.max_source_positions = args.max_source_positions
        self.position_embedding = args.position_embedding
        self.embed_words = nn.Embedding(len(words), args.word_embed_dim, padding_idx=self.padding_idx)
        nn.init.normal_(self.embed_words.weight, mean=0, std=args.word_embed_dim ** -0.5)
        nn.init.zeros_(self.embed_words.weight[self.padding_idx])
        self.embed_positions = self._build_position_embedding(args)
        self.char_encoder = CharCNNWordEncoder(len(chars), chars.pad(), args.char_embed_dim,
                                               args.char_cnn_filters, args.char_cnn_width)
        self.output_dim = self._width(args)
        cfg = _layer_config(args, self.output_dim)
        self.dropout_p = args.dropout
        self.dropout_module = FairseqDropout(args.dropout, module_name=self.__class__.__name__)
        self.layers = nn.ModuleList(
            self.position_side.next_layer(lambda index: PositionAwareEncoderLayer(cfg, position_options, index), cfg)
            for _ in range(args.encoder_layers))
        self.position_side.attach(self)
        self.layer_norm = LayerNorm(self.output_dim) if args.encoder_normalize_before else None

    def _build_position_embedding(self, args: argparse.Namespace) -> Optional[nn.Embedding]:
        if args.position_embedding == "none":
            return None
        dim = args.word_embed_dim if args.position_embedding == "add" else args.position_embed_dim
        embedding = nn.Embedding(args.max_source_positions, dim)
        nn.init.normal_(embedding.weight, mean=0, std=dim ** -0.5)
        return embedding

    @staticmethod
    def _width(args: argparse.Namespace) -> int:
        width = args.word_embed_dim + args.char_cnn_filters
        if args.position_embedding == "concat":
            width += args.position_embed_dim
        if width % args.encoder_attention_heads:
            raise PositionOptionError(
                f"the layer width {width} (--word-embed-dim + --char-cnn-filters"
                f"{' + --position-embed-dim' if args.position_embedding == 'concat' else ''}) is not "
                f"divisible by --encoder-attention-heads {args.encoder_attention_heads}")
        return width

    def forward(self, src_tokens: Tensor, src_lengths: Optional[Tensor] = None,
                src_chars: Optional[Tensor] = None) -> Dict[str, Tensor]:
        if src_chars is None or src_chars.shape[:2] != src_tokens.shape:
            raise ValueError("san_tagger needs the characters of every word (net_input['src_chars'], "
                             "(batch, words, max_chars)): train and predict with --task pos_tagging")
        ctx = self.position_side.context(src_tokens, self.padding_idx)
        x0 = self.embed(src_tokens, src_chars, ctx)
        x = self.dropout_module(x0).transpose(0, 1)
        for layer in self.layers:
            x = layer(x, position_context=ctx)
        if self.layer_norm is not None:
            x = self.layer_norm(x)
        x = (x.transpose(0, 1) + x0).masked_fill(ctx.padding_mask.unsqueeze(-1), 0.0)
        return {"encoder_out": x, "padding_mask": ctx.padding_mask}

    def embed(self, src_tokens: Tensor, src_chars: Tensor, ctx: PositionContext) -> Tensor:
        """``(batch, words, width)``: [word (+ position) ; position (concat) ; character CNN]."""
        x = self.embed_words(src_tokens)
        if self.embed_positions is not None:
            positions = self._positions(src_tokens, ctx)
            if self.position_embedding == "add":
                x = x + self.embed_positions(positions)
            else:
                x = torch.cat([x, self.embed_positions(positions)], dim=-1)
        return torch.cat([x, self.char_encoder(src_chars)], dim=-1)

    def _positions(self, src_tokens: Tensor, ctx: PositionContext) -> Tensor:
        length = src_tokens.size(1)
        if length > self.max_source_positions:
            raise ValueError(
                f"a sentence piece of {length} words is longer than --max-source-positions "
                f"{self.max_source_positions}: prepare the data with posattn-prepare-tagging --max-length "
                f"{self.max_source_positions} (splits longer sentences) or raise --max-source-positions")
        return ctx.positions

    def reorder_encoder_out(self, encoder_out: Dict[str, Tensor], new_order: Tensor) -> Dict[str, Tensor]:
        return {key: value.index_select(0, new_order) for key, value in encoder_out.items()}

    def max_positions(self) -> int:
        return self.max_source_positions


def _layer_config(args: argparse.Namespace, width: int) -> TransformerConfig:
    """fairseq's encoder-layer config at the tagger's layer width."""
    layer_args = copy.copy(args)
    layer_args.encoder_embed_dim = width
    return TransformerConfig.from_namespace(layer_args)


@register_model_architecture("san_tagger", "san_tagger")
def san_tagger_base(args: argparse.Namespace) -> None:
    """Dufter et al. (2020), Table 1b, UD column: d = 128, 4 layers, 4 heads, character CNN of 64
    filters of width 3 over 64-dimensional character embeddings, t = 60, dropout 0.1, ReLU."""
    args.word_embed_dim = getattr(args, "word_embed_dim", 128)
    args.position_embedding = getattr(args, "position_embedding", "add")
    args.position_embed_dim = getattr(args, "position_embed_dim", args.word_embed_dim)
    args.char_embed_dim = getattr(args, "char_embed_dim", 64)
    args.char_cnn_filters = getattr(args, "char_cnn_filters", 64)
    args.char_cnn_width = getattr(args, "char_cnn_width", 3)
    args.encoder_layers = getattr(args, "encoder_layers", 4)
    args.encoder_attention_heads = getattr(args, "encoder_attention_heads", 4)
    args.encoder_ffn_embed_dim = getattr(args, "encoder_ffn_embed_dim", 256)
    args.encoder_normalize_before = getattr(args, "encoder_normalize_before", False)
    args.activation_fn = getattr(args, "activation_fn", "relu")
    args.dropout = getattr(args, "dropout", 0.1)
    args.attention_dropout = getattr(args, "attention_dropout", 0.0)
    args.activation_dropout = getattr(args, "activation_dropout", 0.0)
    args.max_source_positions = getattr(args, "max_source_positions", 60)
    set_layer_wrapping_defaults(args)
    set_position_defaults(args, ["encoder"])


@register_model_architecture("san_tagger", "san_tagger_dufter2020_ptb")
def san_tagger_dufter2020_ptb(args: argparse.Namespace) -> None:
    """Dufter et al. (2020), Table 1b, PTB column: d = 300 word and position embeddings (the paper
    starts from frozen fastText vectors, which this preset does not load)."""
    args.word_embed_dim = getattr(args, "word_embed_dim", 300)
    san_tagger_base(args)
