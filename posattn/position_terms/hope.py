"""HoPE: high-frequency rotary position encoding (Chen et al. 2025, "HoPE: A Novel Positional Encoding Without
Long-Term Decay for Enhanced Context Awareness and Extrapolation", ACL), a baseline.

The paper traces the U-shaped attention of RoPE models to RoPE's low-frequency pairs: a pair whose period
``2 pi / theta_k`` exceeds the training length L never completes a turn in training, so its ``cos((i - j)
theta_k)`` is a monotonic function of the distance over every distance seen (the source of RoPE's long-term decay
and of shortcut learning), and it meets angles beyond those seen when the model reads longer texts. HoPE keeps the
high-frequency pairs, those that complete at least one period within L, and makes the others position-independent
(not turned):

    theta'_k = theta_k  if 2 pi / theta_k <= L,    theta'_k = 0  otherwise,    theta_k = 10000^(-2k/d_h)

Since ``theta_k`` falls with k, these are the first ``#{k : theta_k >= 2 pi / L}`` pairs: the rotation of p-RoPE
(:class:`~posattn.position_terms.p_rope.TruncatedRotaryEmbedding`) with a count set by L instead of a fraction.
Our choices where the paper leaves them open: L is the option's value (``--{side}-hope L``), the length the model
is trained at, not read from the side's position limit; a period equal to L counts as completed; with a head so
small that every period is at most L, HoPE is RoPE. As RoPE: token positions, neighbouring dimensions as pairs,
rotation in fp32, keys turned once before the incremental cache; no parameters.
"""

import math
from typing import Any, List

import torch
from torch import nn

from posattn.position_terms.p_rope import TruncatedRotaryEmbedding, check_even
from posattn.position_terms.registry import (
    LayerSpec,
    MethodOption,
    PositionMethod,
    PositionOptionError,
    register,
)
from posattn.position_terms.rotary import rotary_frequencies

#: the shortest training length that keeps a pair turning: the fastest pair's period, 2 pi (theta_0 = 1)
SHORTEST_LENGTH = math.ceil(2 * math.pi)
#: the training length of the registered variant: the length-extrapolation protocol's training length (its
#: ``L_TRAIN``), so that its runs are HoPE as the paper defines it (the tests' heads split into kept and unturned pairs
#: at it too)
VARIANT_LENGTH = 64


def high_frequency_pairs(head_dim: int, training_length: int) -> int:
    """The number of pairs whose period ``2 pi / theta_k`` is at most ``training_length`` (computed in fp64)."""
    periods = 2 * math.pi / rotary_frequencies(head_dim, torch.float64)
    return int((periods <= training_length).sum())


class HighFrequencyRotaryEmbedding(TruncatedRotaryEmbedding):
    """HoPE on queries and keys of shape ``(batch, heads, tgt_len, head_dim)``: RoPE of the pairs that complete a
    period within ``training_length`` tokens, the others unturned."""

    def __init__(self, head_dim: int, training_length: int):
        super().__init__(head_dim, high_frequency_pairs(head_dim, training_length))
        self.training_length = training_length

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, training_length={self.training_length}"


class HopeMethod(PositionMethod):
    name = "hope"
    citation = "Chen et al. 2025"
    options = (
        MethodOption("hope", 0,
                     "HoPE (Chen et al. 2025) of queries and keys in every layer of the {what}: RoPE in which the "
                     "pairs of dimensions whose period 2 pi / theta_k, theta_k = 10000^(-2k/d_h), exceeds this "
                     "training length L are not turned (position-independent), the high-frequency ones turned as "
                     "RoPE's; the incremental cache holds turned keys; 0 = off"),
    )
    benchmark_target = "additive"
    variants = {"hope": {"hope": VARIANT_LENGTH}}
    labels = {"hope": "HoPE"}

    def is_on(self, options: Any) -> bool:
        return options.hope != 0

    def validate(self, options: Any) -> None:
        if options.hope < 0 or 0 < options.hope < SHORTEST_LENGTH:
            raise PositionOptionError(
                f"{options.flag('hope')} is the training length L (0 = off) and must be at least {SHORTEST_LENGTH}, "
                f"the period 2 pi of the fastest pair (else no pair turns), got {options.hope}")

    def terms(self, options: Any, layer: LayerSpec) -> List[nn.Module]:
        check_even(options, "hope", layer)
        return [HighFrequencyRotaryEmbedding(layer.head_dim, options.hope)]


register(HopeMethod())
