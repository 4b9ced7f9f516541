"""Direct position interactions (Dufter et al. 2020, section 2.3; see docs/methods.md).

The paper gives no initialisation; the authors' released code draws ``P`` and ``R`` with Keras'
``glorot_normal`` (our default, ``glorot``); ``zero`` starts from plain attention instead.
"""

import math
from dataclasses import dataclass
from typing import Any, List

import torch
from torch import Tensor, nn

from posattn.position_context import PositionContext, Preparation
from posattn.position_terms.base import (
    AdditiveLogitBias,
    ScoreMod,
    captured,
    check_length,
    check_loaded_positions,
    glorot_,
    lookup,
)
from posattn.position_terms.quantities import CURVE, MATRIX, Quantity
from posattn.position_terms.registry import (
    LayerSpec,
    MethodOption,
    PositionMethod,
    PositionOptionError,
    register,
)


@dataclass(frozen=True)
class AbsoluteCells(Preparation):
    """``(batch, tgt_len, src_len)``: the flat index of (query position, key position) in a t x t matrix."""

    max_positions: int
    tgt_len: int
    src_len: int

    def build(self, ctx: PositionContext) -> Tensor:
        query_pos, key_pos = ctx.query_key_positions(self.tgt_len, self.src_len)
        return query_pos[:, :, None] * self.max_positions + key_pos[:, None, :]


class DirectAbsolutePositionBias(AdditiveLogitBias):
    """Absolute interactions ``A + A^p[:T, :T]`` with a learnable ``A^p`` of shape t x t per head.

    ``A^p[i, j]`` is indexed by the *token* positions of query i and key j, so a left-padded
    sentence sees the same entries as when it is alone. ``init``: ``glorot`` draws each head's t x t
    matrix as the authors' Keras ``glorot_normal`` (fans t and t), ``zero`` starts from plain attention.
    """

    def __init__(self, num_heads: int, max_positions: int, init: str = "glorot"):
        super().__init__()
        self.max_positions = max_positions
        self.weight = nn.Parameter(torch.zeros(num_heads, max_positions, max_positions))
        if init == "glorot":
            glorot_(self.weight, max_positions, max_positions, "normal")

    def forward(self, ctx: PositionContext, tgt_len: int, src_len: int) -> Tensor:
        check_length(src_len, self.max_positions, "the direct absolute position matrix A^p")
        if ctx.positions is None:  # right padding: token positions are the indices
            first_query = src_len - tgt_len
            return self.weight[:, first_query:src_len, :src_len].unsqueeze(0)

        cells = ctx.prepared(AbsoluteCells(self.max_positions, tgt_len, src_len))
        return lookup(self.weight.flatten(1), 1, cells).transpose(0, 1)  # B x H x Tq x Tk

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        loaded = state_dict.get(prefix + "weight")
        check_loaded_positions(state_dict, prefix + "weight", self.weight.shape, "the direct absolute matrix A^p",
                               self.max_positions, loaded.size(-1) if loaded is not None else 0)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def score_mod(self, ctx: PositionContext, q: Tensor, src_len: int) -> ScoreMod:
        """``score + A^p[h, pos(i), pos(j)]``."""
        weight, tgt_len = captured(self.weight), q.size(2)
        if ctx.positions is None:
            offset = src_len - tgt_len
            return lambda score, b, h, q_idx, kv_idx: score + weight[h, q_idx + offset, kv_idx]
        query_pos, key_pos = ctx.query_key_positions(tgt_len, src_len)
        return lambda score, b, h, q_idx, kv_idx: score + weight[h, query_pos[b, q_idx], key_pos[b, kv_idx]]

    def inspect(self, positions: int) -> List[Quantity]:
        """``A^p[:n, :n]`` per head, n = min(positions, t)."""
        n = min(positions, self.max_positions)
        return [Quantity("absolute", self.weight[:, :n, :n].detach().cpu(), MATRIX,
                         f"learned A^p (first {n} positions)")]


def circulant_bias(spectrum: Tensor, max_positions: int) -> Tensor:
    """``(heads, 2t - 1)``: the bias per ``i - j = -(t-1) .. t-1`` that the real part of a circulant
    operator of order ``N = 2t`` with ``spectrum`` (heads x N) adds, ``(1/N) sum_k spectrum_k
    cos(2 pi k (i - j) / N)`` (Dufter et al.'s released code reads its relative vector this way)."""
    distance = torch.arange(-(max_positions - 1), max_positions, dtype=torch.float64)
    frequency = torch.arange(spectrum.size(-1), dtype=torch.float64)
    waves = torch.cos(2 * math.pi * frequency[:, None] * distance[None, :] / spectrum.size(-1))
    return (spectrum.double() @ waves / spectrum.size(-1)).to(spectrum.dtype)


class DirectRelativePositionBias(AdditiveLogitBias):
    """Relative interactions ``A + a^r[i - j + t - 1]`` with a learnable vector of 2t - 1 per head.

    ``init``: ``glorot`` starts from the bias that the authors' released code starts from. There,
    a vector R of 2t entries drawn with Keras' ``glorot_normal`` (a 1-d shape: both fans
    ``sqrt(2t)``) is the *spectrum* of TensorFlow's ``LinearOperatorCirculant``, whose real part adds
    ``(1/2t) sum_k R_k cos(pi k (i - j) / t)`` to the logits (:func:`circulant_bias`): symmetric in
    ``i - j``, standard deviation about 0.02 at t = 60. We draw R the same way and start ``a^r`` at
    that bias; ``a^r`` itself is then the paper's free entry per ``i - j`` (direction-aware).
    ``zero`` starts from plain attention.
    """

    def __init__(self, num_heads: int, max_positions: int, init: str = "glorot"):
        super().__init__()
        self.max_positions = max_positions
        self.weight = nn.Parameter(torch.zeros(num_heads, 2 * max_positions - 1))
        if init == "glorot":
            spectrum = torch.empty(num_heads, 2 * max_positions)
            fan = (2 * max_positions) ** 0.5
            with torch.no_grad():
                self.weight.copy_(circulant_bias(glorot_(spectrum, fan, fan, "normal"), max_positions))

    def forward(self, ctx: PositionContext, tgt_len: int, src_len: int) -> Tensor:
        check_length(src_len, self.max_positions, "the direct relative position vector a^r")
        index = ctx.relative_distances(tgt_len, src_len) + (self.max_positions - 1)
        return lookup(self.weight, 1, index).unsqueeze(0)

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        loaded = state_dict.get(prefix + "weight")
        check_loaded_positions(state_dict, prefix + "weight", self.weight.shape, "the direct relative vector a^r",
                               self.max_positions, (loaded.size(-1) + 1) // 2 if loaded is not None else 0)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def score_mod(self, ctx: PositionContext, q: Tensor, src_len: int) -> ScoreMod:
        """``score + a^r[h, i - j + t - 1]``."""
        weight, zero = captured(self.weight), src_len - q.size(2) + self.max_positions - 1
        return lambda score, b, h, q_idx, kv_idx: score + weight[h, q_idx - kv_idx + zero]

    def inspect(self, positions: int) -> List[Quantity]:
        """``a^r`` per head over ``i - j = -(n - 1) .. n - 1``, n = min(positions, t)."""
        n = min(positions, self.max_positions)
        zero = self.max_positions - 1  # the index of i - j = 0
        return [Quantity("relative", self.weight[:, zero - (n - 1) : zero + n].detach().cpu(), CURVE,
                         "learned a^r", axes=("i - j (query position minus key position)", "a^r"),
                         ticks=(list(range(-(n - 1), n)),))]


class DirectPositionMethod(PositionMethod):
    name = "direct-position"
    citation = "Dufter et al. 2020, section 2.3"
    options = (
        MethodOption("direct_position", "none",
                     "direct position interactions in the {what} (Dufter et al. 2020, 2.3), added to the "
                     "logits: a learnable t x t matrix per head (absolute, SAN+P), a vector over i - j per "
                     "head (relative, SAN+R) or both (SAN+P+R); t = {t}",
                     choices=("none", "absolute", "relative", "both")),
        MethodOption("direct_position_layers", "first",
                     "layers with direct position interactions: first (as the paper) or all, each layer "
                     "with its own parameters", choices=("first", "all")),
        MethodOption("direct_position_init", "glorot",
                     "initialisation of the direct position parameters: glorot (truncated normal, as the "
                     "authors' released code) or zero (training starts from plain attention)",
                     choices=("glorot", "zero")),
    )
    benchmark_target = "additive"
    variants = {
        "direct-absolute": {"direct_position": "absolute"},
        "direct-relative": {"direct_position": "relative"},
        "direct-both-all-layers": {"direct_position": "both", "direct_position_layers": "all"},
    }
    labels = {"direct-absolute": "SAN+P", "direct-relative": "SAN+R",
              "direct-both-all-layers": "SAN+P+R, all layers"}
    combined = {"direct_position": "both"}

    def is_on(self, options: Any) -> bool:
        return options.direct_position != "none"

    def validate(self, options: Any) -> None:
        if self.is_on(options):
            return
        for name, default in (("direct_position_layers", "first"), ("direct_position_init", "glorot")):
            if getattr(options, name) != default:
                raise PositionOptionError(
                    f"{options.flag(name)} {getattr(options, name)} has no effect without "
                    f"{options.flag('direct_position')}; add {options.flag('direct_position')} "
                    f"absolute|relative|both or drop {options.flag(name)}")

    def needs_max_positions(self, options: Any) -> bool:
        return self.is_on(options)

    def terms(self, options: Any, layer: LayerSpec) -> List[nn.Module]:
        if options.direct_position_layers != "all" and layer.index > 0:
            return []
        kinds = {"absolute": DirectAbsolutePositionBias, "relative": DirectRelativePositionBias}
        return [term(layer.num_heads, options.max_positions, options.direct_position_init)
                for name, term in kinds.items()
                if options.direct_position in (name, "both")]


register(DirectPositionMethod())
