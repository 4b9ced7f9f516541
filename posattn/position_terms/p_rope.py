"""p-RoPE: rotary embedding without its lowest frequencies (Barbero et al. 2025, "Round and Round We Go! What makes
Rotary Positional Encodings useful?", ICLR), a baseline.

RoPE (:mod:`rotary`) turns the pair ``(2k, 2k + 1)`` of a head's query and key by ``p theta_k``, ``theta_k =
10000^(-2k/d_h)``, ``k = 0 .. d_h/2 - 1``: the larger k, the lower the frequency. The paper finds that the lowest
frequencies carry semantic, not positional, information and that over long contexts their slow rotation is what
drifts; p-RoPE keeps the fraction p of the frequencies that are highest and sets the others to 0, so that those
pairs are not turned at all (position-independent channels):

    theta'_k = theta_k  for k < floor(p d_h / 2),    theta'_k = 0  otherwise

(the authors' Gemma code, ``apply_rope(..., rope_proportion=p)``: ``rope_angles = int(p * head_dim // 2)``, the
remaining timescales infinite; transformers' ``rope_type="proportional"`` of Gemma 4 computes the same
frequencies). The frequencies kept are RoPE's own (not re-derived over fewer dimensions); p = 1 is RoPE; the
registered variant is p = 0.75 (the paper trains p = 0.25 and 0.75); a head so small that ``floor(p d_h / 2) = 0``
turns nothing (the authors' rounding: NoPE, as p = 0 would be). This is not transformers' ``partial_rotary_factor``
(GPT-NeoX, Phi), which turns the first ``factor * d_h`` dimensions with frequencies re-derived over those
dimensions, ``10000^(-2k/(factor d_h))``, down to the same lowest frequency ~1/10000 as full RoPE: it keeps the
slow pairs and drops none.

As RoPE: token positions (left padding changes nothing), neighbouring dimensions as pairs, angles and rotation in
fp32 (fp64 for a double model), each key turned once, at its own step, before the incremental cache. No parameters.
:class:`TruncatedRotaryEmbedding` is the rotation of the first ``kept`` pairs; p-RoPE's term
(:class:`PRotaryEmbedding`) and HoPE's (:mod:`hope`) are it with their own counts.
"""

import dataclasses
from dataclasses import dataclass
from typing import Any, List, Optional

import torch
from torch import Tensor, nn

from posattn.position_terms.quantities import Quantity
from posattn.position_terms.registry import (
    LayerSpec,
    MethodOption,
    PositionMethod,
    PositionOptionError,
    register,
)
from posattn.position_terms.rotary import RotaryEmbedding, RotaryScaling, rotary_frequencies

#: the fraction of the registered variant (the paper's experiments use p = 0.25 and 0.75)
VARIANT_FRACTION = 0.75


def kept_pairs(fraction: float, head_dim: int) -> int:
    """The number of pairs p-RoPE turns, the highest frequencies: ``floor(p d_h / 2)``, computed as the authors' code
    (Gemma's ``apply_rope``) and transformers' ``proportional`` RoPE compute it, ``int(p * d_h // 2)``."""
    return int(fraction * head_dim // 2)


def truncated_frequencies(head_dim: int, kept: int, dtype: torch.dtype,
                          device: Optional[torch.device] = None) -> Tensor:
    """RoPE's ``theta_k`` of the first ``kept`` pairs and 0 for the other ``d_h/2 - kept``."""
    frequencies = rotary_frequencies(head_dim, dtype, device)
    pairs = torch.arange(frequencies.numel(), device=device)
    return torch.where(pairs < kept, frequencies, torch.zeros_like(frequencies))


@dataclass(frozen=True)
class TruncatedFrequencies(RotaryScaling):
    """RoPE's frequencies with all but the first ``kept`` pairs' set to 0 (:func:`truncated_frequencies`): a pair
    beyond ``kept`` has ``cos = 1``, ``sin = 0`` in RoPE's own tables (turned by nothing)."""

    kept: int = 0

    def frequencies(self, head_dim: int, dtype: torch.dtype, device: Optional[torch.device] = None,
                    length: Optional[Tensor] = None) -> Tensor:
        return truncated_frequencies(head_dim, self.kept, dtype, device)


class TruncatedRotaryEmbedding(RotaryEmbedding):
    """RoPE of the first ``kept`` pairs of dimensions on queries and keys of shape ``(batch, heads, tgt_len,
    head_dim)``; the other pairs pass unturned (RoPE's tables and cache, of :class:`TruncatedFrequencies`)."""

    def __init__(self, head_dim: int, kept: int):
        super().__init__(head_dim, TruncatedFrequencies(kept=kept))
        self.kept = kept

    def extra_repr(self) -> str:
        return f"head_dim={self.head_dim}, kept={self.kept}"

    def inspect(self, positions: int) -> List[Quantity]:
        """RoPE's angle pattern (``mean cos((i - j) theta'_k)``, 1 for an unturned pair), its description naming the
        pairs turned."""
        pattern, = super().inspect(positions)
        title = (f"rotation's effect on q_i . k_j of equal contents ({self.kept} of {self.head_dim // 2} pairs "
                 "turned; every head)")
        return [dataclasses.replace(pattern, title=title)]


class PRotaryEmbedding(TruncatedRotaryEmbedding):
    """p-RoPE on queries and keys of shape ``(batch, heads, tgt_len, head_dim)``: RoPE of the ``floor(p d_h / 2)``
    pairs of the highest frequencies (:func:`kept_pairs`), the others unturned."""

    def __init__(self, head_dim: int, fraction: float):
        super().__init__(head_dim, kept_pairs(fraction, head_dim))
        self.fraction = fraction

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, p={self.fraction}"


def check_even(options: Any, option: str, layer: LayerSpec) -> None:
    """A rotation turns pairs of dimensions: refuse an odd head size, naming ``option``."""
    if layer.head_dim % 2:
        raise PositionOptionError(
            f"{options.flag(option)} turns pairs of dimensions: the head size {layer.head_dim} (embedding "
            "dimension / attention heads) must be even")


class PRopeMethod(PositionMethod):
    name = "p-rope"
    citation = "Barbero et al. 2025"
    options = (
        MethodOption("p_rope", 0.0,
                     "p-RoPE (Barbero et al. 2025) of queries and keys in every layer of the {what}: RoPE that "
                     "turns only the fraction p in (0, 1] of its pairs with the highest frequencies, floor(p d_h/2) "
                     "pairs at RoPE's own theta_k = 10000^(-2k/d_h); the other pairs are not turned (not "
                     "transformers' partial_rotary_factor); the registered variant: 0.75; 0 = off"),
    )
    benchmark_target = "additive"
    variants = {"p-rope": {"p_rope": VARIANT_FRACTION}}
    labels = {"p-rope": "p-RoPE"}

    def is_on(self, options: Any) -> bool:
        return options.p_rope != 0

    def validate(self, options: Any) -> None:
        if not 0 <= options.p_rope <= 1:
            raise PositionOptionError(
                f"{options.flag('p_rope')} is the fraction p in (0, 1] of RoPE's frequencies kept (0 = off), got "
                f"{options.p_rope}")

    def terms(self, options: Any, layer: LayerSpec) -> List[nn.Module]:
        check_even(options, "p_rope", layer)
        return [PRotaryEmbedding(layer.head_dim, options.p_rope)]


register(PRopeMethod())
