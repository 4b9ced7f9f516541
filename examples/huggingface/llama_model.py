"""The recipe's model: a small ``transformers.LlamaForCausalLM`` built from a config, switched to a position
method with ``posattn_huggingface.apply_position_method``.

Sizes as the fairseq recipe's model (2 layers, d 128, 4 heads, tied input and output embeddings), in Llama's
blocks: pre-norm RMSNorm, a SwiGLU feed-forward network, no biases, a final RMSNorm, no embedding scale,
transformers' initialisation (every weight N(0, 0.02)). The SwiGLU width is 344: its three matrices
(3 x 128 x 344 = 132,096 weights) match the recipe's two-matrix FFN of 512 (2 x 128 x 512 plus biases =
131,712), as Llama's own 2/3 x 4d rule gives, rounded up to a multiple of 8; the model then has as many parameters
as the recipe's within 0.1%. Llama has one dropout, on the attention weights (``attention_dropout``): it takes the
recipe's 0.1 (fairseq's model drops the embeddings and the residual branches instead).

The methods: every causal variant of the position registry that the front-end takes on Llama, by its name and
with the fairseq recipe's options (examples/pytorch/methods.py), Llama's own rotation turned off; and
``llama-rope``, the Hugging Face model as it is (its own RoPE, no method), the baseline.
"""

from dataclasses import dataclass
from typing import List

import transformers
from torch import Tensor, nn

import posattn_huggingface
from data import PAD
from experiment import Protocol
from methods import NO_POSITIONS, method_names as registry_methods, method_options, side_options

#: the Hugging Face model as it is: Llama's rotary position embedding, no posattn method
LLAMA_ROPE = "llama-rope"


@dataclass
class LlamaSize:
    """``LlamaConfig``'s sizes: ``hidden_size``, ``intermediate_size`` (SwiGLU), layers, heads (as many key/value
    heads), ``attention_dropout``."""

    dim: int = 128
    intermediate_size: int = 344
    layers: int = 2
    heads: int = 4
    attention_dropout: float = 0.1


def method_names() -> List[str]:
    """``llama-rope`` and the registry's causal variants (without ``none``: the front-end switches Llama's own
    positions off only for a method)."""
    return [LLAMA_ROPE] + [name for name in registry_methods() if name != NO_POSITIONS]


def check_method(method: str) -> None:
    """``KeyError`` for an unknown method; the front-end's ``UserError`` (one line) for one it does not take on
    Llama, found by switching a tiny model before any training."""
    if method == LLAMA_ROPE:
        return
    if method == NO_POSITIONS:
        raise KeyError(f"'{NO_POSITIONS}' is not a method here: posattn_huggingface turns Llama's own positions off "
                       f"only for a method (the baseline without a method is '{LLAMA_ROPE}')")
    options = method_options(method)
    tiny = llama_config(16, LlamaSize(dim=8, intermediate_size=8, layers=1, heads=2), 8)
    posattn_huggingface.apply_position_method(transformers.LlamaForCausalLM(tiny), **options)


def llama_config(vocab_size: int, size: LlamaSize, max_positions: int) -> transformers.LlamaConfig:
    """The model's configuration: built for ``max_positions`` tokens, embeddings tied, the dictionary's pad index."""
    return transformers.LlamaConfig(
        vocab_size=vocab_size, hidden_size=size.dim, intermediate_size=size.intermediate_size,
        num_hidden_layers=size.layers, num_attention_heads=size.heads, num_key_value_heads=size.heads,
        max_position_embeddings=max_positions, attention_dropout=size.attention_dropout, tie_word_embeddings=True,
        pad_token_id=PAD, bos_token_id=0, eos_token_id=2)


def build_model(vocab_size: int, method: str, size: LlamaSize, protocol: Protocol,
                seed: int) -> transformers.LlamaForCausalLM:
    """The seeded model with ``method``. t (``max_positions``) is the examples/pytorch recipe's: the longest
    evaluation length, or the training length for a method with parameters per position (which then refuses the
    longer evaluations)."""
    transformers.set_seed(seed)
    model = transformers.LlamaForCausalLM(llama_config(vocab_size, size, max(protocol.lengths)))
    if method != LLAMA_ROPE:
        t = side_options(method, protocol.train_length, max(protocol.lengths)).max_positions
        posattn_huggingface.apply_position_method(model, max_positions=t, **method_options(method))
    return model


def parameter_count(model: nn.Module) -> int:
    """Parameters, the tied embedding once."""
    return sum(p.numel() for p in model.parameters())


class NextTokenLogits(nn.Module):
    """A causal LM as examples/pytorch's evaluation reads a model: tokens ``(batch, length)`` to logits
    ``(batch, length, vocab)``, without a cache."""

    def __init__(self, model: transformers.PreTrainedModel):
        super().__init__()
        self.model = model

    def forward(self, tokens: Tensor) -> Tensor:
        return self.model(input_ids=tokens, use_cache=False).logits
