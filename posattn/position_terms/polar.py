"""PoPE: polar coordinate position embeddings (Gopalakrishnan et al. 2025, "Decoupling the 'What' and 'Where' With
Polar Coordinate Positional Embeddings", arXiv 2509.10534), a baseline.

RoPE turns a pair of content dimensions by the position, so the angle of a pair mixes what the token is with where
it is. PoPE separates them: each of the ``d_h`` dimensions c of a head's query and key gives a magnitude, ``mu =
softplus(x_c)`` (the *what*), and its phase is the position alone, ``p theta_c`` with ``d_h`` frequencies
``theta_c = 10000^(-c/d_h)``, c = 0 .. d_h - 1 (the *where*); a key's phase has a learned bias ``delta_{h,c}`` per
head and frequency. The logit of query i and key j of head h is the real part of the complex product:

    a_ij = sum_c softplus(q_ic) softplus(k_jc) cos((j - i) theta_c + delta_{h,c}) / sqrt(d_h),
    delta_{h,c} in [-2 pi, 0]

computed as a dot product of ``2 d_h`` real numbers: the query becomes ``(mu cos(i theta), mu sin(i theta))``, the
key ``(mu cos(j theta + delta), mu sin(j theta + delta))`` (x-transformers' ``PolarEmbedding`` and
``apply_polar_pos_emb`` compute the same). The transformed queries and keys are therefore twice the head size;
the values keep it. Every kernel path takes that as it is (``q k^T``, SDPA and flex_attention accept queries and
keys of another size than the values), and the incremental cache holds the transformed keys.

Choices: the magnitudes are softplus of the *unscaled* query (the kernel's queries come scaled by ``1/sqrt(d_h)``:
``softplus(q sqrt(d_h)) / sqrt(d_h)``), so the logit is the paper's over ``sqrt(d_h)`` of the original head size, as
x-transformers scales it; ``delta`` starts at 0 and is used clamped to ``[-2 pi, 0]`` (x-transformers' default), one
per layer (x-transformers shares one across the layers); token positions, phases and products in fp32 (fp64 for a
double model). PoPE replaces RoPE's rotation and reads the query at its own size, so it is refused with another
transform of the queries and keys and with the terms that read the query's size (relative and structural key
embeddings, CoPE).
"""

import math
from dataclasses import dataclass
from typing import Any, List, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from posattn.position_context import PositionContext, Preparation
from posattn.position_terms.base import QueryKeyTransform, at_least_fp32, same_dtype
from posattn.position_terms.quantities import CURVE, Quantity
from posattn.position_terms.registry import LayerSpec, MethodOption, PositionMethod, PositionOptionError, register

POLAR_BASE = 10000.0
#: the range of the key's phase bias (the paper's and x-transformers' clamp)
PHASE_RANGE = (-2 * math.pi, 0.0)
#: the methods whose terms transform or read the queries and keys at the head size, which PoPE changes
READS_QUERY_SIZE = ("rotary", "xpos", "p-rope", "hope", "relative-positions", "structural-positions", "cope")


def polar_frequencies(head_dim: int, dtype: torch.dtype, device: Optional[torch.device] = None) -> Tensor:
    """``theta_c = 10000^(-c/d_h)`` of the ``d_h`` dimensions (not pairs: each dimension is one frequency)."""
    return POLAR_BASE ** (-torch.arange(head_dim, device=device, dtype=dtype) / head_dim)


@dataclass(frozen=True)
class PhaseTables(Preparation):
    """``cos`` and ``sin`` of the current tokens' phases ``p theta_c``, ``(2, batch or 1, 1, tgt_len, head_dim)``
    in ``dtype`` (fp32 at least)."""

    head_dim: int
    tgt_len: int
    dtype: torch.dtype

    def build(self, ctx: PositionContext) -> Tensor:
        positions, _ = ctx.query_key_positions(self.tgt_len, ctx.length)  # the current tokens'
        phases = positions.to(self.dtype)[:, None, :, None] * polar_frequencies(self.head_dim, self.dtype,
                                                                                 positions.device)
        return torch.stack([phases.cos(), phases.sin()])


class PolarEmbedding(QueryKeyTransform):
    """PoPE on queries (scaled) and keys of shape ``(batch, heads, tgt_len, head_dim)``: returns them of shape
    ``(batch, heads, tgt_len, 2 head_dim)`` (the module docstring's form)."""

    reads_unscaled_query = True  # softplus of the projected query

    def __init__(self, num_heads: int, head_dim: int):
        super().__init__()
        self.head_dim = head_dim
        #: delta_{h,c}, the key's phase bias per head and frequency, used clamped to PHASE_RANGE
        self.phase_bias = nn.Parameter(torch.zeros(num_heads, head_dim))

    def extra_repr(self) -> str:
        return f"heads={self.phase_bias.size(0)}, head_dim={self.head_dim}"

    def forward(self, q: Tensor, k: Tensor, ctx: PositionContext) -> Tuple[Tensor, Tensor]:
        tgt_len, dtype, length = q.size(2), at_least_fp32(q.dtype), ctx.length
        table = ctx.sequence_table(  # incremental decoding: the sequence's phases, sliced per step
            (PhaseTables, self.head_dim, dtype), length,
            lambda n: PhaseTables(self.head_dim, n, dtype).build(PositionContext.unpadded(n, q.device)),
            length_dim=-2)
        if table is None:
            table = ctx.prepared(PhaseTables(self.head_dim, tgt_len, dtype))
        else:
            table = table[..., length - tgt_len : length, :]
        cos, sin = table
        root = self.head_dim ** 0.5  # the kernel's queries are scaled by 1/sqrt(d_h): softplus of the unscaled one
        query_magnitude = F.softplus(same_dtype(q, dtype) * root) / root
        key_magnitude = F.softplus(same_dtype(k, dtype))
        delta = same_dtype(self.phase_bias.clamp(*PHASE_RANGE), dtype)[None, :, None, :]
        delta_cos, delta_sin = delta.cos(), delta.sin()
        key_cos, key_sin = cos * delta_cos - sin * delta_sin, sin * delta_cos + cos * delta_sin  # of p theta + delta
        queries = torch.cat([query_magnitude * cos, query_magnitude * sin], dim=-1)
        keys = torch.cat([key_magnitude * key_cos, key_magnitude * key_sin], dim=-1)
        return same_dtype(queries, q.dtype), same_dtype(keys, k.dtype)

    def inspect(self, positions: int) -> List[Quantity]:
        """The learned phase bias ``delta_{h,c}`` as used (clamped), per head over the frequencies; ``positions`` is
        unused (the phases are fixed)."""
        delta = self.phase_bias.detach().clamp(*PHASE_RANGE).cpu().float()
        return [Quantity("phase-bias", delta, CURVE, "PoPE's key phase bias delta_c per head (radians, in [-2 pi, 0])",
                         axes=("frequency c (theta_c = 10000^(-c/d_h))", "delta_c"),
                         ticks=(list(range(self.head_dim)),))]


class PolarMethod(PositionMethod):
    name = "polar"
    citation = "Gopalakrishnan et al. 2025"
    options = (
        MethodOption("polar", False,
                     "PoPE, polar coordinate position embedding (Gopalakrishnan et al. 2025), of queries and keys in "
                     "every layer of the {what}: magnitudes softplus(q_c), softplus(k_c) and phases of the position "
                     "alone, p theta_c with theta_c = 10000^(-c/d_h) for each of the d_h dimensions, the key's "
                     "phase shifted by a learned delta per head and frequency in [-2 pi, 0]: the logit is sum_c "
                     "mu_q mu_k cos((j - i) theta_c + delta_c) / sqrt(d_h); queries and keys become twice the head "
                     "size, the incremental cache holds transformed keys"),
    )
    benchmark_target = "additive"
    variants = {"polar": {"polar": True}}
    labels = {"polar": "PoPE"}

    def is_on(self, options: Any) -> bool:
        return options.polar

    def validate(self, options: Any) -> None:
        if not self.is_on(options):
            return
        others = [method.asked_by(options) for method in options.methods() if method.name in READS_QUERY_SIZE]
        if others:
            raise PositionOptionError(
                f"{options.flag('polar')} replaces the queries and keys by their polar form of twice the head size, "
                f"which {' and '.join(others)} cannot read: keep one of them")

    def terms(self, options: Any, layer: LayerSpec) -> List[nn.Module]:
        return [PolarEmbedding(layer.num_heads, layer.head_dim)]


register(PolarMethod())
