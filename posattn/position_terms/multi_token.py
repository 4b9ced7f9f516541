"""Multi-token attention, MTA (Golovneva, Wang, Weston and Sukhbaatar 2025, "Multi-Token Attention", arXiv
2504.00927, sections 3.1-3.2; docs/methods.md, Multi-token attention).

Two parts of the method, on every head's logits at once (a logit-matrix transform, kind 10):

- **the key-query convolution before the softmax** (section 3.1, its masked form): per head h a ``c_q x c_k`` kernel
  ``theta_h`` slides over the matrix of logits ``A`` whose blocked entries were set to 0 (``Mask_0``: the future
  keys, the pads), and the result is masked with ``-inf`` again (``Mask_-inf``) before the softmax,

      A'_ij = sum_{a < c_q} sum_{b < c_k} theta_h[a, b] Mask_0(A)_{i - c_q + 1 + a, j - floor(c_k/2) + b}

  (zero outside the matrix): on a causal side the window covers the query and the ``c_q - 1`` queries before it,
  and along the keys a centred window (the authors' ``pad_key="both"``), which stays causal because every key after
  a query is 0 in its row; on a bidirectional side both windows are centred;
- **head mixing after the softmax** (section 3.2): the heads are split into groups of ``c_h`` consecutive heads and
  each head's weights become a learned mix of its group's, ``W'^{g c_h + n} = sum_m w_g[m, n] W^{g c_h + m}``
  (the authors' ``head_kernel_size``; the paper's main models mix all 16 heads of a layer).

Not included: the key-query convolution after the softmax and the linear head mixing before it (options of the
authors' code, beside the ones above), and the group normalisation with scalar gating of each head's output (section
3.3), which acts on the heads' outputs, not on the attention matrix: the kernel's terms end at the weights, and
the authors' code switches it apart from MTA (``group_norm``, ``add_gating``).

Initialisation as the authors' code (``init_method="identity"``): each kernel is 1 at the current query and key and
0 elsewhere, each mixing the identity, so that training starts from plain attention. Decoding: the convolution
over the query axis reads the ``c_q - 1`` rows of masked logits before a step's query, which the term caches.
"""

from typing import Any, List, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from posattn.position_context import PositionContext
from posattn.position_terms.base import LogitMatrixTransform, LogitParts, at_least_fp32, same_dtype
from posattn.position_terms.quantities import MATRIX, TABLE, Quantity
from posattn.position_terms.registry import (
    LayerSpec,
    MethodOption,
    PositionMethod,
    PositionOptionError,
    register,
)


def rows_above(rows: Tensor, history: Optional[Tensor], context: int) -> Tuple[Tensor, Tensor]:
    """``(rows with the context above them, the last context rows to cache)``: the ``context`` rows of the earlier
    queries (``history``, widened with zero columns to ``rows``' keys; zero rows before the first query) stacked
    above ``rows`` ``(batch, heads, tgt_len, src_len)``."""
    if history is None:
        above = rows.new_zeros(rows.shape[:2] + (context, rows.size(-1)))
    else:
        above = F.pad(history.to(rows.dtype), (0, rows.size(-1) - history.size(-1)))
    stacked = torch.cat([above, rows], dim=2)
    return stacked, stacked[:, :, stacked.size(2) - context :]


class MultiTokenAttention(LogitMatrixTransform):
    """MTA's key-query convolution of every head's masked logits and its head mixing of the weights (module
    docstring)."""

    def __init__(self, num_heads: int, query_kernel: int, key_kernel: int, head_group: int, causal: bool):
        super().__init__()
        self.num_heads, self.causal = num_heads, causal
        self.query_kernel, self.key_kernel, self.head_group = query_kernel, key_kernel, head_group
        kernel = torch.zeros(num_heads, 1, query_kernel, key_kernel)
        kernel[:, :, query_kernel - 1 if causal else query_kernel // 2, key_kernel // 2] = 1.0
        self.kernel = nn.Parameter(kernel)
        self.transforms_weights = head_group > 1
        self.keeps_rows = causal and query_kernel > 1
        groups = num_heads // head_group
        self.head_mixing = nn.Parameter(torch.eye(head_group).repeat(groups, 1, 1)) if head_group > 1 else None

    def extra_repr(self) -> str:
        return (f"heads={self.num_heads}, query_kernel={self.query_kernel}, key_kernel={self.key_kernel}, "
                f"head_group={self.head_group}, causal={self.causal}")

    def forward(self, logits: Tensor, ctx: PositionContext, history: Optional[Tensor],
                parts: Optional[LogitParts]) -> Tuple[Tensor, Optional[Tensor]]:
        tgt_len, src_len = logits.shape[-2:]
        padded_rows = ctx.query_padding_mask(tgt_len)[:, None, :, None]  # Mask_0 of a pad's row, which may see pads
        rows = same_dtype(logits, at_least_fp32(logits.dtype)).masked_fill(padded_rows, 0.0)
        weight = same_dtype(self.kernel, rows.dtype)
        if not self.causal:
            padding = (self.query_kernel // 2, self.key_kernel // 2)
            return F.conv2d(rows, weight, padding=padding, groups=self.num_heads), None
        if history is None and tgt_len < src_len and self.keeps_rows:
            raise ValueError(f"multi-token attention: {tgt_len} queries after {src_len - tgt_len} cached keys without "
                             "the cached rows of the earlier queries: decode with the layer's whole decoding state")
        stacked, cache = rows_above(rows, history, self.query_kernel - 1)
        out = F.conv2d(stacked, weight, padding=(0, self.key_kernel // 2), groups=self.num_heads)
        return out, (cache if self.query_kernel > 1 else None)

    def weights(self, probs: Tensor, ctx: PositionContext) -> Tensor:
        """Each group's weights mixed (module docstring)."""
        batch, heads, tgt_len, src_len = probs.shape
        grouped = probs.reshape(batch, heads // self.head_group, self.head_group, tgt_len, src_len)
        mixed = torch.einsum("bgmts,gmn->bgnts", grouped, same_dtype(self.head_mixing, probs.dtype))
        return mixed.reshape(batch, heads, tgt_len, src_len)

    def inspect(self, positions: int) -> List[Quantity]:
        """Each head's ``c_q x c_k`` kernel and each group's head mixing (no position axis: ``positions`` is
        unused)."""
        taps = (list(range(self.query_kernel)), list(range(self.key_kernel)))
        shown = [Quantity("kernels", self.kernel[:, 0].detach().float().cpu(), MATRIX,
                          "MTA key-query kernels before the softmax", axes=("query tap", "key tap"), ticks=taps)]
        if self.head_mixing is not None:  # the groups' mixings on the diagonal of one heads x heads table
            mixing = torch.block_diag(*self.head_mixing.detach().float().cpu())
            shown.append(Quantity("head_mixing", mixing, TABLE, "MTA head mixing after the softmax",
                                  axes=("from head", "to head")))
        return shown


class MultiTokenAttentionMethod(PositionMethod):
    name = "multi-token-attention"
    citation = "Golovneva et al. 2025, sections 3.1-3.2"
    options = (
        MethodOption("multi_token_attention", False,
                     "multi-token attention in every layer of the {what} (Golovneva et al. 2025, MTA): a key-query "
                     "convolution of each head's logits before the softmax (blocked entries 0 before it, -inf "
                     "after it) and a learned mixing of groups of heads' weights after the softmax; starts as plain "
                     "attention (identity kernels)"),
        MethodOption("mta_query_kernel", 6, "c_q, the query taps of MTA's key-query convolution (the paper's 6); on "
                     "a bidirectional side odd (a centred window)"),
        MethodOption("mta_key_kernel", 11, "c_k, the key taps of MTA's key-query convolution, odd (a centred "
                     "window; the paper's 11)"),
        MethodOption("mta_head_group", 0, "c_h, the heads of each group that MTA's head mixing mixes after the "
                     "softmax: it divides the heads; 0 = all the layer's heads (the paper's 16 of 16), 1 = no mixing"),
    )
    benchmark_target = "post_softmax"
    variants = {"mta": {"multi_token_attention": True, "mta_query_kernel": 3, "mta_key_kernel": 3}}
    labels = {"mta": "MTA (3 x 3)"}
    combined = {"multi_token_attention": True, "mta_query_kernel": 3, "mta_key_kernel": 3}

    def is_on(self, options: Any) -> bool:
        return bool(options.multi_token_attention)

    def validate(self, options: Any) -> None:
        query, key, group = options.mta_query_kernel, options.mta_key_kernel, options.mta_head_group
        if not self.is_on(options):
            for name, default in (("mta_query_kernel", 6), ("mta_key_kernel", 11), ("mta_head_group", 0)):
                if getattr(options, name) != default:
                    raise PositionOptionError(f"{options.flag(name)} {getattr(options, name)} has no effect without "
                                              f"{options.flag('multi_token_attention')}; add it or drop "
                                              f"{options.flag(name)}")
            return
        if query < 1 or (not options.causal and query % 2 == 0):
            raise PositionOptionError(
                f"{options.flag('mta_query_kernel')} must be a positive number of query taps"
                f"{', odd on a bidirectional side (a centred window: 5, 7, ...)' if not options.causal else ''}, "
                f"got {query}")
        if key < 1 or key % 2 == 0:
            raise PositionOptionError(f"{options.flag('mta_key_kernel')} must be an odd positive number of key taps "
                                      f"(a centred window: 3, 5, ..., the paper's 11), got {key}")
        if query == 1 and key == 1 and group == 1:
            raise PositionOptionError(
                f"{options.flag('multi_token_attention')} with a 1 x 1 kernel and no head mixing scales each logit "
                f"alone and sees no neighbour: raise {options.flag('mta_query_kernel')} or "
                f"{options.flag('mta_key_kernel')}, or mix heads ({options.flag('mta_head_group')})")
        if group < 0:
            raise PositionOptionError(f"{options.flag('mta_head_group')} must be 0 (all heads), 1 (no mixing) or a "
                                      f"group size that divides the heads, got {group}")

    def terms(self, options: Any, layer: LayerSpec) -> List[nn.Module]:
        group = options.mta_head_group or layer.num_heads
        if layer.num_heads % group:
            raise PositionOptionError(f"{options.flag('mta_head_group')} {group} does not divide the layer's "
                                      f"{layer.num_heads} heads: give a divisor, or 0 for all heads")
        return [MultiTokenAttention(layer.num_heads, options.mta_query_kernel, options.mta_key_kernel, group,
                                    options.causal)]


register(MultiTokenAttentionMethod())
