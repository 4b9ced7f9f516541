"""The decoding cache of one self-attention layer, for plain PyTorch models.

The kernel's decoding state (:mod:`posattn.attention`: the keys and values so far, the rows a post-softmax
transform continues from, the token-difference terms' values) is a dictionary of batch-first tensors; a
:class:`DecodingCache` holds it for one layer and one batch of sequences, with the padding mask of every token
so far, and reorders both for beam search.
"""

from typing import Dict, Optional

from torch import Tensor


class DecodingCache:
    """One layer's decoding state for a batch of sequences (module docstring).

    Pass the same cache to the layer at every step; the first call may give a whole prompt (its queries see the
    prompt causally), each later one the new tokens. Positions continue from :attr:`length`.
    """

    def __init__(self) -> None:
        #: the kernel's state, by name, each tensor batch first
        self.state: Dict[str, Tensor] = {}
        #: ``(batch, length)`` bool, True at pads, over every token so far (None before the first step)
        self.padding_mask: Optional[Tensor] = None

    @property
    def length(self) -> int:
        """The number of tokens so far (the offset of the next step's positions)."""
        return 0 if self.padding_mask is None else self.padding_mask.size(1)

    def reorder(self, order: Tensor) -> None:
        """Keep the sequences ``order`` ``(new batch,)`` selects, in that order (beam search's reordering)."""
        self.state = {name: value.index_select(0, order) for name, value in self.state.items()}
        if self.padding_mask is not None:
            self.padding_mask = self.padding_mask.index_select(0, order)
