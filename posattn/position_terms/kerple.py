"""KERPLE: kernelized relative positional embedding (Chi et al. 2022, section 4), a baseline.

KERPLE adds to the logit of query i and key j a bias ``-k(|i - j|)`` where k is a conditionally positive
definite kernel with learned parameters, shifted so that it becomes an additive bias (section 4.2). The
two practical variants of section 4.3, with ``r1, r2 > 0`` learned per head:

- logarithmic: ``bias = -r1 log(1 + r2 |i - j|)``;
- power: ``bias = -r1 |i - j|^r2``, with ``0 < r2 <= 2`` (the range in which ``-|x|^p`` is conditionally
  positive definite).

Choices, as the authors' released code (``chijames/KERPLE``, a GPT-NeoX fork) does them:

- **positivity by a clamp**: the parameters are used clamped to ``[0.01, inf)`` (``r2`` of the power variant
  to ``[0.01, 2]``). The authors clamp the stored values in place before each use (a projected gradient
  step); a forward pass here must not write its parameters (activation checkpointing, ``torch.compile``,
  FSDP), so the forward uses the clamped value and hands its gradient to the stored value unchanged (a
  straight-through clamp): the value used and the gradient are the authors', only a stored value pushed
  below 0.01 is not moved back to it;
- **initialisation**: the multiplier and the inner scale drawn uniformly as the authors' code draws them:
  logarithmic ``r1 ~ U(0, 2)``, ``r2 ~ U(0, 1)``; power ``r1 ~ U(0, 1)``, ``r2 ~ U(0, 2)``;
- **one set of parameters per side**, shared by all its layers (the authors' code passes one module to
  every layer, as GPT-NeoX does with T5's bias): :class:`KerpleParameters` is registered once, as
  ``{side}.position_shared.kerple``, and each layer's :class:`KerpleBias` reads it without registering it.

The paper is about causal language models; ``|i - j|`` makes the same bias symmetric on a bidirectional side
(an encoder), which is how we use it there. The bias is added to our ``1/sqrt(d_h)``-scaled logits.

Both kernel paths read one table of ``(heads, distances)``, the bias of every distance
``0 .. src_len - 1``, computed from r1 and r2 before the kernel (in fp32 at least): the explicit path gathers
it, the ``score_mod`` indexes it at ``[h, |i - j|]`` (flex_attention never reads the per-head scalars
themselves, whose gradients would serialise on atomic adds).
"""

from typing import Any, Hashable, List, Tuple

import torch
from torch import Tensor, nn

from posattn.position_context import AbsoluteDistances, PositionContext
from posattn.position_terms.base import (
    AdditiveLogitBias,
    ScoreMod,
    at_least_fp32,
    captured,
    lookup,
    same_dtype,
)
from posattn.position_terms.quantities import BARS, CURVE, Quantity
from posattn.sharding import gathered
from posattn.position_terms.registry import LayerSpec, MethodOption, PositionMethod, register

#: the authors' lower clamp of r1 and r2, and the power variant's upper clamp of r2
KERPLE_EPS = 1e-2
KERPLE_MAX_POWER = 2.0
KERNELS = ("log", "power")
#: the name of the side's parameters among its shared modules: ``{side}.position_shared.kerple``
SHARED_PARAMETERS = "kerple"


def clamp_passing_gradient(x: Tensor, low: float, high: float = float("inf")) -> Tensor:
    """``x`` clamped to ``[low, high]`` in the forward pass, with the gradient of the clamped value passed to
    ``x`` unchanged (the value the authors' in-place clamp uses, without writing the parameter)."""
    return x + (x.clamp(low, high) - x).detach()


class KerpleParameters(nn.Module):
    """A side's ``r1`` and ``r2`` per head (raw values: :meth:`KerpleBias.parameters_used` clamps them)."""

    def __init__(self, kernel: str, num_heads: int):
        super().__init__()
        self.kernel = kernel
        scale_r1, scale_r2 = (2.0, 1.0) if kernel == "log" else (1.0, 2.0)
        self.r1 = nn.Parameter(torch.rand(num_heads) * scale_r1)
        self.r2 = nn.Parameter(torch.rand(num_heads) * scale_r2)


def kerple_bias(kernel: str, r1: Tensor, r2: Tensor, distance: Tensor) -> Tensor:
    """``-r1 log(1 + r2 d)`` or ``-r1 d^r2`` for ``r1``, ``r2`` of shape ``(heads, 1)`` and distances ``d >= 0``
    (``0^r2 = 0``, its gradient with respect to r2 0: the base is taken at least 1 and the term masked at 0)."""
    if kernel == "log":
        return -r1 * torch.log1p(r2 * distance)
    return -r1 * distance.clamp(min=1).pow(r2) * (distance > 0).to(distance.dtype)


class KerpleBias(AdditiveLogitBias):
    """``logits[h, i, j] += bias_h(|i - j|)``, KERPLE's log or power kernel, with the side's parameters.

    The term holds the side's :class:`KerpleParameters` without registering it (the side does, once)."""

    def __init__(self, parameters: KerpleParameters):
        super().__init__()
        self.kernel = parameters.kernel
        object.__setattr__(self, "side_parameters", parameters)  # held, not registered

    def side_modules(self) -> List[nn.Module]:
        return [self.side_parameters]

    def table_key(self, *built_with: Hashable) -> Tuple[Hashable, ...]:
        """Keyed by the side's parameters: the side's layers add the same bias, built once per sequence."""
        return (self.side_parameters, *built_with)

    def extra_repr(self) -> str:
        return f"kernel={self.kernel}"

    def parameters_used(self) -> Tuple[Tensor, Tensor]:
        """``r1`` and ``r2`` as the bias uses them, clamped (gradients passed through), in fp32 at least."""
        raw = self.side_parameters
        dtype = at_least_fp32(raw.r1.dtype)
        high = KERPLE_MAX_POWER if self.kernel == "power" else float("inf")
        r1, r2 = (gathered(value, "KERPLE's r1 and r2 (position_shared.kerple)") for value in (raw.r1, raw.r2))
        return (clamp_passing_gradient(same_dtype(r1, dtype), KERPLE_EPS),
                clamp_passing_gradient(same_dtype(r2, dtype), KERPLE_EPS, high))

    def by_distance(self, length: int, device: torch.device) -> Tensor:
        """``(heads, length)``: the bias of every distance ``0 .. length - 1``, in fp32 (fp64 for a double
        model); both kernel paths read it."""
        r1, r2 = self.parameters_used()
        distance = torch.arange(length, device=device, dtype=r1.dtype)
        return kerple_bias(self.kernel, r1[:, None], r2[:, None], distance)

    def forward(self, ctx: PositionContext, tgt_len: int, src_len: int) -> Tensor:
        distance = ctx.prepared(AbsoluteDistances(tgt_len, src_len))  # parameter-free: once per batch
        return lookup(self.by_distance(src_len, distance.device), 1, distance).unsqueeze(0)  # 1 x H x Tq x Tk

    def score_mod(self, ctx: PositionContext, q: Tensor, src_len: int) -> ScoreMod:
        """``score + bias[h, |i - j|]``, the table of :meth:`by_distance` read at the pair's distance."""
        table = captured(self.by_distance(src_len, q.device))
        offset = src_len - q.size(2)

        def kerple(score: Tensor, b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
            return score + table[h, (q_idx + offset - kv_idx).abs()].to(score.dtype)
        return kerple

    def inspect(self, positions: int) -> List[Quantity]:
        """r1 and r2 as used (clamped) per head, and each head's bias over ``i - j`` for the first
        ``positions`` positions (``-(positions - 1) .. positions - 1``: the bias is symmetric)."""
        r1, r2 = (p.detach().cpu() for p in self.parameters_used())
        distance = torch.arange(-(positions - 1), positions)
        bias = kerple_bias(self.kernel, r1[:, None], r2[:, None], distance.abs().to(r1.dtype))
        form = "-r1 log(1 + r2 |i - j|)" if self.kernel == "log" else "-r1 |i - j|^r2"
        return [Quantity("r1", r1, BARS, "learned r1 (clamped)", signed=False),
                Quantity("r2", r2, BARS, "learned r2 (clamped)", signed=False),
                Quantity("bias", bias, CURVE, f"KERPLE {self.kernel} bias {form}",
                         axes=("i - j (query position minus key position)", "bias"),
                         ticks=(distance.tolist(),))]


class KerpleMethod(PositionMethod):
    name = "kerple"
    citation = "Chi et al. 2022, section 4.3"
    options = (
        MethodOption("kerple", "none",
                     "KERPLE's kernelized relative position bias in every layer of the {what} (Chi et al. "
                     "2022): log = -r1 log(1 + r2 |i - j|), power = -r1 |i - j|^r2 (r2 <= 2), r1 and r2 > 0 "
                     "learned per head (clamped at 0.01, as the authors' code), one set shared by the side's "
                     "layers; none = off", choices=("none", *KERNELS)),
    )
    benchmark_target = "additive"
    variants = {"kerple-log": {"kerple": "log"}, "kerple-power": {"kerple": "power"}}
    labels = {"kerple-log": "KERPLE (log)", "kerple-power": "KERPLE (power)"}
    combined = {"kerple": "log"}

    def is_on(self, options: Any) -> bool:
        return options.kerple != "none"

    def terms(self, options: Any, layer: LayerSpec) -> List[nn.Module]:
        """The layer's term, reading the side's parameters (made by the first layer, in ``layer.shared``)."""
        if SHARED_PARAMETERS not in layer.shared:
            layer.shared[SHARED_PARAMETERS] = KerpleParameters(options.kerple, layer.num_heads)
        return [KerpleBias(layer.shared[SHARED_PARAMETERS])]


register(KerpleMethod())
