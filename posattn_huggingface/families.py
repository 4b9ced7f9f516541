"""The model families the front-end takes (a ``config.model_type`` each, all tested: :data:`FAMILIES`): their
self-attention modules, their attention dropout, how each turns its own positions off, and what its layers bring
beside q, k and v (:mod:`posattn_huggingface.layer_features`: sliding windows, which every layer's attention function
composes from the keyword its module passes, and Gemma's logit soft-capping, given to each layer's method here).
docs/huggingface.md's family table says what each honours or refuses."""

from dataclasses import dataclass
from typing import Any, Callable, Dict, Optional, Tuple

import torch
from torch import Tensor, nn
from transformers import PreTrainedModel

from posattn.attention import PositionKernel
from posattn_huggingface.layer_features import cap_logits
from posattn_huggingface.names import HuggingFaceRefusal


def _nothing_more(module: nn.Module, method: PositionKernel) -> None:
    """A layer that brings nothing beside q, k and v that its method must take."""


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
    #: gives a layer's method what its module brings (Gemma's soft-capping), or refuses it
    adapt_layer: Callable[[nn.Module, PositionKernel], None] = _nothing_more


class UnrotatedPositions(nn.Module):
    """A rotary position embedding module (Llama's and the other RoPE families') made the identity: ``cos = 1``,
    ``sin = 0`` of the shape it returns (``(batch, length, head_dim)``), so that ``q * cos + rotate_half(q) * sin`` is
    ``q`` exactly; over the whole head, so that a partial rotation (GPT-NeoX's ``partial_rotary_factor``, Phi-3's)
    rotates nothing either. ``layer_type``: Gemma 3's and ModernBERT's modules take the layer's kind (one rotation
    each), the identity for every kind."""

    def __init__(self, head_dim: int):
        super().__init__()
        self.head_dim = head_dim

    def forward(self, x: Tensor, position_ids: Tensor, layer_type: Optional[str] = None) -> Tuple[Tensor, Tensor]:
        shape = (*position_ids.shape, self.head_dim)
        return (torch.ones(shape, dtype=x.dtype, device=x.device),
                torch.zeros(shape, dtype=x.dtype, device=x.device))


def head_dim(config: Any) -> int:
    """The size of one head of the model's attention."""
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


def _unrotate(model: PreTrainedModel) -> str:
    model.base_model.rotary_emb = UnrotatedPositions(head_dim(model.config))
    return "the query/key rotation (RoPE, rotary_emb) made the identity"


def _unrotate_partially(model: PreTrainedModel) -> str:
    factor = model.config.rope_parameters.get("partial_rotary_factor", 1.0)
    _unrotate(model)
    return f"the query/key rotation of the first {factor:g} of each head (partial_rotary_factor) made the identity"


def _zero_embedding(embedding: nn.Embedding) -> None:
    """An absolute position embedding that adds nothing: zero and frozen (its state-dict key stays)."""
    with torch.no_grad():
        embedding.weight.zero_()
    embedding.weight.requires_grad_(False)


def _zero_gpt2_positions(model: PreTrainedModel) -> str:
    _zero_embedding(model.base_model.wpe)
    return "the learned absolute position embedding (wpe) zeroed and frozen"


def _zero_absolute_positions(model: PreTrainedModel) -> str:
    _zero_embedding(model.base_model.embeddings.position_embeddings)
    return "the absolute position embedding (embeddings.position_embeddings) zeroed and frozen"


#: the families taken, by ``model_type`` (SmolLM is a Llama); every one tested (tests/test_huggingface.py: Llama,
#: GPT-2, BERT; tests/test_huggingface_families.py: the others, and SmolLM's configuration)
FAMILIES: Dict[str, Family] = {
    "llama": Family("Llama", True, "LlamaAttention", "attention_dropout", _unrotate),
    "gpt2": Family("GPT-2", True, "GPT2Attention", "attn_pdrop", _zero_gpt2_positions),
    "bert": Family("BERT", False, "BertSelfAttention", "attention_probs_dropout_prob", _zero_absolute_positions),
    "qwen2": Family("Qwen2", True, "Qwen2Attention", "attention_dropout", _unrotate),
    "qwen3": Family("Qwen3", True, "Qwen3Attention", "attention_dropout", _unrotate),
    "mistral": Family("Mistral", True, "MistralAttention", "attention_dropout", _unrotate),
    "gemma2": Family("Gemma 2", True, "Gemma2Attention", "attention_dropout", _unrotate, cap_logits),
    "gemma3_text": Family("Gemma 3 (text)", True, "Gemma3Attention", "attention_dropout", _unrotate, cap_logits),
    "phi3": Family("Phi-3", True, "Phi3Attention", "attention_dropout", _unrotate),
    "olmo2": Family("OLMo-2", True, "Olmo2Attention", "attention_dropout", _unrotate),
    "gpt_neox": Family("GPT-NeoX", True, "GPTNeoXAttention", "attention_dropout", _unrotate_partially),
    "roberta": Family("RoBERTa", False, "RobertaSelfAttention", "attention_probs_dropout_prob",
                      _zero_absolute_positions),
    "modernbert": Family("ModernBERT", False, "ModernBertAttention", "attention_dropout", _unrotate),
}


def family_of(model: PreTrainedModel) -> Family:
    """The model's :class:`Family`; refuses another model type and configurations the front-end does not take."""
    config = model.config
    family = FAMILIES.get(getattr(config, "model_type", None))
    if family is None:
        names = ", ".join(family.name for family in FAMILIES.values())
        raise HuggingFaceRefusal(f"posattn_huggingface takes the families {names} (model_type {', '.join(FAMILIES)}), "
                                 f"not {type(model).__name__} (model_type {getattr(config, 'model_type', None)!r})")
    _check_geometry(family, config)
    return family


def _check_geometry(family: Family, config: Any) -> None:
    """Refuse a configuration whose layers attend otherwise than the family's side: a decoder made bidirectional
    (Gemma's ``use_bidirectional_attention``), an encoder as a decoder, cross-attention."""
    if family.causal and (getattr(config, "use_bidirectional_attention", False)
                          or not getattr(config, "is_causal", True)):
        raise HuggingFaceRefusal(f"posattn_huggingface takes {family.name} as a causal model, not with bidirectional "
                                 "attention (use_bidirectional_attention=False)")
    if getattr(config, "add_cross_attention", False) or (not family.causal and getattr(config, "is_decoder", False)):
        raise HuggingFaceRefusal(f"posattn_huggingface takes {family.name} as a "
                                 f"{'decoder' if family.causal else 'bidirectional encoder'} without "
                                 "cross-attention (is_decoder=False, add_cross_attention=False)")
