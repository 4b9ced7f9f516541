"""``--model llama``: the suite's second model, a Hugging Face Llama of the tier's size (transformers, the extra
``hf``) switched to the method by ``posattn_huggingface.apply_position_method``, so that the comparison can be
repeated on the model family researchers fine-tune. ``nope`` is the Llama with its rotation made the identity
(the front-end's ``UnrotatedPositions``); ``absolute`` is the suite decoder's input embedding, which a Llama has
no place for, and is refused in one line."""

from typing import Any

from torch import Tensor, nn

from posattn.errors import UserError
from posattn.position_options import SidePositionOptions
from posattn_tasks.methods import ABSOLUTE, NO_POSITIONS, method_options
from posattn_tasks.model import ModelSize


class LlamaRefusal(UserError, ValueError):
    """A method the Llama model of the suite does not take, or transformers missing."""


class LlamaTaskModel(nn.Module):
    """Logits ``(batch, length, vocabulary)`` of ``tokens`` from a switched Llama, and the length check."""

    def __init__(self, llama: Any, options: SidePositionOptions):
        super().__init__()
        self.llama, self.options = llama, options

    def forward(self, tokens: Tensor) -> Tensor:
        return self.llama(input_ids=tokens).logits

    def check_length(self, length: int) -> None:
        self.options.check_length(length)


def build_llama(vocabulary_size: int, size: ModelSize, method: str, options: SidePositionOptions) -> LlamaTaskModel:
    """A Llama of ``size`` (no dropout, untied output, full attention heads) with ``method``; its t is
    ``options``' (the suite's, so that it refuses the lengths the suite's decoder refuses)."""
    if method == ABSOLUTE:
        raise LlamaRefusal("--model llama takes the registry's methods and nope; absolute (the sinusoidal input "
                           "embedding) is the suite decoder's (--model posattn)")
    try:
        import transformers

        import posattn_huggingface
    except ImportError as missing:
        raise LlamaRefusal(f"--model llama needs the extra hf (pip install \"fairseq-posattn[hf]\"): {missing}") \
            from None
    config = transformers.LlamaConfig(
        vocab_size=vocabulary_size, hidden_size=size.dim, intermediate_size=4 * size.dim,
        num_hidden_layers=size.layers, num_attention_heads=size.heads, num_key_value_heads=size.heads,
        max_position_embeddings=options.max_positions, attention_dropout=0.0, tie_word_embeddings=False)
    llama = transformers.LlamaForCausalLM(config)
    if method == NO_POSITIONS:
        llama.model.rotary_emb = posattn_huggingface.UnrotatedPositions(size.dim // size.heads)
    else:
        posattn_huggingface.apply_position_method(llama, max_positions=options.max_positions,
                                                  **method_options(method))
    return LlamaTaskModel(llama, options)
