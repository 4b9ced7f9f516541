"""The layer's decoding state kept in transformers' dynamic cache, for a method whose decoding keeps more than the
keys and values (a :class:`DecodingStateLayer` in place of the cache's ``DynamicLayer``), and the kernel's call
with it.

A ``DynamicLayer`` joins each step's keys and values to the cached ones and hands the attention function every
key; a method with decoding state takes the cached tokens' keys and values as its kernel's state, which the
kernel joins to the current ones itself (:mod:`posattn.attention`). A :class:`DecodingStateLayer` leaves the
joining to the kernel, once per step: its ``update`` returns the current tokens' keys and values alone, and the
kernel's joined keys and values become the layer's.
"""

from typing import Dict, List, Optional, Tuple

import torch
from torch import Tensor
from transformers.cache_utils import Cache, DynamicLayer

from posattn.attention import PositionKernel, logit_rows_key, token_values_key
from posattn.position_terms.base import CONTENT_STATE_PREFIX
from posattn.position_context import PositionContext
from posattn_huggingface.names import HuggingFaceRefusal


def reads_layer_input(method: PositionKernel) -> bool:
    """Whether the layer's method reads the attention module's input (a token-difference term: FoX's gates; a
    content-logits term: PaTH's transforms)."""
    return method.reads_layer_input()


def keeps_decoding_state(method: PositionKernel) -> bool:
    """Whether decoding with the method keeps more than the keys and values: the rows a post-softmax transform
    continues from, the token-difference terms' values, the keys a query/key transform transformed (the model's
    are untransformed)."""
    return (method.post_softmax_term is not None or reads_layer_input(method) or len(method.query_key_terms) > 0
            or any(term.keeps_rows for term in method.logit_matrix_terms))


class DecodingStateLayer(DynamicLayer):
    """A :class:`~transformers.cache_utils.DynamicLayer` that holds the kernel's decoding state (module docstring):
    ``keys`` and ``values`` as the kernel joined them (the heads repeated where the model groups its key/value
    heads, a query/key transform's keys transformed), and ``state``, the rest (a post-softmax transform's rows,
    the token-difference terms' values; batch first); reordered, repeated, selected and cut together (beam search,
    contrastive search, assisted decoding)."""

    def __init__(self) -> None:
        super().__init__()
        self.state: Dict[str, Tensor] = {}

    def update(self, key_states: Tensor, value_states: Tensor, *args: object,
               **kwargs: object) -> Tuple[Tensor, Tensor]:
        """The current tokens' keys and values, as they come: the kernel joins them to the cached ones
        (:meth:`kernel_state`, :meth:`keep`)."""
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        return key_states, value_states

    def kernel_state(self, method: PositionKernel) -> Dict[str, Tensor]:
        """The kernel's decoding state of the cached tokens, for ``method`` (refused where it lacks some of it)."""
        state = dict(self.state)
        if self.get_seq_length():
            state["prev_key"], state["prev_value"] = self.keys, self.values
            missing = [name for name in kept_names(method) if name not in state]
            if missing:
                raise HuggingFaceRefusal(f"{method.where}: the cache lacks the decoding state {', '.join(missing)} "
                                         f"of its {self.get_seq_length()} tokens (filled with another method)")
        return state

    def keep(self, state: Dict[str, Tensor]) -> None:
        """The kernel's state after a call (the current tokens joined): the layer's keys, values and state."""
        self.keys, self.values = state.pop("prev_key"), state.pop("prev_value")
        self.state = state

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        super().reorder_cache(beam_idx)
        self.state = {name: t.index_select(0, beam_idx.to(t.device)) for name, t in self.state.items()}

    def batch_repeat_interleave(self, repeats: int) -> None:
        super().batch_repeat_interleave(repeats)
        self.state = {name: t.repeat_interleave(repeats, dim=0) for name, t in self.state.items()}

    def batch_select_indices(self, indices: Tensor) -> None:
        super().batch_select_indices(indices)
        self.state = {name: t[indices, ...] for name, t in self.state.items()}

    def crop(self, tokens_to_remove: int) -> None:
        """Cut the last ``-tokens_to_remove`` tokens (assisted decoding): the token-difference terms' values are
        cut with the keys; a convolution's rows and a content-logits term's carried keys cannot be (refused)."""
        if tokens_to_remove and any(name.startswith(CONTENT_STATE_PREFIX) for name in self.state):
            raise HuggingFaceRefusal("a content-logits term's decoding state (PaTH's keys, carried through every later "
                                     "token's transform) cannot be cut back to fewer tokens: no assisted, speculative "
                                     "or prompt-lookup decoding with it (generate without assistant_model and "
                                     "prompt_lookup_num_tokens)")
        if tokens_to_remove and ("prev_attn_rows" in self.state or any(name.startswith(logit_rows_key(""))
                                                                       for name in self.state)):
            raise HuggingFaceRefusal("a convolution's decoding state (its last attention rows) cannot be cut back to "
                                     "fewer tokens: no assisted, speculative or prompt-lookup decoding with it "
                                     "(generate without assistant_model and prompt_lookup_num_tokens)")
        super().crop(tokens_to_remove)
        if tokens_to_remove:
            self.state = {name: t[..., :tokens_to_remove] for name, t in self.state.items()}

    def reset(self) -> None:
        super().reset()
        self.state = {}


def decoding_state_layer(cache: Cache, layer_idx: int) -> DecodingStateLayer:
    """The cache's layer ``layer_idx`` as a :class:`DecodingStateLayer`: an empty ``DynamicLayer`` (the one
    ``DynamicCache`` made, or none yet) is replaced by one; a layer of another kind, or one filled without the
    method's state, is refused."""
    layers = getattr(cache, "layers", None)
    if layers is None or len(layers) < layer_idx:
        raise HuggingFaceRefusal(f"a {type(cache).__name__} without its layers: posattn_huggingface decodes with "
                                 "a DynamicCache (the default)")
    if len(layers) == layer_idx:
        layers.append(DecodingStateLayer())
    layer = layers[layer_idx]
    if isinstance(layer, DecodingStateLayer):
        return layer
    if type(layer) is not DynamicLayer or layer.get_seq_length():
        raise HuggingFaceRefusal(f"the cache's layer {layer_idx} ({type(layer).__name__}, "
                                 f"{layer.get_seq_length()} tokens) cannot hold the position method's decoding "
                                 "state: decode with a DynamicCache (the default) that the model filled")
    layers[layer_idx] = DecodingStateLayer()
    return layers[layer_idx]


def kept_names(method: PositionKernel) -> List[str]:
    """The names of the kernel's decoding state that a cache keeps for ``method`` beside the keys and values."""
    names = ["prev_attn_rows"] if method.post_softmax_term is not None else []
    names += [method.content_term.cache_key] if method.content_term is not None else []
    names += [logit_rows_key(i) for i, term in enumerate(method.logit_matrix_terms) if term.keeps_rows]
    return names + [token_values_key(i) for i in range(len(method.token_difference_terms))]


def attend_with_cache(method: PositionKernel, q: Tensor, key: Tensor, value: Tensor, ctx: PositionContext,
                      layer: Optional[DecodingStateLayer], x: Optional[Tensor], need_weights: bool,
                      kernel: Optional[str] = None) -> Tuple[Tensor, Optional[Tensor]]:
    """The kernel on the current tokens' ``q`` (scaled, ``(batch, heads, length, head_dim)``). Without a layer
    that keeps the decoding state, ``key`` and ``value`` are every key's, the cached ones first, as the cache
    joined them; with one, the current tokens', which the kernel joins to the layer's. ``kernel``: the call's
    kernel choice (None: the layer's)."""
    if layer is None:
        past = key.size(2) - q.size(2)
        out, _, weights = method.attend(q, key, value, ctx, None, {} if past else None, x, need_weights=need_weights,
                                        kernel=kernel)
        return out, weights
    state = layer.kernel_state(method)
    out, _, weights = method.attend(q, key, value, ctx, None, state, x, need_weights=need_weights, kernel=kernel)
    layer.keep(state)
    return out, weights
