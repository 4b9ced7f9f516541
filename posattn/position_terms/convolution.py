"""Convolved attention (Dufter et al. 2020, section 2.5; docs/methods.md, Convolved attention).

Applied to the post-softmax matrix ``S = softmax(A)`` per head, followed by ReLU and not
renormalised: ``A' = ReLU(conv(S))``, head output ``A' V`` (the ReLU is in the authors' released code).

Padding contributes nothing: the kernel hands over ``S`` with zeros wherever a query may not see a key
or the query row is a pad, and the blocked entries are zeroed again after the convolution. On a causal
side the window along the query axis covers only the current and the ``k - 1`` earlier rows; in
incremental decoding those earlier rows come from the cache (``history``).

The paper gives no initialisation; the authors' released code builds the convolutions with Keras'
defaults, glorot-uniform filters and a zero bias (our default, ``glorot``); ``pytorch`` keeps
PyTorch's default convolution initialisation (kaiming-uniform filters, a bias uniform in
``+-1/sqrt(fan_in)``, e.g. +-0.33 for a 3 x 3 filter: large beside attention weights of about 1/T).
"""

import contextlib
import logging
from dataclasses import dataclass
from typing import Any, ContextManager, List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from posattn.position_context import PositionContext, Preparation
from posattn.position_terms.base import (
    PostSoftmaxTransform,
    check_length,
    check_loaded_positions,
    glorot_,
    same_dtype,
)
from posattn.position_terms.quantities import BARS, CURVE, MATRIX, Quantity
from posattn.position_terms.registry import (
    LayerSpec,
    MethodOption,
    PositionMethod,
    PositionOptionError,
    register,
)

logger = logging.getLogger(__name__)

#: query rows per block of the causal 1d convolution: a block reads and writes only the key columns
#: its rows can see, which skips about 60% of the products of a causal 512 x 512 square
CAUSAL_BLOCK_ROWS = 64


def _widen(rows: Tensor, probs: Tensor) -> Tensor:
    """Cached rows of earlier steps, zero-padded on the right to the key columns of ``probs``."""
    return F.pad(rows.to(probs.dtype), (0, probs.size(-1) - rows.size(-1)))


def _causal_rows(probs: Tensor, history: Optional[Tensor], context: int) -> Tuple[Tensor, int, Tensor]:
    """What a causal convolution over query rows reads: ``(rows, top, cache)``. Without ``history``
    (a full pass or the first decoding step) the rows are ``probs`` with ``top = context`` zero rows
    of padding above them; in incremental decoding the ``context`` cached rows of the earlier steps,
    widened to ``probs``' key columns, stacked above ``probs`` (``top = 0``). ``cache``: the last
    ``context`` rows, zeros before the first query, for the next step."""
    if history is not None:
        rows = torch.cat([_widen(history, probs), probs], dim=2)
        return rows, 0, rows[:, :, rows.size(2) - context :]
    cache = probs
    if probs.size(2) < context:
        cache = torch.cat([probs.new_zeros(probs.shape[:2] + (context, probs.size(-1))), probs], dim=2)
    return probs, context, cache[:, :, cache.size(2) - context :]


def _rectify(out: Tensor, blocked: Optional[Tensor]) -> Tensor:
    """``ReLU(out)`` with blocked entries zeroed, in place (the convolution's backward does not need
    its output)."""
    if blocked is not None:
        out = out.masked_fill_(blocked, 0.0)
    return out.relu_()


def decoding_step_kernel(step: bool) -> ContextManager:
    """For the k rows of a decoding step on the CPU, PyTorch's own convolution: oneDNN's costs more to set
    up than to run on so few rows (a 2d step took twice as long; one step of a 2-layer language model 7%
    longer in all)."""
    return torch.backends.mkldnn.flags(enabled=False) if step else contextlib.nullcontext()


def initialise(conv: nn.Module, init: str, fan_in: int, fan_out: int) -> None:
    """``glorot``: filters glorot-uniform with one head's fans, bias zero (Keras' ``Conv1D`` /
    ``Conv2D`` defaults, as the authors' code); ``pytorch``: left as PyTorch drew them."""
    if init == "glorot":
        glorot_(conv.weight, fan_in, fan_out, "uniform")
        nn.init.zeros_(conv.bias)


class ConvolvedAttention2d(PostSoftmaxTransform):
    """One k x k filter plus bias per head over the (query, key) matrix, 'same' padding."""

    def __init__(self, num_heads: int, kernel_size: int, causal: bool, init: str = "glorot"):
        super().__init__()
        self.kernel_size = kernel_size
        self.causal = causal
        self.conv = nn.Conv2d(num_heads, num_heads, kernel_size, groups=num_heads)
        initialise(self.conv, init, kernel_size ** 2, kernel_size ** 2)  # one channel in and out

    def forward(
        self, probs: Tensor, blocked: Optional[Tensor], ctx: PositionContext, history: Optional[Tensor]
    ) -> Tuple[Tensor, Optional[Tensor]]:
        k, half = self.kernel_size, self.kernel_size // 2

        def convolve(rows: Tensor, query_padding: int) -> Tensor:
            weight, bias = self.conv.weight.to(rows.dtype), self.conv.bias.to(rows.dtype)
            return F.conv2d(rows, weight, bias, padding=(query_padding, half), groups=self.conv.groups)

        if not self.causal:
            return _rectify(convolve(probs, half), blocked), None
        rows, top, cache = _causal_rows(probs, history, k - 1)
        with decoding_step_kernel(history is not None and rows.device.type == "cpu"):
            out = convolve(rows, top)[:, :, : probs.size(2)]  # zero rows above the first query: the padding
        return _rectify(out, blocked), cache

    def inspect(self, positions: int) -> List[Quantity]:
        """The k x k filter and the bias of each head (no position axis: ``positions`` is unused)."""
        taps = (list(range(self.kernel_size)),) * 2
        return [Quantity("filters", self.conv.weight[:, 0].detach().cpu(), MATRIX, "2d attention filters",
                         axes=("query tap", "key tap"), ticks=taps),
                Quantity("bias", self.conv.bias.detach().cpu(), BARS, "2d attention filter bias")]


class KeyChannelConvolution(torch.autograd.Function):
    """The 1d attention convolution as batched matrix products, block by block of query rows.

    ``out[b, h, i, c] = sum_a sum_j rows[b, h, i + a, j] * weight[h, a, j, c]``, where ``rows`` is
    ``probs`` with ``top`` zero rows above and ``bottom`` below it. ``blocks`` lists
    ``(first_row, end_row, width)``: those output rows are computed from, and into, the first
    ``width`` key columns only (the others stay zero), so a causal square skips the columns that its
    rows cannot see. Query rows and batch are laid out as one axis, ``row * batch + b``, so that a
    shift of the window by ``a`` rows is a shift of ``a * batch`` matrix rows and every product is
    one ``baddbmm`` over the heads. Only ``probs`` (the softmax's own output) and the weights are
    kept for the backward pass.
    """

    @staticmethod
    def _rows(probs: Tensor, top: int, bottom: int) -> Tensor:
        """``(heads, (top + rows + bottom) * batch, columns)``, zero rows above and below."""
        batch, heads, length, width = probs.shape
        rows = probs.new_zeros(heads, top + length + bottom, batch, width)
        rows[:, top : top + length] = probs.permute(1, 2, 0, 3)
        return rows.view(heads, -1, width)

    @staticmethod
    def forward(ctx, probs: Tensor, weight: Tensor, top: int, bottom: int,
                blocks: Sequence[Tuple[int, int, int]]) -> Tensor:
        batch, heads, length, width = probs.shape
        kernel = weight.size(1)
        queries = top + length + bottom - kernel + 1
        rows = KeyChannelConvolution._rows(probs, top, bottom)
        out = probs.new_zeros(heads, queries * batch, width)
        for first, end, cols in blocks:
            target = out[:, first * batch : end * batch, :cols]
            for a in range(kernel):
                source = rows[:, (first + a) * batch : (end + a) * batch, :cols]
                target.baddbmm_(source, weight[:, a, :cols, :cols])
        ctx.save_for_backward(probs, weight)
        ctx.layout = (top, bottom, tuple(blocks))
        out = out.view(heads, queries, batch, width).permute(2, 0, 1, 3)
        return out.clone(memory_format=torch.contiguous_format)  # a tensor of its own, never a view

    @staticmethod
    def backward(ctx, grad: Tensor):
        probs, weight = ctx.saved_tensors
        top, bottom, blocks = ctx.layout
        batch, heads, length, width = probs.shape
        kernel = weight.size(1)
        rows = KeyChannelConvolution._rows(probs, top, bottom)
        grad_out = grad.permute(1, 2, 0, 3).reshape(heads, -1, width)
        grad_rows = torch.zeros_like(rows)
        grad_weight = torch.zeros_like(weight)
        for first, end, cols in blocks:
            g = grad_out[:, first * batch : end * batch, :cols]
            for a in range(kernel):
                span = slice((first + a) * batch, (end + a) * batch)
                grad_weight[:, a, :cols, :cols].baddbmm_(rows[:, span, :cols].transpose(1, 2), g)
                grad_rows[:, span, :cols].baddbmm_(g, weight[:, a, :cols, :cols].transpose(1, 2))
        grad_probs = grad_rows.view(heads, -1, batch, width)[:, top : top + length].permute(2, 0, 1, 3)
        return grad_probs, grad_weight, None, None, None


def decoding_step(rows: Tensor, weight: Tensor) -> Tensor:
    """:class:`KeyChannelConvolution`'s one output row of a decoding step, ``(batch, heads, 1, width)``,
    from the ``k`` rows ``(batch, heads, k, width)`` above and at the query: ``sum_a rows[:, :, a] @
    weight[:, a]``, one batched product per tap over the heads."""
    taps = rows.permute(2, 1, 0, 3)  # k x heads x batch x width
    out = torch.bmm(taps[0], weight[:, 0])
    for a in range(1, weight.size(1)):
        out.baddbmm_(taps[a], weight[:, a])
    return out.permute(1, 0, 2).unsqueeze(2)


def causal_blocks(queries: int, width: int, block_rows: int) -> List[Tuple[int, int, int]]:
    """Blocks of query rows with the key columns they can see: query i is key position
    ``width - queries + i`` (the last ``queries`` of ``width`` tokens)."""
    return [(first, min(queries, first + block_rows), min(width, width - queries + first + block_rows))
            for first in range(0, queries, block_rows)]


@dataclass(frozen=True)
class ColumnShift(Preparation):
    """``(index, outside)``, both ``(batch, width)``: the column ``c + direction * left_pads[b]`` that
    column c reads, clamped into range, and where it was out of range."""

    direction: int
    width: int

    def build(self, ctx: PositionContext) -> Tuple[Tensor, Tensor]:
        columns = torch.arange(self.width, device=ctx.padding_mask.device)[None, :] + self.direction * ctx.left_pads[:, None]
        index = columns.clamp(0, self.width - 1)
        return index, index != columns


class ConvolvedAttention1d(PostSoftmaxTransform):
    """Per head a Conv1d whose t input channels are the key columns (zero-padded to t), sliding
    with width k along the query axis, t output channels (one per output column), with bias.

    Key columns are channels, so they are indexed by *token* position: a left-padded sentence is
    shifted to column 0 before the convolution and back after it. Channels beyond the batch's length
    are zero in and blocked out, so only the first ``length`` rows and columns of each filter are
    used (:class:`KeyChannelConvolution`); the parameters keep ``nn.Conv1d``'s layout.
    """

    def __init__(self, num_heads: int, kernel_size: int, causal: bool, max_positions: int,
                 init: str = "glorot"):
        super().__init__()
        self.kernel_size = kernel_size
        self.causal = causal
        self.num_heads = num_heads
        self.max_positions = max_positions
        self.block_rows = CAUSAL_BLOCK_ROWS
        self.conv = nn.Conv1d(
            num_heads * max_positions, num_heads * max_positions, kernel_size, groups=num_heads
        )
        initialise(self.conv, init, max_positions * kernel_size, max_positions * kernel_size)  # t channels

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        loaded = state_dict.get(prefix + "conv.weight")
        check_loaded_positions(state_dict, prefix + "conv.weight", self.conv.weight.shape,
                               "the 1d attention convolution's t key channels", self.max_positions,
                               loaded.size(1) if loaded is not None else 0)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    @staticmethod
    def _shift_columns(matrix: Tensor, ctx: PositionContext, direction: int) -> Tensor:
        """``out[b, ..., c] = matrix[b, ..., c + direction * left_pads[b]]``, zero where that is out
        of range: ``direction`` 1 moves each sentence to column 0, -1 back. The index is this batch's
        geometry, built once for every layer."""
        index, outside = ctx.prepared(ColumnShift(direction, matrix.size(-1)))
        shifted = matrix.gather(-1, index[:, None, None, :].expand(matrix.shape))
        return shifted.masked_fill(outside[:, None, None, :], 0.0)

    def _weights(self, width: int, dtype: torch.dtype) -> Tensor:
        """Weights ``(heads, k, width, width)`` as ``[h, a, input column, output column]`` of the
        first ``width`` channels."""
        t, k = self.max_positions, self.kernel_size
        weight = self.conv.weight.view(self.num_heads, t, t, k)[:, :width, :width]
        return weight.permute(0, 3, 2, 1).contiguous().to(dtype)

    def forward(
        self, probs: Tensor, blocked: Optional[Tensor], ctx: PositionContext, history: Optional[Tensor]
    ) -> Tuple[Tensor, Optional[Tensor]]:
        batch, heads, tgt_len, src_len = probs.shape
        check_length(src_len, self.max_positions, "the 1d attention convolution (t key channels)")
        left_padded = ctx.left_pads is not None
        if left_padded:
            probs = self._shift_columns(probs, ctx, 1)
        weight = ctx.sequence_table(self.table_key(probs.dtype), src_len,
                                    lambda n: self._weights(n, probs.dtype))
        if weight is None:
            weight = self._weights(src_len, probs.dtype)
        else:  # incremental decoding: the sequence's filters, their first src_len columns
            weight = weight[:, :, :src_len, :src_len]
        bias = same_dtype(self.conv.bias.view(self.num_heads, self.max_positions)[:, :src_len], probs.dtype)
        k, cache = self.kernel_size, None
        if not self.causal:
            out = KeyChannelConvolution.apply(probs, weight, k // 2, k // 2, [(0, tgt_len, src_len)])
        else:
            rows, top, cache = _causal_rows(probs, history, k - 1)
            if history is not None and tgt_len == 1:  # a decoding step: k products, nothing saved
                out = decoding_step(rows, weight)
            else:
                blocks = ([(0, tgt_len, src_len)] if torch.compiler.is_compiling()  # one graph for all lengths
                          else causal_blocks(tgt_len, src_len, self.block_rows))
                out = KeyChannelConvolution.apply(rows, weight, top, 0, blocks)
        out = out.add_(bias[None, :, None, :])
        if left_padded:
            out = self._shift_columns(out, ctx, -1)
        return _rectify(out, blocked), cache

    def inspect(self, positions: int) -> List[Quantity]:
        """Per head and query tap a, the weights from input to output key column of the first
        n = min(positions, t) columns (heads x k x output x input), and the output columns' bias."""
        n, t, k = min(positions, self.max_positions), self.max_positions, self.kernel_size
        weight = self.conv.weight.view(self.num_heads, t, t, k)[:, :n, :n].permute(0, 3, 1, 2)
        bias = self.conv.bias.view(self.num_heads, t)[:, :n]
        return [Quantity("filters", weight.detach().cpu(), MATRIX, f"1d attention filters (first {n} columns)",
                         axes=("output key column", "input key column"),
                         panels=tuple(f"query tap {a}" for a in range(k))),
                Quantity("bias", bias.detach().cpu(), CURVE, "1d attention bias per output key column",
                         axes=("output key column", "bias"), ticks=(list(range(n)),))]


class ConvolvedAttentionMethod(PositionMethod):
    name = "conv-attention"
    citation = "Dufter et al. 2020, section 2.5"
    options = (
        MethodOption("conv_attention", "none",
                     "convolve the post-softmax attention matrix in every layer of the {what} (Dufter et "
                     "al. 2020, 2.5): 1d (+Conv; t key channels, t = {t}) or 2d (+Conv2d; one k x k "
                     "filter per head)", choices=("none", "1d", "2d")),
        MethodOption("conv_attention_kernel", 3, "odd width k of the attention convolution"),
        MethodOption("conv_attention_init", "glorot",
                     "initialisation of the attention convolution: glorot (glorot-uniform filters, zero "
                     "bias: Keras' defaults, as the authors' released code) or pytorch (PyTorch's default "
                     "convolution initialisation, bias included)", choices=("glorot", "pytorch")),
    )
    benchmark_target = "post_softmax"
    variants = {
        "conv-2d": {"conv_attention": "2d"},  # first: the benchmark's one row of the method (scales with length)
        "conv-2d-k5": {"conv_attention": "2d", "conv_attention_kernel": 5},
        "conv-1d": {"conv_attention": "1d"},
    }
    labels = {"conv-1d": "+Conv", "conv-2d": "+Conv2d", "conv-2d-k5": "+Conv2d (k=5)"}
    #: the 2d filter: the 1d one is a second post-softmax transform, one per layer at most
    combined = {"conv_attention": "2d"}

    def is_on(self, options: Any) -> bool:
        return options.conv_attention != "none"

    def validate(self, options: Any) -> None:
        k = options.conv_attention_kernel
        if k < 1 or k % 2 == 0:
            raise PositionOptionError(
                f"{options.flag('conv_attention_kernel')} must be an odd positive width (3, 5, ...), got {k}")
        if k == 1 and options.conv_attention == "2d":
            raise PositionOptionError(
                f"{options.flag('conv_attention_kernel')} must be at least 3 with {options.flag('conv_attention')} "
                f"2d, got 1 (a 1 x 1 filter maps each attention weight alone, ReLU(w S + b): it sees no neighbour "
                "and no position)")
        if not self.is_on(options):
            for name, default in (("conv_attention_kernel", 3), ("conv_attention_init", "glorot")):
                if getattr(options, name) != default:
                    raise PositionOptionError(
                        f"{options.flag(name)} {getattr(options, name)} has no effect without "
                        f"{options.flag('conv_attention')} 1d|2d; add it or drop {options.flag(name)}")
        if options.conv_attention == "1d" and options.max_positions > 256:
            logger.warning("%s 1d builds a t x t x k filter bank per head with t = %s = %d; consider a smaller %s",
                           options.flag("conv_attention"), options.max_positions_option,
                           options.max_positions, options.max_positions_option)

    def needs_max_positions(self, options: Any) -> bool:
        return options.conv_attention == "1d"

    def terms(self, options: Any, layer: LayerSpec) -> List[nn.Module]:
        k, init = options.conv_attention_kernel, options.conv_attention_init
        if options.conv_attention == "2d":
            return [ConvolvedAttention2d(layer.num_heads, k, options.causal, init)]
        return [ConvolvedAttention1d(layer.num_heads, k, options.causal, options.max_positions, init)]


register(ConvolvedAttentionMethod())
