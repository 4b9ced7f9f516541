"""The mask function registered with ``AttentionMaskInterface``: transformers' 2D padding mask made the batch's
:class:`~posattn.position_context.PositionContext`, once per forward pass, which every layer receives as its
``attention_mask``.

With a static cache (``generate(cache_implementation="static")``, :mod:`posattn_huggingface.static_cache`),
``generate`` makes the mask before it calls the (compiled) forward, so the context is made there, eagerly, and
transformers passes it through to the layers. The cache's buffers hold ``max_cache_len`` tokens, their end not
filled yet; the context is a :class:`BatchPositions`:

- **the prompt** (several queries): the context of its tokens and the cached ones before it (the attention
  function takes the buffers' filled part), as with the dynamic cache;
- **a decoding step** (one query, the compiled call): a context over the whole buffers, of the same shapes at every
  step (nothing in it changes from step to step but tensors' values, so the step compiles once): the unfilled end
  is padding; the context's last column, which the kernel reads for the query (a context's queries are its last
  tokens), holds the current token's position (the count of tokens puts it there, the end being padding), and its
  distances to the keys are the current index minus theirs (``step_index``).
"""

from dataclasses import dataclass, fields
from typing import Any, Callable, ClassVar, Optional

import torch
import torch.nn.functional as F
from torch import Tensor
from transformers.masking_utils import bidirectional_mask_function, causal_mask_function

from posattn.functional import batch_context
from posattn.position_context import PositionContext
from posattn_huggingface.layer_features import WindowMaskPositions, unwindowed, window_mask
from posattn_huggingface.names import HuggingFaceRefusal


@dataclass(frozen=True)
class BatchPositions(PositionContext):
    """The batch's context over a static cache's buffers (module docstring).

    Attributes:
        ndim: 4, so that transformers takes it for a mask it prepared where ``generate`` made it before the forward
            pass (GPT-2's and the masking functions' test), and hands it to the mask function, which returns it.
        static_length: the length of the buffers, which the attention function receives (the context covers their
            first ``length`` tokens).
        step_index: in a decoding step, ``(1,)`` long, the current token's index in the buffers (the context then
            covers the whole buffers); None for the prompt.
    """

    ndim: ClassVar[int] = 4
    static_length: int = 0
    step_index: Optional[Tensor] = None

    def contiguous(self) -> "BatchPositions":
        """Itself: transformers before 5.24 makes the mask that ``generate`` prepares for a static cache contiguous
        (the range it takes: posattn_huggingface/compatibility.py)."""
        return self


def batch_positions(batch_size: int, q_length: int, kv_length: int, q_offset: Any = 0, kv_offset: int = 0,
                    mask_function: Optional[Callable[..., Any]] = None, attention_mask: Any = None,
                    device: Optional[torch.device] = None, **_: Any) -> PositionContext:
    """The mask function: the batch's context, built once per forward pass for every layer (a
    :class:`BatchPositions` over a static cache's buffers).

    Args:
        batch_size, q_length, kv_length: the batch, its current tokens and every key (the cached ones too; a static
            cache: its length).
        q_offset, kv_offset: where the queries and keys start (the cache's past length, a tensor once a static
            cache is filled; 0).
        mask_function: transformers' causal or bidirectional mask, or either under its sliding-window overlay (the
            layer applies its window: :mod:`~posattn_huggingface.layer_features`); any other one, a packed-sequence
            mask, is refused.
        attention_mask: ``(batch, tokens so far)``, 1 at tokens (transformers' padding mask), or None; or the
            context this function made before the forward pass, returned.
    """
    if isinstance(attention_mask, (BatchPositions, WindowMaskPositions)):
        return attention_mask
    causal = _causality(unwindowed(mask_function))
    if kv_offset != 0:
        raise HuggingFaceRefusal("posattn_huggingface takes a DynamicCache (the default), a StaticCache or no cache: "
                                 "the keys must start at the first token")
    if q_length == 1 and (not isinstance(q_offset, int) or q_offset + 1 < kv_length):  # a static cache's step
        return _static_step(batch_size, kv_length, q_offset, attention_mask, causal, device)
    length = int(q_offset) + q_length  # the keys of the queries: the past and theirs (a static cache: fewer)
    if attention_mask is None:
        ctx = batch_context(None, causal, length, device)
    else:
        _check_width(attention_mask, batch_size, length, kv_length)
        ctx = batch_context(attention_mask[:, :length] == 0, causal)
    if kv_length == length:  # every key: no cache, or a dynamic one
        return ctx if unwindowed(mask_function) is mask_function else window_mask(ctx)
    made = {f.name: getattr(ctx, f.name) for f in fields(ctx) if f.init and f.name != "memo"}
    return BatchPositions(**made, static_length=kv_length)  # a prompt in a static cache's buffers


def _static_step(batch_size: int, kv_length: int, q_offset: Any, attention_mask: Optional[Tensor], causal: bool,
                 device: Optional[torch.device]) -> BatchPositions:
    """A decoding step's context over a static cache's buffers of ``kv_length`` tokens (module docstring)."""
    if not causal:
        raise HuggingFaceRefusal("posattn_huggingface takes a cache on causal models only (Llama, GPT-2)")
    index = torch.arange(kv_length, device=device)
    step_index = torch.as_tensor(q_offset, device=device).reshape(1).clone()  # the cache's counter moves on
    padding = index > step_index  # the buffers' unfilled end
    if attention_mask is not None:
        _check_width(attention_mask, batch_size, 1, kv_length)
        padding = padding | F.pad(attention_mask == 0, (0, kv_length - attention_mask.size(1)))
    padding = padding.expand(batch_size, kv_length)
    row = torch.where(index == kv_length - 1, 0, step_index - index)  # the query's distances to the keys
    positions = ((~padding).long().cumsum(dim=1) - 1).clamp(min=0)  # as PositionContext.from_padding counts them
    return BatchPositions(padding_mask=padding, distances=row.expand(kv_length, kv_length), positions=positions,
                          left_pads=padding.long().cumprod(dim=1).sum(dim=1), causal=True, static_length=kv_length,
                          step_index=step_index)


def _check_width(attention_mask: Tensor, batch_size: int, least: int, most: int) -> None:
    """Refuse an ``attention_mask`` that is not ``(batch_size, tokens so far)``: from ``least`` to ``most`` tokens."""
    if attention_mask.dim() != 2 or attention_mask.size(0) != batch_size or not (
            least <= attention_mask.size(1) <= most):
        tokens = f"{most}" if least == most else f"{least} to {most}"
        raise HuggingFaceRefusal(f"an attention_mask of shape {tuple(attention_mask.shape)} for {batch_size} "
                                 f"sequences of {tokens} tokens: give the 2D padding mask (1 at tokens)")


def _causality(mask_function: Optional[Callable[..., Any]]) -> bool:
    if mask_function is causal_mask_function:
        return True
    if mask_function is bidirectional_mask_function:
        return False
    raise HuggingFaceRefusal("posattn_huggingface takes transformers' plain causal or bidirectional masks, not "
                             f"{getattr(mask_function, '__name__', mask_function)} (packed sequences: give an "
                             "attention_mask, one sequence per row)")
