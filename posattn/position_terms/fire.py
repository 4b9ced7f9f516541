"""FIRE: functional interpolation for relative positions (Li et al. 2023, ICLR 2024, section 3), a baseline.

A small network maps a *normalised* distance to a bias per head. For query i and key j <= i (token
positions from 0):

    bias(i, j) = f_theta( psi(i - j) / psi(max(L, i)) ),    psi(x) = log(c x + 1)

``f_theta`` is an MLP from one input to one output per head (the paper: two layers, 32 hidden units, ReLU);
``psi`` amplifies the differences of small distances (learned ``c``), and the normaliser
``psi(max(L, i))`` maps every distance into ``[0, 1]`` ("progressive interpolation"), with a learned
threshold L below which short contexts are not stretched. Choices, as the paper's reference code does them:
``c`` starts at 0.1 and is used as ``|c|``; L is ``|m L_0|``, a learned multiplier m (starting at 1) of the
initial threshold ``L_0`` (``--{side}-fire-threshold``, 512 by default); ``1e-6`` is added to the normaliser
(a query at position 0 over a threshold of 0 divides 0 by it); the MLP has PyTorch's default
initialisation; every layer has its own MLP, c and L (the paper's FIRE; its layer-shared variant is not
offered).

**Bidirectional side (our choice; the paper defines FIRE for causal attention).** On an encoder a key may
follow the query; we feed the MLP the *signed* normalised distance, normalised by the later of the two
positions: ``x = sign(i - j) psi(|i - j|) / psi(max(L, i, j))``, in ``[-1, 1]``. For ``j <= i`` this is the
paper's input exactly (``max(i, j) = i``), so one formula serves both sides, and the MLP can tell keys
before the query from keys after it.

**Kernel paths.** The bias depends on the query position through the normaliser, not on ``i - j`` alone,
so it has no table of one entry per head and distance. Both paths read one ``(heads, n, n)`` table of the
bias of every pair of token positions below n = the keys' length, made by evaluating the MLP on that grid
before the kernel (as the paper's code evaluates it on the ``n x n`` distance matrix): the explicit path
gathers it (by token positions: left padding changes nothing), and the ``score_mod`` indexes it at
``[h, pos(i), pos(j)]``, the form of the direct absolute bias ``A^p``. Each learned table entry is read once
per sentence, so flex_attention's backward adds no contended atomics; the table itself is
``O(heads x n^2)`` memory, as the dense bias of the SDPA path, and the MLP's hidden layer on the grid
(``n^2 x 32``) is the method's cost on every path. Evaluating the MLP per (query, key) inside the
``score_mod`` instead would read its weights, a few scalars, at every pair: the contended atomics that
made DA's backward 70x slower.
"""

from typing import Any, List

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from posattn.position_context import PositionContext
from posattn.position_terms.base import AdditiveLogitBias, ScoreMod, at_least_fp32, captured, lookup
from posattn.position_terms.quantities import MATRIX, Quantity
from posattn.position_terms.registry import (
    LayerSpec,
    MethodOption,
    PositionMethod,
    PositionOptionError,
    register,
)

#: the paper's reference code: initial c, and the constant added to the normaliser
FIRE_INITIAL_C = 0.1
FIRE_EPS = 1e-6


class FireBias(AdditiveLogitBias):
    """``logits[h, i, j] += f_theta(x)[h]`` with ``x = sign(i - j) psi(|i - j|) / psi(max(L, i, j))``."""

    def __init__(self, num_heads: int, hidden: int, threshold: float):
        super().__init__()
        self.num_heads, self.hidden, self.initial_threshold = num_heads, hidden, float(threshold)
        self.mlp_in = nn.Linear(1, hidden)
        self.mlp_out = nn.Linear(hidden, num_heads)
        self.c = nn.Parameter(torch.full((1,), FIRE_INITIAL_C))
        self.threshold_scale = nn.Parameter(torch.ones(1))

    def extra_repr(self) -> str:
        return f"heads={self.num_heads}, hidden={self.hidden}, threshold={self.initial_threshold:g}"

    def inputs(self, length: int, device: torch.device) -> Tensor:
        """``(length, length)``: the MLP's input x for query position i (rows) and key position j (columns),
        in fp32 (fp64 for a double model)."""
        dtype = at_least_fp32(self.c.dtype)
        position = torch.arange(length, device=device, dtype=dtype)
        c = self.c.to(dtype).abs()
        threshold = (self.threshold_scale.to(dtype) * self.initial_threshold).abs()
        distance = position[:, None] - position[None, :]
        later = torch.maximum(position[:, None], position[None, :])
        normaliser = torch.log1p(c * torch.maximum(later, threshold)) + FIRE_EPS
        return torch.sign(distance) * torch.log1p(c * distance.abs()) / normaliser

    def grid(self, length: int, device: torch.device) -> Tensor:
        """``(heads, length, length)``: the bias of query position i and key position j below ``length``, in
        fp32 (fp64 for a double model); both kernel paths read it."""
        x = self.inputs(length, device)
        dtype = x.dtype
        hidden = torch.relu(F.linear(x[..., None], self.mlp_in.weight.to(dtype), self.mlp_in.bias.to(dtype)))
        out = F.linear(hidden, self.mlp_out.weight.to(dtype), self.mlp_out.bias.to(dtype))
        return out.permute(2, 0, 1)

    def forward(self, ctx: PositionContext, tgt_len: int, src_len: int) -> Tensor:
        grid = self.grid(src_len, ctx.padding_mask.device)
        if ctx.positions is None:  # right padding: token positions are the indices
            return grid[:, src_len - tgt_len :, :].unsqueeze(0)
        query_pos, key_pos = ctx.query_key_positions(tgt_len, src_len)
        cells = query_pos[:, :, None] * src_len + key_pos[:, None, :]  # B x Tq x Tk
        return lookup(grid.flatten(1), 1, cells).transpose(0, 1)  # B x H x Tq x Tk

    def score_mod(self, ctx: PositionContext, q: Tensor, src_len: int) -> ScoreMod:
        """``score + bias[h, pos(i), pos(j)]``, the table of :meth:`grid` evaluated before the kernel."""
        grid, tgt_len = captured(self.grid(src_len, q.device)), q.size(2)
        if ctx.positions is None:
            offset = src_len - tgt_len
            return lambda score, b, h, q_idx, kv_idx: score + grid[h, q_idx + offset, kv_idx].to(score.dtype)
        query_pos, key_pos = ctx.query_key_positions(tgt_len, src_len)
        return lambda score, b, h, q_idx, kv_idx: (
            score + grid[h, query_pos[b, q_idx], key_pos[b, kv_idx]].to(score.dtype))

    def inspect(self, positions: int) -> List[Quantity]:
        """The bias of every (query position, key position) of the first ``positions`` positions, per head."""
        with torch.no_grad():
            grid = self.grid(positions, self.c.device).float().cpu()
        return [Quantity("bias", grid, MATRIX, "FIRE bias f(psi(i - j) / psi(max(L, i)))")]


class FireMethod(PositionMethod):
    name = "fire"
    citation = "Li et al. 2023, section 3"
    options = (
        MethodOption("fire", False,
                     "FIRE's learned functional bias in every layer of the {what} (Li et al. 2023): an MLP of "
                     "psi(i - j) / psi(max(L, i)), psi(x) = log(c x + 1), one output per head, with c and the "
                     "threshold L learned (signed and normalised by max(L, i, j) on a bidirectional side, "
                     "our choice)"),
        MethodOption("fire_hidden", 32, "with --{side}-fire: hidden units of FIRE's MLP (the paper: 32)"),
        MethodOption("fire_threshold", 512,
                     "with --{side}-fire: the initial threshold L (the paper: 512), learned as a multiple "
                     "of this value"),
    )
    benchmark_target = "scaling"
    variants = {"fire": {"fire": True}}
    labels = {"fire": "FIRE"}
    combined = {"fire": True}

    def is_on(self, options: Any) -> bool:
        return options.fire

    def validate(self, options: Any) -> None:
        if options.fire_hidden < 1:
            raise PositionOptionError(
                f"{options.flag('fire_hidden')} must be at least 1, got {options.fire_hidden}")
        if options.fire_threshold <= 0:
            raise PositionOptionError(
                f"{options.flag('fire_threshold')} must be positive, got {options.fire_threshold}")
        if not options.fire_threshold <= torch.finfo(torch.float32).max:
            raise PositionOptionError(
                f"{options.flag('fire_threshold')} must be at most float32's largest value (3.4e38), got "
                f"{options.fire_threshold} (an infinite threshold L normalises every distance to 0: the bias is the "
                "same for every pair, and c and L get NaN gradients)")
        if self.is_on(options):
            return
        for name, default in (("fire_hidden", 32), ("fire_threshold", 512)):
            if getattr(options, name) != default:
                raise PositionOptionError(
                    f"{options.flag(name)} {getattr(options, name)} has no effect without "
                    f"{options.flag('fire')}; add it or drop {options.flag(name)}")

    def terms(self, options: Any, layer: LayerSpec) -> List[nn.Module]:
        return [FireBias(layer.num_heads, options.fire_hidden, options.fire_threshold)]


register(FireMethod())
