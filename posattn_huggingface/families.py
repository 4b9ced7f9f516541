"""The model families the front-end takes (a ``config.model_type`` each): their self-attention modules, their
attention dropout, and how each turns its own positions off."""

from dataclasses import dataclass
from typing import Any, Callable, Dict, Tuple

import torch
from torch import Tensor, nn
from transformers import PreTrainedModel

from posattn_huggingface.names import HuggingFaceRefusal


@dataclass(frozen=True)
class Family:
    """What the front-end knows of one model family (a ``config.model_type``)."""

    name: str
    causal: bool
    #: the class name of its self-attention modules
    attention_class: str
    #: the configuration's attention dropout probability
    dropout_field: str
    #: turns the model's own positions off and says which they were
    turn_off_positions: Callable[[PreTrainedModel], str]


class UnrotatedPositions(nn.Module):
    """Llama's position embedding module made the identity: ``cos = 1``, ``sin = 0`` of the shape it returns
    (``(batch, length, head_dim)``), so that ``q * cos + rotate_half(q) * sin`` is ``q`` exactly."""

    def __init__(self, head_dim: int):
        super().__init__()
        self.head_dim = head_dim

    def forward(self, x: Tensor, position_ids: Tensor) -> Tuple[Tensor, Tensor]:
        shape = (*position_ids.shape, self.head_dim)
        return (torch.ones(shape, dtype=x.dtype, device=x.device),
                torch.zeros(shape, dtype=x.dtype, device=x.device))


def head_dim(config: Any) -> int:
    """The size of one head of the model's attention."""
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


def _unrotate_llama(model: PreTrainedModel) -> str:
    base = model.base_model
    base.rotary_emb = UnrotatedPositions(head_dim(model.config))
    return "the query/key rotation (RoPE) made the identity"


def _zero_embedding(embedding: nn.Embedding) -> None:
    """An absolute position embedding that adds nothing: zero and frozen (its state-dict key stays)."""
    with torch.no_grad():
        embedding.weight.zero_()
    embedding.weight.requires_grad_(False)


def _zero_gpt2_positions(model: PreTrainedModel) -> str:
    _zero_embedding(model.base_model.wpe)
    return "the learned absolute position embedding (wpe) zeroed and frozen"


def _zero_bert_positions(model: PreTrainedModel) -> str:
    _zero_embedding(model.base_model.embeddings.position_embeddings)
    return "the absolute position embedding (embeddings.position_embeddings) zeroed and frozen"


FAMILIES: Dict[str, Family] = {
    "llama": Family("Llama", True, "LlamaAttention", "attention_dropout", _unrotate_llama),
    "gpt2": Family("GPT-2", True, "GPT2Attention", "attn_pdrop", _zero_gpt2_positions),
    "bert": Family("BERT", False, "BertSelfAttention", "attention_probs_dropout_prob", _zero_bert_positions),
}


def family_of(model: PreTrainedModel) -> Family:
    """The model's :class:`Family`; refuses another model type and configurations the front-end does not take."""
    config = model.config
    family = FAMILIES.get(getattr(config, "model_type", None))
    if family is None:
        raise HuggingFaceRefusal(f"posattn_huggingface takes Llama, GPT-2 and BERT models (model_type "
                                 f"{', '.join(FAMILIES)}), not {type(model).__name__} "
                                 f"(model_type {getattr(config, 'model_type', None)!r})")
    if getattr(config, "add_cross_attention", False) or (not family.causal and getattr(config, "is_decoder", False)):
        raise HuggingFaceRefusal(f"posattn_huggingface takes {family.name} as a "
                                 f"{'decoder' if family.causal else 'bidirectional encoder'} without "
                                 "cross-attention (is_decoder=False, add_cross_attention=False)")
    return family
