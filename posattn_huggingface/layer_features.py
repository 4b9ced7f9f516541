"""What some families' attention layers bring beside q, k and v, composed with the layer's method: a sliding window
(Mistral, Qwen2 / Qwen3, Gemma 2 / 3, Phi-3: causal; ModernBERT's local layers: bidirectional) and Gemma's logit
soft-capping (``attn_logit_softcapping``).

**Sliding windows.** transformers makes a windowed layer's mask with its causal or bidirectional mask function under
a window overlay (``masking_utils.sliding_window_causal_mask_function``, ``sliding_window_bidirectional_mask_function``)
and hands the layer's attention function its window (the keyword ``sliding_window``). The mask function takes the
overlay for the plain mask (:func:`unwindowed`: one context per forward pass serves every layer); the attention
function gives a windowed layer the context :class:`WindowedPositions` (:func:`windowed`), in which a key further than
the window from the query is blocked as a pad is, and runs the kernel's explicit path, whose masks all come from that
context (the logits' key mask and the entries a post-softmax transform re-masks): query ``i`` sees key ``j`` where
``|i - j| < sliding_window`` (transformers' overlays: causal ``kv_idx > q_idx - sliding_window``; ModernBERT's layers
pass ``config.sliding_window + 1`` for its ``|q_idx - kv_idx| <= config.sliding_window``), on the tokens' indices,
as transformers counts them. The method's terms read the positions as without the window. A cache keeps every key
(:func:`full_cache_layer`: the window is the mask's, not the cache's).

**Soft-capping.** Gemma 2's eager attention (transformers' ``gemma2.modeling_gemma2.eager_attention_forward``, the
same in Gemma 3) caps the scaled content logits, ``softcap * tanh(q k^T * scaling / softcap)``, and adds the mask
after. :class:`SoftCap` is that cap as a logit scaling (the kernel's step 3: an elementwise transform of the content
logits, before the method's biases and the masks), added to the method of every layer whose module has an
``attn_logit_softcapping`` (:func:`cap_logits`); a method with its own logit scaling is refused in one line.
"""

import dataclasses
from dataclasses import dataclass
from typing import Any, Callable, ClassVar, List, Optional

import torch
from torch import Tensor, nn
from transformers.cache_utils import Cache, DynamicLayer, DynamicSlidingWindowLayer, StaticSlidingWindowLayer

from posattn.attention import PositionKernel, PositionTerms
from posattn.position_context import BlockedEntries, PositionContext, Preparation
from posattn.position_terms.base import LogitScaling, ScoreMod, at_least_fp32
from posattn.position_terms.quantities import Quantity
from posattn_huggingface.names import HuggingFaceRefusal

#: transformers' window overlays (``masking_utils``), by qualified name: the mask functions they join with ``and_masks``
WINDOW_OVERLAYS = ("sliding_window_overlay.<locals>.inner_mask",
                   "sliding_window_bidirectional_overlay.<locals>.inner_mask")
AND_MASKS = "and_masks.<locals>.and_mask"


def unwindowed(mask_function: Optional[Callable[..., Any]]) -> Optional[Callable[..., Any]]:
    """The causal or bidirectional mask function under a window overlay (``and_masks(overlay, base)``, as
    transformers' windowed masks are made): ``base``; the layers' attention function takes the window from the
    layer (module docstring). Any other mask function as it is."""
    if getattr(mask_function, "__qualname__", None) != AND_MASKS or not mask_function.__closure__:
        return mask_function
    parts = mask_function.__closure__[0].cell_contents
    rest = [part for part in parts if getattr(part, "__qualname__", None) not in WINDOW_OVERLAYS]
    return rest[0] if len(rest) == 1 and len(parts) == 2 else mask_function


@dataclass(frozen=True)
class WindowMaskPositions(PositionContext):
    """The batch's context as the mask function returns it for a windowed layer's mask: the plain context (every
    layer applies its own window), which transformers takes for a mask it prepared (``ndim`` 4) where ``generate``
    made it before the forward pass (a static cache, refused by the layers: :func:`full_cache_layer`)."""

    ndim: ClassVar[int] = 4


def _fields(ctx: PositionContext) -> dict:
    return {f.name: getattr(ctx, f.name) for f in dataclasses.fields(PositionContext) if f.init and f.name != "memo"}


def window_mask(ctx: PositionContext) -> WindowMaskPositions:
    """``ctx`` as the mask function returns it for a windowed layer's mask."""
    return WindowMaskPositions(**_fields(ctx))


@dataclass(frozen=True)
class WindowedPositions(PositionContext):
    """A batch's context for a layer with a sliding window of ``window`` tokens: a key at ``|i - j| >= window``
    from the query is blocked as a pad is, in the explicit path's key mask (:meth:`key_padding_4d`) and in the
    entries a post-softmax transform re-masks (:class:`~posattn.position_context.BlockedEntries`). A query row that
    would see no key at all (a pad whose window holds pads only) sees its own, as transformers' masks let a leading
    pad see the pads (no row of -inf alone, which gives NaN)."""

    window: int = 0

    def outside(self, tgt_len: int) -> Tensor:
        """``(tgt_len, length)`` bool, True where a key lies outside the window of one of the last ``tgt_len``
        queries."""
        return self.relative_distances(tgt_len, self.length).abs() >= self.window

    def key_padding_4d(self, tgt_len: int) -> Tensor:
        blocked = super().key_padding_4d(tgt_len) | self.outside(tgt_len)
        alone = blocked.all(dim=-1, keepdim=True) & (self.relative_distances(tgt_len, self.length) == 0)
        return blocked & ~alone

    def prepared(self, preparation: Preparation) -> Any:
        built = super().prepared(preparation)
        if isinstance(preparation, BlockedEntries):
            return built | self.outside(preparation.tgt_len)[:, :preparation.src_len]
        return built


@dataclass(frozen=True)
class Windowed(Preparation):
    """The batch's :class:`WindowedPositions` for a window of ``window`` tokens, made once per forward pass for the
    layers of that window."""

    window: int

    def build(self, ctx: PositionContext) -> WindowedPositions:
        return WindowedPositions(**_fields(ctx), window=self.window)


def windowed(ctx: PositionContext, window: int, where: str) -> WindowedPositions:
    """The context of a layer with a sliding window of ``window`` tokens (a dynamic cache's or no cache's: a static
    cache's buffers are refused)."""
    if hasattr(ctx, "static_length"):  # a static cache's BatchPositions
        raise HuggingFaceRefusal(STATIC_REFUSAL.format(where=where))
    return ctx.prepared(Windowed(int(window)))


#: the refusal of a static cache's buffers for a sliding-window layer
STATIC_REFUSAL = ("{where}: a sliding-window layer with a static cache (cache_implementation='static'), whose buffers "
                  "hold the window's tokens only: generate with the dynamic cache (the default)")


def full_cache_layer(cache: Cache, layer_idx: int) -> None:
    """Make the cache's layer ``layer_idx`` keep every key where it is an empty ``DynamicSlidingWindowLayer`` (the
    window is the mask's); refuse one filled without every key, and a static cache's sliding-window layer."""
    layers: List[Any] = getattr(cache, "layers", [])
    if layer_idx < len(layers) and isinstance(layers[layer_idx], StaticSlidingWindowLayer):
        raise HuggingFaceRefusal(STATIC_REFUSAL.format(where=f"layer {layer_idx}"))
    if layer_idx >= len(layers) or not isinstance(layers[layer_idx], DynamicSlidingWindowLayer):
        return
    if layers[layer_idx].get_seq_length():
        raise HuggingFaceRefusal(f"the cache's layer {layer_idx} is a sliding window's, filled with "
                                 f"{layers[layer_idx].get_seq_length()} tokens by a model without the position "
                                 "method: decode with a DynamicCache (the default) that the switched model filled")
    layers[layer_idx] = DynamicLayer()


class SoftCap(LogitScaling):
    """Gemma's logit soft-capping: ``cap * tanh(logits / cap)`` of the content logits (module docstring)."""

    def __init__(self, cap: float):
        super().__init__()
        self.cap = float(cap)

    def forward(self, logits: Tensor, ctx: PositionContext) -> Tensor:
        return self.cap * torch.tanh(logits.to(at_least_fp32(logits.dtype)) / self.cap)

    def score_mod(self, ctx: PositionContext, q: Tensor, src_len: int) -> ScoreMod:
        cap = self.cap

        def capped(score: Tensor, b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
            return cap * torch.tanh(score / cap)
        return capped

    def inspect(self, positions: int) -> List[Quantity]:
        return []

    def extra_repr(self) -> str:
        return f"cap={self.cap}"


def cap_logits(module: nn.Module, method: PositionKernel) -> None:
    """Give ``method`` the module's logit soft-capping (``attn_logit_softcapping``, None: none) as its logit
    scaling; refuse a method that rescales the logits itself."""
    cap = getattr(module, "attn_logit_softcapping", None)
    if cap is None:
        return
    if method.scaling_term is not None:
        raise HuggingFaceRefusal(f"{type(module).__name__} soft-caps its logits (attn_logit_softcapping={cap}), and "
                                 f"the method rescales them too ({type(method.scaling_term).__name__}): build the "
                                 "model with attn_logit_softcapping=None for it, or take a method without a logit "
                                 "scaling")
    terms = PositionTerms(kernel=method.kernel, self_check=method.self_check, where=method.where,
                          causal=method.causal, max_positions=method.max_positions)
    for term in [*method.all_terms(), SoftCap(cap)]:  # every term, by its kind, and the cap
        terms.add(term)
    method.hold_terms(terms)


def check_soft_cap(method: PositionKernel, softcap: Optional[float]) -> None:
    """Refuse a call whose module soft-caps its logits otherwise than its method (its configuration changed after the
    switch)."""
    held = method.scaling_term.cap if isinstance(method.scaling_term, SoftCap) else None
    if held != (None if softcap is None else float(softcap)):
        raise HuggingFaceRefusal(f"{method.where}: the module soft-caps its logits at {softcap}, its method at {held}: "
                                 "set attn_logit_softcapping before apply_position_method")
