"""Stick-breaking attention (Tan et al. 2025, "Scaling Stick-Breaking Attention: An Efficient Implementation and
In-depth Study", ICLR 2025, arXiv 2410.17980, section 2), the softmax replaced.

Query i breaks a stick of length 1 over its earlier keys, the nearest first: key j takes the fraction
``beta_ij = sigmoid(z_ij)`` of what the keys between them left,

    A_ij = beta_ij prod_{j < l < i} (1 - beta_il),     j < i,

``z_ij`` the logit after every earlier step of the kernel (``q_i . k_j / sqrt(d_h)`` with nothing else on). The
weights are not normalised: the stick left over, ``1 - sum_j A_ij = prod_{j < i} (1 - beta_ij)``, goes to the
query's own value, as the authors' code does (``stickbreaking_attention``'s tests add ``rem * v`` to the kernel's
output, ``rem = 1 - sum_j A_ij``; their kernel's default ``attend_current=False`` keeps key i out of the stick). So
the output is ``sum_{j < i} A_ij v_j + (1 - sum_j A_ij) v_i``, and the weights the kernel multiplies the values
with are ``A`` with the remainder on the diagonal (each row sums to 1).

How it is computed, in log space as the authors do (their ``sb_ref.py``), in fp32 at least whatever the model's
precision: ``log A_ij = log sigmoid(z_ij) - sum_{j < l < i} softplus(z_il)`` (``log(1 - sigmoid z) =
-softplus z``), the sum a cumulative sum over the keys from the query backwards (the nearest keys' sums are the
short ones), and the remainder ``exp(-sum_{j < i} softplus(z_ij))`` rather than ``1 - sum_j A_ij`` (the same
number, without the cancellation). A key the query may not see (a pad, a later key) is not in the stick.

Choices:

- **no position embedding** is needed: the order of the keys is in the break itself; the paper's models have
  none (``--no-token-positional-embeddings``); other methods' logit terms (RoPE, ALiBi, FoX, CoPE...) still
  apply to ``z`` before the break, but a transform of the softmax's weights (the convolutions, MTA's head mixing) is
  refused: it transforms the softmax matrix this method replaces;
- **causal sides only**: the break runs from the query back over the earlier keys; a bidirectional side has no
  nearest-first order over keys on both sides (docs/methods.md says what one would be);
- **incremental decoding** needs nothing beyond the cached keys and values: a query's weights are its own row;
- **the explicit path** only (the kernel's): the break needs each query's whole row. Its gradient is written out
  (:class:`StickBreaking`), so that the backward pass keeps the logits and the weights alone. The authors' Triton
  kernel (``stickbreaking_attention.sb_attn``) fuses it on CUDA; it is not a dependency here.

docs/methods.md, "Stick-breaking attention", says what the authors' other codes do with the remainder.
"""

from dataclasses import dataclass
from typing import Any, List, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from posattn.position_context import PositionContext, Preparation
from posattn.position_terms.base import AttentionNormalisation, at_least_fp32, same_dtype
from posattn.position_terms.quantities import Quantity
from posattn.position_terms.registry import LayerSpec, MethodOption, PositionMethod, PositionOptionError, register


@dataclass(frozen=True)
class EarlierAndOwnKeys(Preparation):
    """``(tgt_len, src_len)`` bool twice: the keys before each of the last ``tgt_len`` of ``src_len`` queries, and
    each query's own key."""

    tgt_len: int
    src_len: int

    def build(self, ctx: PositionContext) -> Tuple[Tensor, Tensor]:
        distances = ctx.relative_distances(self.tgt_len, self.src_len)
        return distances > 0, distances == 0


def stick_and_own(logits: Tensor, earlier: Tensor, own: Tensor) -> Tuple[Tensor, Tensor, Tensor]:
    """The keys in each query's stick (visible and before it), its own key where visible, and the logits in the stick
    (0 elsewhere), in fp32 at least, for ``logits`` ``(..., tgt_len, src_len)`` (``-inf`` where a query may not see a
    key)."""
    visible = logits != float("-inf")
    in_stick = visible & earlier
    z = same_dtype(logits, at_least_fp32(logits.dtype)).masked_fill(~in_stick, 0.0)
    return in_stick, visible & own, z


def stick_breaking_weights(logits: Tensor, earlier: Tensor, own: Tensor) -> Tensor:
    """The weights of stick-breaking attention for ``logits`` ``(..., tgt_len, src_len)`` (``-inf`` where a query
    may not see a key): ``A_ij`` on the visible keys before the query (``earlier``), the remainder of the stick on
    the query's own key (``own``, where visible), 0 elsewhere; in fp32 at least."""
    in_stick, own_seen, z = stick_and_own(logits, earlier, own)
    log_kept = (-F.softplus(z)).masked_fill(~in_stick, 0.0)
    kept_from = log_kept.flip(-1).cumsum(-1).flip(-1)  # sum over the stick's keys l >= j
    kept_after = F.pad(kept_from[..., 1:], (0, 1))  # over l > j: the keys between j and the query
    weights = torch.exp(F.logsigmoid(z) + kept_after).masked_fill(~in_stick, 0.0)
    remainder = torch.exp(kept_from[..., :1])  # prod (1 - beta) over the whole stick
    return torch.where(own_seen, remainder, weights)


class StickBreaking(torch.autograd.Function):
    """:func:`stick_breaking_weights` with its gradient written out, so that the backward pass keeps the logits (in
    their dtype) and the weights alone, not the fp32 intermediates autograd would keep (20 bytes per (query, key)
    entry down to 6 for bf16 logits). With ``A_j`` a row's weights in the stick, ``R`` its remainder, ``s_j =
    sigmoid(z_j)`` and ``g`` the incoming gradient, ``dz_j = g_j A_j (1 - s_j) - s_j (sum_{l < j} g_l A_l + g_R R)``
    (``log A_j = log s_j + sum_{l > j} log(1 - s_l)``, ``log R = sum_l log(1 - s_l)``)."""

    @staticmethod
    def forward(ctx: Any, logits: Tensor, earlier: Tensor, own: Tensor) -> Tensor:
        weights = stick_breaking_weights(logits, earlier, own)
        ctx.save_for_backward(logits, weights, earlier, own)
        return weights

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> Tuple[Optional[Tensor], None, None]:
        logits, weights, earlier, own = ctx.saved_tensors
        in_stick, own_seen, z = stick_and_own(logits, earlier, own)
        grad = same_dtype(grad, weights.dtype)
        spent = (grad * weights).masked_fill_(~in_stick, 0.0)  # g_j A_j
        from_remainder = (grad * weights).masked_fill_(~own_seen, 0.0).sum(-1, keepdim=True)  # g_R R
        before = spent.cumsum(-1).sub_(spent).add_(from_remainder)  # sum_{l < j} g_l A_l + g_R R
        broken = torch.sigmoid(z)
        dz = spent.mul_(1.0 - broken).sub_(broken.mul_(before)).masked_fill_(~in_stick, 0.0)
        return same_dtype(dz, logits.dtype), None, None


class StickBreakingNormalisation(AttentionNormalisation):
    """Stick-breaking attention's weights in place of the softmax (module docstring); learns nothing."""

    def forward(self, logits: Tensor, ctx: PositionContext) -> Tensor:
        tgt_len, src_len = logits.shape[-2:]
        earlier, own = ctx.prepared(EarlierAndOwnKeys(tgt_len, src_len))
        return StickBreaking.apply(logits, earlier, own)

    def inspect(self, positions: int) -> List[Quantity]:
        return []


class StickBreakingMethod(PositionMethod):
    name = "stick-breaking"
    citation = "Tan et al. 2025, section 2"
    sides = ("decoder",)
    options = (
        MethodOption("stick_breaking", False,
                     "stick-breaking attention in every layer of the {what} (Tan et al. 2025) in place of the "
                     "softmax: key j < i takes A_ij = sigmoid(z_ij) prod_{{j<l<i}} (1 - sigmoid(z_il)) of query i, "
                     "the nearest key first, and the stick left over goes to the query's own value (the paper's "
                     "models have no position embedding: --no-token-positional-embeddings)"),
    )
    benchmark_target = "post_softmax"
    variants = {"stick-breaking": {"stick_breaking": True}}
    labels = {"stick-breaking": "Stick-breaking"}

    def is_on(self, options: Any) -> bool:
        return options.stick_breaking

    def validate(self, options: Any) -> None:
        if not self.is_on(options):
            return
        if options.conv_attention != "none":
            raise PositionOptionError(
                f"{options.flag('stick_breaking')} replaces the softmax whose matrix {options.flag('conv_attention')} "
                f"{options.conv_attention} convolves; drop one of them")
        if options.multi_token_attention and options.mta_head_group != 1:
            raise PositionOptionError(
                f"{options.flag('stick_breaking')} replaces the softmax whose weights "
                f"{options.flag('multi_token_attention')} mixes across heads; add {options.flag('mta_head_group')} 1 "
                "(its key-query convolution alone, on the logits) or drop one of them")
        if options.attention_kernel == "flex":
            raise PositionOptionError(
                f"{options.flag('attention_kernel')} flex: {options.flag('stick_breaking')} computes each weight from "
                "the query's whole row of logits (no pointwise form); use auto or explicit")

    def terms(self, options: Any, layer: LayerSpec) -> List[nn.Module]:
        return [StickBreakingNormalisation()]


register(StickBreakingMethod())
