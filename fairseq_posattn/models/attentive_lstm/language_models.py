"""The fairseq models ``attentive_lstm_lm`` (Salton et al. 2017), ``positional_attentive_lstm_lm`` (Dagan
2019) and ``baseline_lstm_lm`` (Dagan's LSTM baseline), their command-line options and their
architectures (the papers' sizes).

Dropout defaults are the paper's 0.5 / 0.2 / 0.5 (embeddings / between the layers / output); a
``--dropout`` given on the command line also becomes the default of the other two, as in fairseq's
``lstm_lm``.
"""

import argparse
from typing import Any, Optional, Tuple

from fairseq import utils
from fairseq.models import FairseqLanguageModel, register_model, register_model_architecture
from fairseq.models.lstm import Embedding
from torch import nn

from fairseq_posattn.models.attentive_lstm.decoder import (
    DEFAULT_MAX_TARGET_POSITIONS,
    INITS,
    NORMALIZERS,
    AttentiveLSTMDecoder,
)
from fairseq_posattn.models.attentive_lstm.positional_attention import GAUSSIAN_EPS
from fairseq_posattn.models.evaluation_coverage import score_every_block
from fairseq_posattn.models.hub_loading import PosattnHubMixin


def _add_lstm_lm_args(parser: argparse.ArgumentParser) -> None:
    # fmt: off
    parser.add_argument('--dropout', type=float, metavar='D',
                        help='dropout between the stacked LSTM layers (the paper\'s "recurrent '
                             'connections"), and the default of --decoder-dropout-in/-out when '
                             'given (default: the paper\'s, 0.2 between layers, 0.5 in and out; '
                             'baseline_lstm_lm: 0.25 between, 0.4 in, 0.5 out)')
    parser.add_argument('--decoder-embed-dim', type=int, metavar='N',
                        help='embedding dimension (default: 400)')
    parser.add_argument('--decoder-embed-path', type=str, metavar='STR',
                        help='path to pre-trained decoder embedding')
    parser.add_argument('--decoder-hidden-size', type=int, metavar='N',
                        help='LSTM hidden size (default: --decoder-embed-dim)')
    parser.add_argument('--decoder-layers', type=int, metavar='N',
                        help='number of stacked LSTM layers (default: 2; baseline_lstm_lm: 3)')
    parser.add_argument('--decoder-out-embed-dim', type=int, metavar='N',
                        help='output of the concatenation layer [c_t; h_t] -> this size; must equal '
                             '--decoder-embed-dim when tied (default: --decoder-embed-dim)')
    parser.add_argument('--decoder-dropout-in', type=float, metavar='D',
                        help='dropout on the input embeddings (default: --dropout if given, else 0.5; '
                             'baseline_lstm_lm: 0.4)')
    parser.add_argument('--decoder-dropout-out', type=float, metavar='D',
                        help='dropout after the concatenation layer (baseline_lstm_lm: after the LSTM), before '
                             'the output embedding (default: --dropout if given, else 0.5)')
    parser.add_argument('--share-decoder-input-output-embed', action=argparse.BooleanOptionalAction,
                        help='tie the output embedding to the input embedding (default: tied, as '
                             'the paper; --no-share-decoder-input-output-embed unties)')
    parser.add_argument('--checkpoint-activations', action='store_true',
                        help='recompute the attention over the past states (its B x T x T scores '
                             'and weights) in the backward pass instead of keeping it')
    parser.add_argument('--offload-activations', action='store_true',
                        help='keep the tensors saved for the backward pass in CPU memory; sets '
                             '--checkpoint-activations')
    parser.add_argument('--attentive-lm-init', choices=INITS,
                        help='authors (default): the released code\'s initialisation (PyTorch defaults '
                             'for the LSTMs, the concatenation layer, W_mu and w_sigma; xavier for '
                             'Salton\'s W_1 and w_2, zero biases); uniform: U(+-0.1) for every weight '
                             'and bias, as the paper\'s text')
    parser.add_argument('--decoder-reset-position-options', action='store_true',
                        help='load weights trained with other options that change what the model computes '
                             '(--tokens-per-sample of the positional attention\'s block N, the normaliser, the '
                             'sizes...: fine-tuning one model into another); refused otherwise, so that a resumed '
                             'checkpoint never silently becomes another model')
    # fmt: on


def _add_positional_args(parser: argparse.ArgumentParser) -> None:
    # fmt: off
    parser.add_argument('--positional-attention-hidden', type=int, metavar='N',
                        help='hidden size of the position-generator LSTM (default: 20)')
    parser.add_argument('--positional-attention-normalizer', choices=NORMALIZERS,
                        help='N in the positions i/N and t/N: "block" = --tokens-per-sample of the '
                             'training run (default, causal); "sentence" = the true length of each '
                             'sentence, the paper\'s choice, which LEAKS THE FUTURE (outputs depend '
                             'on the number of tokens that follow) and cannot generate step by step')
    parser.add_argument('--positional-attention-eps', type=float, metavar='EPS',
                        help='epsilon added to 2 sigma^2 in the Gaussian (default: 1e-3, the authors\' '
                             'code; models trained before this default keep 1e-6)')
    # fmt: on


def pretrained_embedding(args: Any, dictionary: Any) -> Optional[nn.Embedding]:
    """The embedding read from ``--decoder-embed-path`` (None without one)."""
    if not args.decoder_embed_path:
        return None
    embed = Embedding(len(dictionary), args.decoder_embed_dim, dictionary.pad())
    embed_dict = utils.parse_embedding(args.decoder_embed_path)
    utils.print_embed_overlap(embed_dict, dictionary)
    return utils.load_embedding(embed_dict, dictionary, embed)


def block_and_limit(args: Any, task: Any) -> Tuple[Optional[int], int]:
    """The training run's block length (in the model args, and so in the checkpoint, else the task's) and
    the position limit (``--max-target-positions``, else the block length, else no practical limit)."""
    task_cfg = getattr(task, "args", None) or getattr(task, "cfg", None)
    block_length = getattr(args, "tokens_per_sample", None) or getattr(task_cfg, "tokens_per_sample", None)
    max_target_positions = (
        getattr(args, "max_target_positions", None) or block_length or DEFAULT_MAX_TARGET_POSITIONS
    )
    return block_length, int(max_target_positions)


@register_model("attentive_lstm_lm")
class AttentiveLSTMLanguageModel(PosattnHubMixin, FairseqLanguageModel):
    """Attentive LSTM language model (Salton et al. 2017), sizes of Dagan 2019 by default."""

    attention_type = "salton"

    def __init__(self, decoder: AttentiveLSTMDecoder) -> None:
        super().__init__(decoder)

    @staticmethod
    def add_args(parser: argparse.ArgumentParser) -> None:
        """Add model-specific arguments to the parser."""
        _add_lstm_lm_args(parser)

    @classmethod
    def build_model(cls, args: Any, task: Any) -> "AttentiveLSTMLanguageModel":
        """Build a new model instance (as fairseq's ``lstm_lm``)."""
        if cls.attention_type == "positional":
            positional_attentive_lstm_lm(args)
        elif cls.attention_type == "none":
            baseline_lstm_lm(args)
        else:
            attentive_lstm_lm(args)
        block_length, max_target_positions = block_and_limit(args, task)
        dictionary = task.target_dictionary
        pretrained_embed = pretrained_embedding(args, dictionary)
        if args.share_decoder_input_output_embed and task.source_dictionary != task.target_dictionary:
            raise ValueError("--share-decoder-input-output-embed requires a joint dictionary")

        decoder = AttentiveLSTMDecoder(
            dictionary,
            attention=cls.attention_type,
            embed_dim=args.decoder_embed_dim,
            hidden_size=args.decoder_hidden_size,
            out_embed_dim=args.decoder_out_embed_dim,
            num_layers=args.decoder_layers,
            dropout_in=args.decoder_dropout_in,
            dropout_hidden=args.dropout,
            dropout_out=args.decoder_dropout_out,
            share_input_output_embed=args.share_decoder_input_output_embed,
            pretrained_embed=pretrained_embed,
            positional_attention_hidden=getattr(args, "positional_attention_hidden", 20),
            positional_attention_normalizer=getattr(args, "positional_attention_normalizer", "block"),
            block_length=block_length,
            max_target_positions=max_target_positions,
            checkpoint_activations=args.checkpoint_activations,
            offload_activations=args.offload_activations,
            positional_attention_eps=getattr(args, "positional_attention_eps", GAUSSIAN_EPS),
            init=args.attentive_lm_init,
            reset_position_options=args.decoder_reset_position_options,
        )
        score_every_block(task, fixed_limit=None)  # no parameter depends on a position
        return cls(decoder)


@register_model("positional_attentive_lstm_lm")
class PositionalAttentiveLSTMLanguageModel(AttentiveLSTMLanguageModel):
    """Positional attentive LSTM language model (Dagan 2019)."""

    attention_type = "positional"

    @staticmethod
    def add_args(parser: argparse.ArgumentParser) -> None:
        """Add model-specific arguments to the parser."""
        _add_lstm_lm_args(parser)
        _add_positional_args(parser)


@register_model("baseline_lstm_lm")
class BaselineLSTMLanguageModel(AttentiveLSTMLanguageModel):
    """Dagan's LSTM baseline (2019, Table 1: "Merity et al.", 7.86M parameters on PTB) as the authors' code
    builds it: their language model with attention off (no concatenation layer; ``logits_t = E h_t + b``),
    3 LSTM layers of 400, tied, dropout 0.4 on the embeddings, 0.25 between the layers, 0.5 on the output.
    Not AWD-LSTM: no weight drop, no variational dropout, no ASGD, as theirs."""

    attention_type = "none"


@register_model_architecture("attentive_lstm_lm", "attentive_lstm_lm")
def attentive_lstm_lm(args: Any) -> None:
    """The paper's sizes: embeddings and two LSTM layers of 400, tied, dropout 0.5 / 0.2 / 0.5."""
    dropout = getattr(args, "dropout", None)
    args.dropout = 0.2 if dropout is None else dropout
    args.decoder_embed_dim = getattr(args, "decoder_embed_dim", 400)
    args.decoder_embed_path = getattr(args, "decoder_embed_path", None)
    args.decoder_hidden_size = getattr(args, "decoder_hidden_size", args.decoder_embed_dim)
    args.decoder_layers = getattr(args, "decoder_layers", 2)
    args.decoder_out_embed_dim = getattr(args, "decoder_out_embed_dim", args.decoder_embed_dim)
    for name in ("decoder_dropout_in", "decoder_dropout_out"):
        if getattr(args, name, None) is None:
            setattr(args, name, 0.5 if dropout is None else dropout)
    if getattr(args, "share_decoder_input_output_embed", None) is None:
        args.share_decoder_input_output_embed = True
    args.offload_activations = getattr(args, "offload_activations", False)
    args.checkpoint_activations = getattr(args, "checkpoint_activations", False) or args.offload_activations
    # only matters for a new model: a checkpoint's weights replace the initialisation
    args.attentive_lm_init = getattr(args, "attentive_lm_init", None) or "authors"
    args.decoder_reset_position_options = getattr(args, "decoder_reset_position_options", False)


@register_model_architecture("positional_attentive_lstm_lm", "positional_attentive_lstm_lm")
def positional_attentive_lstm_lm(args: Any) -> None:
    """:func:`attentive_lstm_lm` plus a position generator of 20 and the causal block normalizer."""
    attentive_lstm_lm(args)
    args.positional_attention_hidden = getattr(args, "positional_attention_hidden", 20)
    args.positional_attention_normalizer = getattr(args, "positional_attention_normalizer", "block")
    # a checkpoint trained when the default was 1e-6 has no such argument: it gets 1e-3 here, and
    # PositionalAttention.upgrade_state_dict_named sets 1e-6 back when its weights are loaded
    if getattr(args, "positional_attention_eps", None) is None:
        args.positional_attention_eps = GAUSSIAN_EPS


@register_model_architecture("baseline_lstm_lm", "baseline_lstm_lm")
def baseline_lstm_lm(args: Any) -> None:
    """The authors' run of the baseline (their test.py): 3 LSTM layers of 400, tied, dropout 0.4 / 0.25 / 0.5
    (embeddings / between the layers / output)."""
    dropout = getattr(args, "dropout", None)
    args.dropout = 0.25 if dropout is None else dropout
    args.decoder_layers = getattr(args, "decoder_layers", 3)
    for name, default in (("decoder_dropout_in", 0.4), ("decoder_dropout_out", 0.5)):
        if getattr(args, name, None) is None:
            setattr(args, name, default if dropout is None else dropout)
    attentive_lstm_lm(args)
