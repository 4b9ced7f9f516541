"""Selective attention (Leviathan, Kalman and Matias 2024, "Selective Attention Improves Transformer", arXiv
2410.02703, section 3; outside code: x-transformers' ``selective_attn`` in ``x_transformers/attend.py``).

A token may decide that a later token no longer needs an earlier one: query k *selects* key j with the score
``S_kj = ReLU(l_kj)``, ``l`` the masked logits of one head (head 0), and the logit of key j for query i, in every
head, is lowered by what the earlier queries selected,

    F_ij = sum_{k < i} S_kj,      logits_ij <- logits_ij - F_ij,

with no query selecting itself (``S_kk = 0``) nor the first token (``S_k0 = 0``: the paper keeps the BOS token
attendable), as the paper's listing and x-transformers compute it. ``F`` needs every earlier row of head 0's
logits and changes every head's: a :class:`~posattn.position_terms.base.LogitMatrixTransform` (every head's masked
logits at once), which takes the explicit path (no pointwise form: a logit's bias is a sum over other queries'
logits); incremental decoding caches ``sum_k S_kj`` per key as the term's rows.

Choices:

- **the selecting head's logits** are head 0's after every earlier step of the kernel (the additive biases, the
  masks, CoPE's term), as x-transformers takes them: a key the query may not see (the future, a pad) scores 0
  (``ReLU(-inf)``); the paper's "memory reduction" (pruning) is not part of it;
- **the first token** is each sentence's first real token (token position 0), whatever the padding; a pad's query
  row selects nothing;
- ``S`` and ``F`` in fp32 at least (fp64 for a double model), with their gradient (the paper stops none);
- **causal sides only** (the decoder, the language model): F sums over earlier queries, which a bidirectional
  encoder does not order (x-transformers refuses it too); the option exists on the decoder only;
- **decoding**: the cache keeps ``sum_k S_kj`` of every query so far, per key (batch first, reordered with the
  keys by beam search); a step's rows continue from it, so decoding equals the full pass. x-transformers' own
  function does not: with cached keys it zeroes the selection of every cached key and of the first query's key
  rather than the first token's.
"""

from typing import Any, List, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from posattn.position_context import PositionContext
from posattn.position_terms.base import LogitMatrixTransform, LogitParts, at_least_fp32, same_dtype
from posattn.position_terms.quantities import Quantity
from posattn.position_terms.registry import LayerSpec, MethodOption, PositionMethod, register

#: the head whose logits select (the paper's and x-transformers' choice)
SELECTING_HEAD = 0


class SelectionBias(LogitMatrixTransform):
    """``logits[b, h, i, j] -= F[b, i, j]``, the selection scores of the earlier queries (module docstring)."""

    #: the sums of the earlier queries' selection scores are the decoding state
    keeps_rows = True

    def selection_scores(self, logits: Tensor, ctx: PositionContext) -> Tensor:
        """``(batch, tgt_len, src_len)``: ``S_kj`` of the current queries (the last ``tgt_len`` of ``src_len``
        tokens) for head 0's ``logits`` (0 where a query may not see a key), zero on the diagonal, at the first token
        and in a pad's row; in fp32 at least."""
        tgt_len, src_len = logits.shape[-2:]
        head = logits[:, SELECTING_HEAD]
        scores = torch.relu(same_dtype(head, at_least_fp32(head.dtype)))
        first_token = ctx.query_key_positions(tgt_len, src_len)[1] == 0  # (batch or 1, src_len)
        self_pairs = ctx.relative_distances(tgt_len, src_len) == 0  # (tgt_len, src_len)
        unselected = (self_pairs[None] | first_token[:, None, :]
                      | ctx.query_padding_mask(tgt_len)[:, :, None])
        return scores.masked_fill(unselected, 0.0)

    def forward(self, logits: Tensor, ctx: PositionContext, history: Optional[Tensor],
                parts: Optional[LogitParts]) -> Tuple[Tensor, Tensor]:
        """Every head's ``logits`` less ``F`` (in fp32 at least), and the rows to cache: ``sum_k S_kj`` over every
        query so far, ``(batch, src_len)`` (``history``: that sum over the queries of the first ``src_len - tgt_len``
        tokens, from the previous decoding step)."""
        tgt_len, src_len = logits.shape[-2:]
        if history is None and tgt_len < src_len:
            raise ValueError(f"selective attention: {tgt_len} queries after {src_len - tgt_len} cached keys without "
                             "the sums of the cached queries' selection scores (the decoding state)")
        scores = self.selection_scores(logits, ctx)
        before = F.pad(scores.cumsum(dim=1)[:, :-1], (0, 0, 1, 0))  # sum over the current queries before row i
        carried = torch.zeros_like(scores[:, 0])
        if history is not None:
            carried = F.pad(same_dtype(history, scores.dtype), (0, src_len - history.size(-1)))
            before = before + carried[:, None, :]
        return same_dtype(logits, scores.dtype) - before[:, None], carried + scores.sum(dim=1)

    def inspect(self, positions: int) -> List[Quantity]:
        """Nothing learned: the selection scores depend on the tokens."""
        return []


class SelectiveAttentionMethod(PositionMethod):
    name = "selective"
    citation = "Leviathan et al. 2024, section 3"
    sides = ("decoder",)
    options = (
        MethodOption("selective_attention", False,
                     "selective attention in every layer of the {what} (Leviathan et al. 2024): query k selects "
                     "key j with S_kj = ReLU(head 0's logit), never itself nor the first token, and every head's "
                     "logit of key j for query i is lowered by sum_{{k<i}} S_kj"),
    )
    benchmark_target = "scaling"
    variants = {"selective": {"selective_attention": True}}
    labels = {"selective": "Selective"}
    combined = {"selective_attention": True}

    def is_on(self, options: Any) -> bool:
        return options.selective_attention

    def terms(self, options: Any, layer: LayerSpec) -> List[nn.Module]:
        return [SelectionBias()]


register(SelectiveAttentionMethod())
