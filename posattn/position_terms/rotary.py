"""Rotary position embedding, RoPE (Su et al. 2021, RoFormer, section 3.4), a baseline, with its context extensions.

Queries and keys are rotated by their token position before the dot product: dimensions
``(2k, 2k + 1)`` of a head form a pair that turns by the angle ``p * theta_k``, with
``theta_k = 10000^(-2k / d_h)`` (the paper's eq. 15 and 34, pairs of neighbouring dimensions).
``q_i . k_j`` then depends on the positions only through ``i - j``. The position is the *token*
position (a left-padded sentence turns exactly as when it is alone); in incremental decoding each
key is rotated once, at its own step, before it enters the cache. The angles and the rotation are
computed in fp32 and cast back to the model's dtype. No parameters; applied in every layer.

The context extensions (:class:`RotaryScaling`, ``--{side}-rotary-scaling``) change the frequencies ``theta_k`` so
that a model trained on ``L`` positions (``--{side}-rotary-original-positions``) reads ``s L`` (``s``:
``--{side}-rotary-scaling-factor``); each equals transformers' ``ROPE_INIT_FUNCTIONS`` entry of the same name
(``modeling_rope_utils``, 5.x):

- ``linear``, position interpolation (Chen et al. 2023, section 2.2): positions divided by ``s``, i.e. ``theta_k / s``;
- ``ntk``, NTK-aware scaling (Peng et al. 2023, section 3.1): the base raised to ``10000 s^(d_h / (d_h - 2))``;
- ``dynamic``, dynamic NTK (Peng et al. 2023, section 3.3): ``ntk`` with the factor ``s n / L - (s - 1)`` of the
  length ``n`` (none up to ``L``). The token at position ``p`` turns with the frequencies of ``n = max(p + 1, L)``,
  the length of the sequence that ends at it: its key is rotated once, at its step, and cached so, in the full pass
  and in incremental decoding alike (what transformers' generation with a cache computes token by token; its full
  forward instead turns every token with the frequencies of the whole sequence's length);
- ``yarn`` (Peng et al. 2023, section 3.2-3.4): per pair, a ramp between ``theta_k / s`` (pairs that turn fewer than
  ``beta_slow`` times over ``L``) and ``theta_k`` (more than ``beta_fast`` times), linear in ``k`` between the
  pairs ``floor(k(beta_fast))`` and ``ceil(k(beta_slow))``, ``k(r) = d_h ln(L / (2 pi r)) / (2 ln 10000)`` (the
  authors' code and transformers'; the paper's text states the ramp over ``r``). Its attention temperature
  ``sqrt(1/t) = 0.1 ln s + 1`` multiplies the rotated queries and keys (the tables' cos and sin, as
  transformers does), so the logits ``q . k`` by its square;
- ``llama3`` (Meta 2024, Llama 3.1): pairs whose wavelength ``2 pi / theta_k`` exceeds ``L / low`` get ``theta_k / s``,
  those below ``L / high`` keep ``theta_k``, and between, ``(1 - g) theta_k / s + g theta_k`` with
  ``g = (L / wavelength - low) / (high - low)``.
"""

import math
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

import torch
from torch import Tensor, nn

from posattn.position_context import PositionContext, Preparation
from posattn.position_terms.base import QueryKeyTransform, at_least_fp32, same_dtype
from posattn.position_terms.quantities import CURVE, Quantity
from posattn.position_terms.registry import (
    LayerSpec,
    MethodOption,
    PositionMethod,
    PositionOptionError,
    register,
)

ROTARY_BASE = 10000.0
#: the context extensions of ``--{side}-rotary-scaling`` (none: RoPE's own frequencies)
ROTARY_SCALINGS = ("none", "linear", "ntk", "dynamic", "yarn", "llama3")


def rotary_frequencies(head_dim: int, dtype: torch.dtype, device: Optional[torch.device] = None) -> Tensor:
    """``theta_k = 10000^(-2k / d_h)`` of the ``d_h / 2`` pairs of dimensions."""
    pairs = torch.arange(0, head_dim, 2, device=device, dtype=dtype)
    return ROTARY_BASE ** (-pairs / head_dim)


def rotation_tables(angles: Tensor) -> Tuple[Tensor, Tensor]:
    """``cos`` and signed ``sin`` of ``angles[..., k]`` per dimension: ``(cos_k, cos_k)`` and
    ``(-sin_k, sin_k)`` at dimensions ``(2k, 2k + 1)``, for :func:`rotate_pairs`."""
    sin = angles.sin()
    return angles.cos().repeat_interleave(2, dim=-1), torch.stack([-sin, sin], dim=-1).flatten(-2)


def rotate_pairs(x: Tensor, cos: Tensor, signed_sin: Tensor) -> Tensor:
    """Turn each pair ``(x[..., 2k], x[..., 2k + 1])`` by the angle of :func:`rotation_tables`:
    ``(a, b) -> (a cos - b sin, b cos + a sin)`` (eq. 34), as ``x cos + swap(x) signed_sin``."""
    turned = same_dtype(x, cos.dtype)
    swapped = turned.unflatten(-1, (-1, 2)).flip(-1).flatten(-2)
    return same_dtype(turned * cos + swapped * signed_sin, x.dtype)


def frequencies_of_base(base: Tensor, head_dim: int) -> Tensor:
    """``base^(-2k / d_h)`` of the ``d_h / 2`` pairs, for a ``base`` of any shape (a last dimension added)."""
    pairs = torch.arange(0, head_dim, 2, dtype=base.dtype, device=base.device)
    return base[..., None] ** (-pairs / head_dim)


@dataclass(frozen=True)
class RotaryScaling:
    """A context extension of RoPE's frequencies (the module docstring gives each ``kind``'s equation): ``factor``
    s, ``original_positions`` L (the training length), YaRN's ``beta_fast`` and ``beta_slow`` and Llama 3's
    ``low_frequency_factor`` and ``high_frequency_factor``; ``kind`` none is RoPE's own."""

    kind: str = "none"
    factor: float = 1.0
    original_positions: int = 0
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    low_frequency_factor: float = 1.0
    high_frequency_factor: float = 4.0

    @property
    def attention_scaling(self) -> float:
        """What the rotated queries and keys are multiplied by: YaRN's ``sqrt(1/t) = 0.1 ln s + 1``, else 1."""
        return 0.1 * math.log(self.factor) + 1.0 if self.kind == "yarn" and self.factor > 1 else 1.0

    def frequencies(self, head_dim: int, dtype: torch.dtype, device: Optional[torch.device] = None,
                    length: Optional[Tensor] = None) -> Tensor:
        """The ``d_h / 2`` scaled frequencies; for dynamic NTK, of a sequence of ``length`` tokens (a tensor of
        any shape: the frequencies gain a last dimension; None: ``L``), which the other kinds do not read."""
        theta = rotary_frequencies(head_dim, dtype, device)
        s = self.factor
        if self.kind == "linear":
            return theta / s
        if self.kind == "ntk":
            return frequencies_of_base(torch.tensor(ROTARY_BASE * s ** (head_dim / (head_dim - 2)), dtype=dtype,
                                                    device=device), head_dim)
        if self.kind == "dynamic":
            return self._dynamic(head_dim, dtype, device, length)
        if self.kind == "yarn":
            ramp = self._yarn_ramp(head_dim, dtype, device)
            return theta / s * ramp + theta * (1 - ramp)
        if self.kind == "llama3":
            return self._llama3(theta)
        return theta

    def _dynamic(self, head_dim: int, dtype: torch.dtype, device: Optional[torch.device],
                 length: Optional[Tensor]) -> Tensor:
        L, s = self.original_positions, self.factor
        n = torch.full((), L, dtype=dtype, device=device) if length is None else length.to(dtype).clamp(min=L)
        return frequencies_of_base(ROTARY_BASE * (s * n / L - (s - 1)) ** (head_dim / (head_dim - 2)), head_dim)

    def _yarn_ramp(self, head_dim: int, dtype: torch.dtype, device: Optional[torch.device]) -> Tensor:
        """YaRN's gamma per pair: 0 (extrapolate, theta_k) up to pair ``floor(k(beta_fast))``, 1 (interpolate,
        theta_k / s) from ``ceil(k(beta_slow))``, linear between (widened by 0.001 where they meet)."""
        def pair_of(rotations: float) -> float:
            turns = self.original_positions / (rotations * 2 * math.pi)
            return head_dim * math.log(turns) / (2 * math.log(ROTARY_BASE))

        low = max(math.floor(pair_of(self.beta_fast)), 0)
        high = min(math.ceil(pair_of(self.beta_slow)), head_dim - 1)
        if low == high:
            high += 0.001
        pairs = torch.arange(head_dim // 2, dtype=dtype, device=device)
        return ((pairs - low) / (high - low)).clamp(0, 1)

    def _llama3(self, theta: Tensor) -> Tensor:
        L, s = self.original_positions, self.factor
        low, high = self.low_frequency_factor, self.high_frequency_factor
        wavelength = 2 * math.pi / theta
        smooth = ((L / wavelength - low) / (high - low)).clamp(0, 1)
        return (1 - smooth) * theta / s + smooth * theta


@dataclass(frozen=True)
class RotationTables(Preparation):
    """:func:`rotation_tables` of the current tokens' positions, ``(2, batch or 1, 1, tgt_len,
    head_dim)``, in ``dtype``: fp32 (fp64 for a double model; a buffer would be cast to fp16 by --fp16); with a
    ``scaling``, of its frequencies (dynamic NTK: each token's of its own length, ``position + 1``), times its
    attention scaling."""

    head_dim: int
    tgt_len: int
    dtype: torch.dtype
    scaling: RotaryScaling = RotaryScaling()

    def build(self, ctx: PositionContext) -> Tensor:
        positions, _ = ctx.query_key_positions(self.tgt_len, ctx.length)  # the current tokens'
        positions = positions.to(self.dtype)[:, None, :, None]
        frequencies = self.scaling.frequencies(self.head_dim, self.dtype, positions.device, positions[..., 0] + 1)
        tables = torch.stack(rotation_tables(positions * frequencies))
        scale = self.scaling.attention_scaling
        return tables if scale == 1 else tables * scale


class RotaryEmbedding(QueryKeyTransform):
    """RoPE on queries and keys of shape ``(batch, heads, tgt_len, head_dim)``, its frequencies scaled by
    ``scaling`` (none: RoPE's own)."""

    def __init__(self, head_dim: int, scaling: RotaryScaling = RotaryScaling()):
        super().__init__()
        self.head_dim = head_dim
        self.scaling = scaling

    def forward(self, q: Tensor, k: Tensor, ctx: PositionContext) -> Tuple[Tensor, Tensor]:
        tgt_len, dtype, length = q.size(2), at_least_fp32(q.dtype), ctx.length
        table = ctx.sequence_table(  # incremental decoding: the sequence's angles, sliced per step
            (RotationTables, self.head_dim, dtype, self.scaling), length,
            lambda n: self.tables(PositionContext.unpadded(n, q.device), n, dtype, q.device), length_dim=-2)
        if table is None:
            table = ctx.prepared(RotationTables(self.head_dim, tgt_len, dtype, self.scaling))
        else:
            table = table[..., length - tgt_len : length, :]
        cos, signed_sin = table
        return rotate_pairs(q, cos, signed_sin), rotate_pairs(k, cos, signed_sin)

    def tables(self, ctx: PositionContext, tgt_len: int, dtype: torch.dtype, device: torch.device) -> Tensor:
        """:class:`RotationTables` of ``tgt_len`` current tokens."""
        return RotationTables(self.head_dim, tgt_len, dtype, self.scaling).build(ctx)

    def inspect(self, positions: int) -> List[Quantity]:
        """Nothing is learned; shown is what the rotation alone does to a logit: ``q_i . k_j`` of a
        query and a key equal to the same vector of ones, over ``|q| |k|``, i.e. the mean over the
        pairs k of ``cos((i - j) theta_k)`` (with a scaling: its frequencies, dynamic NTK's of ``positions``
        tokens, and its attention scaling squared), for the first ``positions`` positions (every head alike)."""
        distance = torch.arange(-(positions - 1), positions, dtype=torch.float64)
        frequencies = self.scaling.frequencies(self.head_dim, torch.float64, length=torch.tensor(float(positions)))
        pattern = torch.cos(distance[:, None] * frequencies).mean(dim=1) * self.scaling.attention_scaling ** 2
        return [Quantity("angle-pattern", pattern[None].float(), CURVE,
                         "rotation's effect on q_i . k_j of equal contents (every head)",
                         axes=("i - j (query position minus key position)", "mean cos((i - j) theta_k)"),
                         ticks=(distance.long().tolist(),))]


#: the options of a context extension beside ``rotary_scaling``: option -> :class:`RotaryScaling`'s field
SCALING_FIELDS = {
    "rotary_scaling_factor": "factor",
    "rotary_original_positions": "original_positions",
    "rotary_yarn_beta_fast": "beta_fast",
    "rotary_yarn_beta_slow": "beta_slow",
    "rotary_llama3_low_frequency_factor": "low_frequency_factor",
    "rotary_llama3_high_frequency_factor": "high_frequency_factor",
}
#: the options each context extension reads (any other left at its default)
READS = {
    "none": (),
    "linear": ("rotary_scaling_factor",),
    "ntk": ("rotary_scaling_factor",),
    "dynamic": ("rotary_scaling_factor", "rotary_original_positions"),
    "yarn": ("rotary_scaling_factor", "rotary_original_positions", "rotary_yarn_beta_fast", "rotary_yarn_beta_slow"),
    "llama3": ("rotary_scaling_factor", "rotary_original_positions", "rotary_llama3_low_frequency_factor",
               "rotary_llama3_high_frequency_factor"),
}


class RotaryMethod(PositionMethod):
    name = "rotary"
    citation = "Su et al. 2021, section 3.4"
    options = (
        MethodOption("rotary", False,
                     "rotary position embedding (RoPE, Su et al. 2021) of queries and keys in every "
                     "layer of the {what}: pairs of dimensions turned by the token position times "
                     "theta_k = 10000^(-2k/d_h); the incremental cache holds rotated keys"),
        MethodOption("rotary_scaling", "none",
                     "with --{side}-rotary: RoPE's context extension, for a model trained on L positions "
                     "(--{side}-rotary-original-positions) to read s L (--{side}-rotary-scaling-factor): linear "
                     "(position interpolation, Chen et al. 2023: theta_k / s), ntk (NTK-aware: base 10000 "
                     "s^(d_h/(d_h-2))), dynamic (dynamic NTK: ntk with the factor s n/L - (s - 1) of the length n "
                     "of the sequence ending at each token, none up to L), yarn (Peng et al. 2023: a ramp between "
                     "theta_k / s and theta_k per pair, and q and k times 0.1 ln s + 1) or llama3 (Meta 2024: "
                     "theta_k / s for wavelengths above L / low, theta_k below L / high, smoothed between); each "
                     "as transformers' rope type of that name", choices=ROTARY_SCALINGS),
        MethodOption("rotary_scaling_factor", 1.0,
                     "with --{side}-rotary-scaling: the factor s by which the context is extended (above 1; "
                     "Llama 3.1: 8)"),
        MethodOption("rotary_original_positions", 0,
                     "with --{side}-rotary-scaling dynamic, yarn or llama3: L, the number of positions the model "
                     "was trained on (Llama 3.1: 8192)"),
        MethodOption("rotary_yarn_beta_fast", 32.0,
                     "with --{side}-rotary-scaling yarn: pairs turning more than beta times over L keep theta_k "
                     "(the paper: 32)"),
        MethodOption("rotary_yarn_beta_slow", 1.0,
                     "with --{side}-rotary-scaling yarn: pairs turning fewer than beta times over L get "
                     "theta_k / s (the paper: 1)"),
        MethodOption("rotary_llama3_low_frequency_factor", 1.0,
                     "with --{side}-rotary-scaling llama3: pairs of wavelength above L / low get theta_k / s "
                     "(Llama 3.1: 1)"),
        MethodOption("rotary_llama3_high_frequency_factor", 4.0,
                     "with --{side}-rotary-scaling llama3: pairs of wavelength below L / high keep theta_k "
                     "(Llama 3.1: 4)"),
    )
    benchmark_target = "additive"
    variants = {"rotary": {"rotary": True},
                "rotary-yarn": {"rotary": True, "rotary_scaling": "yarn", "rotary_scaling_factor": 4.0,
                                "rotary_original_positions": 4}}
    labels = {"rotary": "RoPE", "rotary-yarn": "RoPE + YaRN"}
    combined = {"rotary": True}

    def is_on(self, options: Any) -> bool:
        return options.rotary

    def validate(self, options: Any) -> None:
        kind = options.rotary_scaling
        if not self.is_on(options) and kind != "none":
            raise PositionOptionError(f"{options.flag('rotary_scaling')} {kind} scales RoPE's frequencies: add "
                                      f"{options.flag('rotary')}, or drop {options.flag('rotary_scaling')}")
        defaults = {option.name: option.default for option in self.options}
        for name in SCALING_FIELDS:
            if name not in READS[kind] and getattr(options, name) != defaults[name]:
                readers = [other for other, names in READS.items() if name in names]
                raise PositionOptionError(
                    f"{options.flag(name)} {getattr(options, name)} has no effect with "
                    f"{options.flag('rotary_scaling')} {kind}: it is read by {' or '.join(readers)}; drop it or "
                    "choose one of those")
        if kind != "none":
            self._validate_scaling(options, kind)

    @staticmethod
    def _validate_scaling(options: Any, kind: str) -> None:
        factor = options.rotary_scaling_factor
        if kind == "dynamic" and not (math.isfinite(factor) and factor >= 1):
            raise PositionOptionError(f"{options.flag('rotary_scaling_factor')} must be at least 1 with "
                                      f"{options.flag('rotary_scaling')} dynamic, got {factor}")
        if kind != "dynamic" and not (math.isfinite(factor) and factor > 1):
            raise PositionOptionError(
                f"{options.flag('rotary_scaling_factor')} must be above 1 with {options.flag('rotary_scaling')} "
                f"{kind}, got {factor} (1 leaves RoPE unchanged: {options.flag('rotary_scaling')} none)")
        if "rotary_original_positions" in READS[kind] and options.rotary_original_positions < 1:
            raise PositionOptionError(
                f"{options.flag('rotary_scaling')} {kind} needs {options.flag('rotary_original_positions')}, the "
                f"number of positions the model was trained on (a positive integer), got "
                f"{options.rotary_original_positions}")
        pairs = {"yarn": ("rotary_yarn_beta_slow", "rotary_yarn_beta_fast"),
                 "llama3": ("rotary_llama3_low_frequency_factor", "rotary_llama3_high_frequency_factor")}
        if kind in pairs:
            low, high = pairs[kind]
            if not 0 < getattr(options, low) < getattr(options, high):
                raise PositionOptionError(
                    f"{options.flag(low)} and {options.flag(high)} must satisfy 0 < {getattr(options, low)} < "
                    f"{getattr(options, high)}, the ramp's two ends")

    def terms(self, options: Any, layer: LayerSpec) -> List[nn.Module]:
        if layer.head_dim % 2:
            raise PositionOptionError(
                f"{options.flag('rotary')} turns pairs of dimensions: the head size "
                f"{layer.head_dim} (embedding dimension / attention heads) must be even")
        if options.rotary_scaling in ("ntk", "dynamic") and layer.head_dim < 4:
            raise PositionOptionError(
                f"{options.flag('rotary_scaling')} {options.rotary_scaling} raises the base to the power "
                f"d_h/(d_h - 2): the head size {layer.head_dim} must be at least 4")
        return [RotaryEmbedding(layer.head_dim, scaling_of(options))]


def scaling_of(options: Any) -> RotaryScaling:
    """The :class:`RotaryScaling` of a side's options."""
    values: Dict[str, Any] = {field: getattr(options, name) for name, field in SCALING_FIELDS.items()}
    return RotaryScaling(options.rotary_scaling, **values)


register(RotaryMethod())
