"""``transformer_posattn_classifier``: a position-aware transformer encoder that classifies sentences.

For fairseq's own ``--task sentence_prediction`` and ``--criterion sentence_prediction``: the task
builds the model and calls :meth:`~PositionAwareTransformerClassifier.register_classification_head`,
the criterion calls ``model(**net_input, features_only=True, classification_head_name=...)`` and
reads ``(logits, extra)``.

The encoder is :class:`~fairseq_posattn.models.position_aware_transformer.PositionAwareTransformerEncoder`
(fairseq's transformer encoder: token embeddings scaled by sqrt(d), sinusoidal position embeddings
unless ``--encoder-learned-pos`` or ``--no-token-positional-embeddings``) with every ``--encoder-*``
position option (docs/methods.md); t is the task's ``--max-positions``. With every position
option at its default the encoder is fairseq's.

The head pools the encoder output over each sentence and applies a RoBERTa-style classifier
(dense, tanh, dropout, projection). ``--classifier-pooling mean`` (the default) averages the
non-pad tokens (the words and the EOS that fairseq-preprocess appends); ``first`` takes the first
token. RoBERTa reads its ``<s>`` token, whose representation pre-training taught to summarise the
sentence; a classifier trained from scratch has no such token (the task prepends one only with
``--init-token``) and its first position is just the first word, so it averages instead.

Presets: ``transformer_posattn_classifier`` (2 layers, 256 dimensions, 4 heads, feed-forward 512)
and ``transformer_posattn_classifier_wu2021``, the text-classification setup of Wu et al. (2021,
DA-Transformer, section 4.1): one layer of 16 heads of 16 dimensions. The paper's Adam with
learning rate 1e-3 is a training flag (``--optimizer adam --lr 1e-3``), not an architecture default.
"""

import argparse
import functools
from typing import Any, Callable, Dict, Optional, Tuple

import torch
from fairseq import utils
from fairseq.models import FairseqEncoderModel, register_model, register_model_architecture
from fairseq.models.transformer import Embedding, TransformerConfig
from fairseq.utils import safe_getattr
from torch import Tensor, nn

from fairseq_posattn.models.hub_loading import PosattnHubMixin
from fairseq_posattn.models.position_aware_transformer import PositionAwareTransformerEncoder
from fairseq_posattn.models.position_options import add_position_args, set_position_defaults
from posattn.position_options import SidePositionOptions
from fairseq_posattn.models.position_side import add_layer_wrapping_args, set_layer_wrapping_defaults
from posattn.errors import UserError

POOLING_CHOICES = ["mean", "first"]
DEFAULT_MAX_POSITIONS = 512  # the task's --max-positions default


class LabelOutsideClassesError(UserError, ValueError):
    """A sentence whose label is none of the classifier's classes."""


def pool(features: Tensor, padding_mask: Optional[Tensor], pooling: str) -> Tensor:
    """``(batch, dim)`` summary of ``features`` ``(batch, length, dim)``; ``padding_mask`` is True at pads."""
    if padding_mask is None:
        return features.mean(dim=1) if pooling == "mean" else features[:, 0]
    real = (~padding_mask).unsqueeze(-1).type_as(features)
    if pooling == "mean":
        return (features * real).sum(dim=1) / real.sum(dim=1).clamp(min=1)
    first = real.squeeze(-1).argmax(dim=1)  # the first non-pad index, whichever side is padded
    return features[torch.arange(features.size(0), device=features.device), first]


class PooledClassificationHead(nn.Module):
    """Pooling over the sentence, then RoBERTa's head: dense, activation, dropout, projection."""

    def __init__(self, input_dim: int, inner_dim: int, num_classes: int, activation_fn: str,
                 pooler_dropout: float, pooling: str):
        super().__init__()
        self.pooling = pooling
        self.dense = nn.Linear(input_dim, inner_dim)
        self.activation_fn = utils.get_activation_fn(activation_fn)
        self.dropout = nn.Dropout(p=pooler_dropout)
        self.out_proj = nn.Linear(inner_dim, num_classes)

    def forward(self, features: Tensor, padding_mask: Optional[Tensor]) -> Tensor:
        x = self.dropout(pool(features, padding_mask, self.pooling))
        x = self.dropout(self.activation_fn(self.dense(x)))
        return self.out_proj(x)


@register_model("transformer_posattn_classifier")
class PositionAwareTransformerClassifier(PosattnHubMixin, FairseqEncoderModel):
    """Encoder plus named classification heads, as fairseq's sentence_prediction task expects."""

    def __init__(self, args: argparse.Namespace, encoder: nn.Module):
        super().__init__(encoder)
        self.args = args
        self.classification_heads = nn.ModuleDict()

    @staticmethod
    def add_args(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--encoder-layers", type=int, metavar="N", help="encoder layers")
        parser.add_argument("--encoder-embed-dim", type=int, metavar="N", help="embedding and model dimension")
        parser.add_argument("--encoder-ffn-embed-dim", type=int, metavar="N", help="feed-forward dimension")
        parser.add_argument("--encoder-attention-heads", type=int, metavar="N", help="attention heads")
        parser.add_argument("--encoder-normalize-before", action="store_true",
                            help="layer norm before each block (pre-norm)")
        parser.add_argument("--encoder-learned-pos", action="store_true",
                            help="learned instead of sinusoidal position embeddings")
        parser.add_argument("--no-token-positional-embeddings", action="store_true",
                            help="no position embeddings at all (the position-unaware baseline, or a "
                                 "model whose attention alone knows positions)")
        parser.add_argument("--no-scale-embedding", action="store_true", help="do not scale embeddings by sqrt(d)")
        parser.add_argument("--layernorm-embedding", action="store_true", help="layer norm on the embeddings")
        parser.add_argument("--activation-fn", choices=utils.get_available_activation_fns(),
                            help="feed-forward activation")
        parser.add_argument("--dropout", type=float, metavar="D", help="dropout")
        parser.add_argument("--attention-dropout", type=float, metavar="D", help="dropout of attention weights")
        parser.add_argument("--activation-dropout", type=float, metavar="D", help="dropout after the activation")
        add_layer_wrapping_args(parser)
        parser.add_argument("--classifier-pooling", choices=POOLING_CHOICES,
                            help="summary of the sentence for the head: mean over its tokens, or its first token")
        parser.add_argument("--pooler-activation-fn", choices=utils.get_available_activation_fns(),
                            help="activation of the head's dense layer")
        parser.add_argument("--pooler-dropout", type=float, metavar="D", help="dropout in the head")
        add_position_args(parser, "encoder")

    @classmethod
    def build_model(cls, args: argparse.Namespace, task: Any) -> "PositionAwareTransformerClassifier":
        posattn_classifier_base(args)
        args.max_source_positions = args.max_positions
        options = SidePositionOptions.from_config(
            args, "encoder", causal=False, max_positions=args.max_positions,
            max_positions_option="--max-positions")
        options.check_task(task)
        cfg = TransformerConfig.from_namespace(args)
        dictionary = task.source_dictionary
        embed_tokens = Embedding(len(dictionary), cfg.encoder.embed_dim, dictionary.pad())
        check_every_label(task)
        return cls(args, PositionAwareTransformerEncoder(cfg, dictionary, embed_tokens, options))

    def forward(self, src_tokens: Tensor, src_lengths: Optional[Tensor] = None, features_only: bool = True,
                return_all_hiddens: bool = False,
                classification_head_name: Optional[str] = None) -> Tuple[Tensor, Dict[str, Any]]:
        """``(logits (batch, classes), extra)`` with ``classification_head_name``, else the encoder's
        ``(features (batch, length, dim), extra)``. ``features_only`` is accepted for the
        sentence_prediction criterion; there is no language-model output."""
        encoder_out = self.encoder(src_tokens, src_lengths=src_lengths, return_all_hiddens=return_all_hiddens)
        features = encoder_out["encoder_out"][0].transpose(0, 1)
        padding_mask = encoder_out["encoder_padding_mask"][0] if encoder_out["encoder_padding_mask"] else None
        extra = {"padding_mask": padding_mask, "inner_states": encoder_out["encoder_states"]}
        if classification_head_name is None:
            return features, extra
        return self.classification_heads[classification_head_name](features, padding_mask), extra

    def register_classification_head(self, name: str, num_classes: int, inner_dim: Optional[int] = None,
                                     **kwargs: Any) -> None:
        """Add (or replace) head ``name`` with ``num_classes`` outputs; called by the task."""
        self.classification_heads[name] = PooledClassificationHead(
            self.args.encoder_embed_dim, inner_dim or self.args.encoder_embed_dim, num_classes,
            self.args.pooler_activation_fn, self.args.pooler_dropout, self.args.classifier_pooling)


def check_every_label(task: Any) -> None:
    """Refuse a split with a label outside the classifier's classes, in one line, where fairseq's criterion
    would stop at its batch with "IndexError: Target -1 is out of bounds" (a label that the training labels
    do not have, which fairseq-preprocess binarizes as ``<unk>``): the splits loaded so far (fairseq-train
    loads its validation splits before the model) and, from now on, every split the task loads."""
    cfg = getattr(task, "cfg", None)
    if cfg is None or getattr(cfg, "regression_target", True) or getattr(task, "label_dictionary", None) is None:
        return
    for split, dataset in task.datasets.items():
        check_labels(split, dataset, task)
    original: Callable[..., Any] = task.load_dataset
    if getattr(original, "checks_labels", False):
        return

    @functools.wraps(original)
    def load_dataset(split: str, *args: Any, **kwargs: Any) -> Any:
        dataset = original(split, *args, **kwargs)
        check_labels(split, task.datasets[split], task)
        return dataset

    load_dataset.checks_labels = True  # type: ignore[attr-defined]
    task.load_dataset = load_dataset


def check_labels(split: str, dataset: Any, task: Any) -> None:
    """Every target of ``dataset`` (fairseq's sentence_prediction split) must be a class, 0..num_classes-1."""
    targets = getattr(getattr(dataset, "dataset", dataset), "defn", {}).get("target")
    if targets is None or len(targets) == 0:
        return
    labels = torch.cat([targets[i].view(-1) for i in range(len(targets))])
    outside = ((labels < 0) | (labels >= task.cfg.num_classes)).nonzero().view(-1)
    if len(outside):
        raise LabelOutsideClassesError(
            f"{task.cfg.data}/label/{split}: sentence {int(outside[0]) + 1} (line {int(outside[0]) + 1} of the "
            f"label text that fairseq-preprocess binarized) has {label_named(int(labels[outside[0]]), task)}; "
            f"{len(outside)} of the split's {len(labels)} sentences have no class of the classifier. Correct or "
            f"drop those lines, or prepare the splits with posattn-prepare-classification, which refuses them")


def label_named(target: int, task: Any) -> str:
    """What the label of a target outside the classes is, for the refusal."""
    dictionary, classes = task.label_dictionary, task.cfg.num_classes
    symbol = dictionary[target + dictionary.nspecial]
    if target < 0:
        known = ", ".join(dictionary.symbols[dictionary.nspecial:dictionary.nspecial + classes])
        return (f"the label {symbol}: fairseq-preprocess wrote it for a label that label/dict.txt, the training "
                f"labels ({known}), does not hold")
    return f"the label {symbol!r}, class {target}, beyond --num-classes {classes}"


@register_model_architecture("transformer_posattn_classifier", "transformer_posattn_classifier")
def posattn_classifier_base(args: argparse.Namespace) -> None:
    """Small sizes that train on SST-2 on a CPU in minutes."""
    args.max_positions = safe_getattr(args, "max_positions", DEFAULT_MAX_POSITIONS)
    args.encoder_layers = safe_getattr(args, "encoder_layers", 2)
    args.encoder_embed_dim = safe_getattr(args, "encoder_embed_dim", 256)
    args.encoder_ffn_embed_dim = safe_getattr(args, "encoder_ffn_embed_dim", 512)
    args.encoder_attention_heads = safe_getattr(args, "encoder_attention_heads", 4)
    args.encoder_normalize_before = safe_getattr(args, "encoder_normalize_before", False)
    args.encoder_learned_pos = safe_getattr(args, "encoder_learned_pos", False)
    args.no_token_positional_embeddings = safe_getattr(args, "no_token_positional_embeddings", False)
    args.no_scale_embedding = safe_getattr(args, "no_scale_embedding", False)
    args.layernorm_embedding = safe_getattr(args, "layernorm_embedding", False)
    args.activation_fn = safe_getattr(args, "activation_fn", "relu")
    args.dropout = safe_getattr(args, "dropout", 0.1)
    args.attention_dropout = safe_getattr(args, "attention_dropout", 0.1)
    args.activation_dropout = safe_getattr(args, "activation_dropout", 0.0)
    set_layer_wrapping_defaults(args)
    args.classifier_pooling = safe_getattr(args, "classifier_pooling", "mean")
    args.pooler_activation_fn = safe_getattr(args, "pooler_activation_fn", "tanh")
    args.pooler_dropout = safe_getattr(args, "pooler_dropout", 0.1)
    set_position_defaults(args, ["encoder"])


@register_model_architecture("transformer_posattn_classifier", "transformer_posattn_classifier_wu2021")
def posattn_classifier_wu2021(args: argparse.Namespace) -> None:
    """Wu et al. (2021), section 4.1: one layer, 16 heads of 16 dimensions (so d = 256). The paper
    starts from 300-dimensional GloVe vectors; here the word embeddings are learned, of the model's
    dimension as fairseq's encoder needs. The paper gives no feed-forward size or dropout: they stay
    the base preset's."""
    args.encoder_layers = safe_getattr(args, "encoder_layers", 1)
    args.encoder_attention_heads = safe_getattr(args, "encoder_attention_heads", 16)
    args.encoder_embed_dim = safe_getattr(args, "encoder_embed_dim", 256)
    posattn_classifier_base(args)
