"""The Hugging Face group's models (``--huggingface``): a small ``transformers.LlamaForCausalLM`` on
``attn_implementation="sdpa"`` with its own RoPE (the reference), and the same model, with the same weights,
switched to a position method by ``posattn_huggingface.apply_position_method(model, **options)``; the loss of
their train step and their greedy generation with the cache.

Only the worker of that group imports this module, and with it transformers.
"""

import copy
from typing import Any, Dict, Mapping, Tuple

import torch
import torch.nn.functional as F
import transformers

import posattn_huggingface
from posattn_benchmark.variants import HUGGINGFACE_OPTIONS, VANILLA_LLAMA, Variant

#: the reference's attention implementation (a switched model runs posattn_huggingface's)
REFERENCE_ATTENTION = "sdpa"


class LlamaModels:
    """One Llama configuration: builds the group's models, and computes their loss and their generation."""

    def __init__(self, sizes: Mapping[str, int], vocab_size: int, max_positions: int, dictionary: Any):
        self.pad = dictionary.pad()
        self.config = transformers.LlamaConfig(
            vocab_size=vocab_size, max_position_embeddings=max_positions, pad_token_id=self.pad,
            bos_token_id=dictionary.bos(), eos_token_id=dictionary.eos(), attn_implementation=REFERENCE_ATTENTION,
            **sizes)

    def build(self, variant: Variant) -> Any:
        """The reference, or the same model switched to ``variant``'s method (the front-end's refusal, a
        ``posattn.UserError``, propagates). Seed torch first for the same weights."""
        model = transformers.LlamaForCausalLM(copy.deepcopy(self.config))  # the switch records the method in it
        if variant != VANILLA_LLAMA:
            posattn_huggingface.apply_position_method(model, **HUGGINGFACE_OPTIONS[variant.name])
        return model

    def loss(self, model: Any, batch: Dict[str, Any]) -> torch.Tensor:
        """Cross entropy of the next tokens (the language-model groups' step), mean over the target's tokens: the
        right-padded batch with its padding mask, without a cache (as in training)."""
        tokens, target = batch["net_input"]["src_tokens"], batch["target"]
        logits = model(input_ids=tokens, attention_mask=tokens.ne(self.pad).long(), use_cache=False).logits
        return F.cross_entropy(logits.float().view(-1, logits.size(-1)), target.view(-1), ignore_index=self.pad)

    def prompts(self, tokens: torch.Tensor, lengths: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """Right-padded sentences ``(batch, width)`` of ``lengths`` tokens as left-padded prompts (as ``generate``
        takes a batch), and their attention mask."""
        width = tokens.size(1)
        columns = torch.arange(width, device=tokens.device)
        prompts = tokens.gather(1, (columns - (width - lengths.to(tokens.device))[:, None]) % width)
        return prompts, prompts.ne(self.pad).long()

    def generate(self, model: Any, prompts: torch.Tensor, mask: torch.Tensor, new_tokens: int) -> None:
        """Greedy generation of exactly ``new_tokens`` tokens per prompt with the cache (EOS suppressed until
        then: the models are untrained)."""
        output = model.generate(input_ids=prompts, attention_mask=mask, do_sample=False, max_new_tokens=new_tokens,
                                min_new_tokens=new_tokens, pad_token_id=self.pad)
        if output.shape != (prompts.size(0), prompts.size(1) + new_tokens):
            raise RuntimeError(f"generate returned {tuple(output.shape)} for {tuple(prompts.shape)} prompts and "
                               f"{new_tokens} new tokens")

    def about(self, model: Any) -> Dict[str, Any]:
        """The transformers version, the reference's parameters and its configuration's sizes."""
        sizes = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads")
        return {"transformers": transformers.__version__, "params": sum(p.numel() for p in model.parameters()),
                "sizes": {name: getattr(model.config, name) for name in sizes}}
