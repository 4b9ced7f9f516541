"""The decoding cache of one self-attention layer, for plain PyTorch models.

The kernel's decoding state (:mod:`posattn.attention`: the keys and values so far, the rows a post-softmax
transform continues from, the token-difference terms' values; a content-logits term's keys carried to the last token
and its own state) is a dictionary of batch-first tensors; a
:class:`DecodingCache` holds it for one layer and one batch of sequences, with the padding mask of every token
so far, and reorders both for beam search. Its first use binds it to its layer: another layer, another batch
size or a bidirectional layer is refused (:meth:`DecodingCache.check_use`), since its state would be computed
with as if it were theirs.
"""

import weakref
from typing import Any, Dict, Optional

import torch
from torch import Tensor

from posattn.errors import ArgumentError, MisuseError, described


class DecodingCache:
    """One layer's decoding state for a batch of sequences (module docstring).

    Pass the same cache to the layer at every step; the first call may give a whole prompt (its queries see the
    prompt causally), each later one the new tokens. Positions continue from :attr:`length`. A model keeps one
    cache per layer (``[DecodingCache() for _ in layers]``) and sequence batch.
    """

    def __init__(self) -> None:
        #: the kernel's state, by name, each tensor batch first
        self.state: Dict[str, Tensor] = {}
        #: ``(batch, length)`` bool, True at pads, over every token so far (None before the first step)
        self.padding_mask: Optional[Tensor] = None
        #: no token so far is a pad (each call's context was known to hold none: no padding mask was given), so
        #: that the next call's context is known to hold none either (the kernel's masks it then needs none of)
        self.pad_free = True
        #: the layer (its method) of the first call, held weakly
        self._layer: Optional[weakref.ReferenceType] = None

    @property
    def length(self) -> int:
        """The number of tokens so far (the offset of the next step's positions)."""
        return 0 if self.padding_mask is None else self.padding_mask.size(1)

    @property
    def batch_size(self) -> Optional[int]:
        """The number of sequences the cache holds (None before the first step)."""
        return None if self.padding_mask is None else self.padding_mask.size(0)

    def check_use(self, layer: Any, causal: bool, batch: int) -> None:
        """Refuse this cache for a call of ``layer`` (a :class:`~posattn.attention.PositionKernel`) on ``batch``
        sequences where it does not belong: a bidirectional layer (a cache continues a causal sequence), a layer
        other than its first one's, another number of sequences than it holds. Binds it to ``layer`` on first
        use."""
        where = getattr(layer, "where", type(layer).__name__)
        if not causal:
            raise MisuseError(f"a DecodingCache was given to a bidirectional layer ({where}): decoding step by step "
                              "is for causal layers (causal=True); call a bidirectional layer on the whole sequence")
        bound = None if self._layer is None else self._layer()
        if self._layer is not None and bound is not layer:
            other = "one no longer alive" if bound is None else getattr(bound, "where", type(bound).__name__)
            raise MisuseError(f"this DecodingCache belongs to the layer module that first used it ({other}), not to "
                              f"this call's, another module ({where}): keep one cache per layer "
                              "([posattn.DecodingCache() for _ in layers]) and pass each to its own layer")
        if self.batch_size is not None and batch != self.batch_size:
            raise MisuseError(f"this DecodingCache holds {self.batch_size} sequences, the call gives {batch}: give "
                              "every step the same batch, or reorder the cache first (cache.reorder(order), as beam "
                              "search does)")
        self._layer = weakref.ref(layer)

    def reorder(self, order: Tensor) -> None:
        """Keep the sequences ``order`` ``(new batch,)`` selects, in that order (beam search's reordering)."""
        if not isinstance(order, Tensor) or order.dim() != 1 or order.dtype not in (torch.long, torch.int):
            raise ArgumentError(f"order must be a 1-D integer tensor of sequence indices, got "
                                f"{described(order)}")
        held = self.batch_size
        if held is not None and order.numel() and not bool(((order >= 0) & (order < held)).all()):
            raise ArgumentError(f"order selects sequences {order.tolist()}, but this DecodingCache holds {held} "
                                f"(indices 0 to {held - 1})")
        self.state = {name: value.index_select(0, order) for name, value in self.state.items()}
        if self.padding_mask is not None:
            self.padding_mask = self.padding_mask.index_select(0, order)
