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

from dataclasses import dataclass
from typing import Any, List, Optional, Tuple

import torch
from torch import Tensor, nn

from posattn.position_context import PositionContext, Preparation
from posattn.position_terms.base import QueryKeyTransform, at_least_fp32
from posattn.position_terms.quantities import CURVE, Quantity
from posattn.position_terms.registry import (
    LayerSpec,
    MethodOption,
    PositionMethod,
    PositionOptionError,
    register,
)
from posattn.position_terms.rotary import rotary_frequencies, rotate_pairs, rotation_tables

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
class TruncatedRotationTables(Preparation):
    """:func:`~posattn.position_terms.rotary.rotation_tables` of the current tokens' positions times
    :func:`truncated_frequencies`, ``(2, batch or 1, 1, tgt_len, head_dim)`` in ``dtype`` (fp32 at least): a pair
    beyond ``kept`` has ``cos = 1``, ``sin = 0`` (turned by nothing)."""

    head_dim: int
    kept: int
    tgt_len: int
    dtype: torch.dtype

    def build(self, ctx: PositionContext) -> Tensor:
        positions, _ = ctx.query_key_positions(self.tgt_len, ctx.length)  # the current tokens'
        frequencies = truncated_frequencies(self.head_dim, self.kept, self.dtype, positions.device)
        return torch.stack(rotation_tables(positions.to(self.dtype)[:, None, :, None] * frequencies))


class TruncatedRotaryEmbedding(QueryKeyTransform):
    """RoPE of the first ``kept`` pairs of dimensions on queries and keys of shape ``(batch, heads, tgt_len,
    head_dim)``; the other pairs pass unturned."""

    def __init__(self, head_dim: int, kept: int):
        super().__init__()
        self.head_dim, self.kept = head_dim, kept

    def extra_repr(self) -> str:
        return f"head_dim={self.head_dim}, kept={self.kept}"

    def forward(self, q: Tensor, k: Tensor, ctx: PositionContext) -> Tuple[Tensor, Tensor]:
        tgt_len, dtype, length = q.size(2), at_least_fp32(q.dtype), ctx.length
        table = ctx.sequence_table(  # incremental decoding: the sequence's angles, sliced per step
            (TruncatedRotationTables, self.head_dim, self.kept, dtype), length,
            lambda n: TruncatedRotationTables(self.head_dim, self.kept, n, dtype).build(
                PositionContext.unpadded(n, q.device)), length_dim=-2)
        if table is None:
            table = ctx.prepared(TruncatedRotationTables(self.head_dim, self.kept, tgt_len, dtype))
        else:
            table = table[..., length - tgt_len : length, :]
        cos, signed_sin = table
        return rotate_pairs(q, cos, signed_sin), rotate_pairs(k, cos, signed_sin)

    def inspect(self, positions: int) -> List[Quantity]:
        """Nothing is learned; shown is what the rotation alone does to a logit: ``q_i . k_j`` of a query and a key
        equal to the same vector of ones, over ``|q| |k|``, i.e. the mean over the pairs k of ``cos((i - j)
        theta'_k)`` (1 for an unturned pair), for the first ``positions`` positions (every head alike)."""
        distance = torch.arange(-(positions - 1), positions, dtype=torch.float64)
        frequencies = truncated_frequencies(self.head_dim, self.kept, torch.float64)
        pattern = torch.cos(distance[:, None] * frequencies).mean(dim=1)
        return [Quantity("angle-pattern", pattern[None].float(), CURVE,
                         f"rotation's effect on q_i . k_j of equal contents ({self.kept} of "
                         f"{self.head_dim // 2} pairs turned; every head)",
                         axes=("i - j (query position minus key position)", "mean cos((i - j) theta'_k)"),
                         ticks=(distance.long().tolist(),))]


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
