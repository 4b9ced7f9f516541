"""A direct, loop-by-loop re-implementation of the methods in docs/methods.md, one sentence at a time.

Deliberately naive (Python loops over heads, queries and keys; no padding tricks): it works on the
real tokens of one sentence only, so agreeing with it also shows that padding changes nothing.
"""

import math
from typing import Any, Callable, Dict, Optional, Tuple

import torch
from torch import Tensor

from fairseq_posattn.modules.attention import PositionAwareMultiheadAttention
from fairseq_posattn.modules.position_terms.alibi import LinearDistanceBias
from fairseq_posattn.modules.position_terms.direct import DirectAbsolutePositionBias, DirectRelativePositionBias
from fairseq_posattn.modules.position_terms.t5_bias import T5RelativeBias


def _f_distance(x: float, v: float) -> float:
    """DA-Transformer's f(x; v) = (1 + exp(v)) / (1 + exp(v - x)), in the paper's form."""
    return (1 + math.exp(v)) / (1 + math.exp(v - x))


def _t5_bucket(distance: int, buckets: int, max_distance: int, bidirectional: bool) -> int:
    """T5's bucket of a query-minus-key distance, written out case by case (Raffel et al. 2020)."""
    offset = 0
    if bidirectional:
        buckets //= 2
        if distance < 0:  # the key comes after the query
            offset, distance = buckets, -distance
    distance = max(distance, 0)
    exact = buckets // 2
    if distance < exact:
        return offset + distance
    grown = exact + int(math.log(distance / exact) / math.log(max_distance / exact) * (buckets - exact))
    return offset + min(grown, buckets - 1)


def _t5(term, h: int, i: int, j: int, causal: bool) -> float:
    return float(term.table[_t5_bucket(i - j, term.num_buckets, term.max_distance, term.bidirectional), h])


def _alibi(term, h: int, i: int, j: int, causal: bool) -> float:
    return -float(term.slopes[h]) * ((i - j) if causal else abs(i - j))


def _direct_absolute(term, h: int, i: int, j: int, causal: bool) -> float:
    return float(term.weight[h, i, j])  # A^p


def _direct_relative(term, h: int, i: int, j: int, causal: bool) -> float:
    return float(term.weight[h, i - j + term.max_positions - 1])  # a^r


#: the additive terms' biases for head h, query i, key j (token positions of one sentence), by class
#: of term; a new additive method adds its own, written from its paper, not from its code
REFERENCE_BIASES: Dict[type, Callable[[Any, int, int, int, bool], float]] = {
    T5RelativeBias: _t5, LinearDistanceBias: _alibi,
    DirectAbsolutePositionBias: _direct_absolute, DirectRelativePositionBias: _direct_relative,
}


def _additive(term, h: int, i: int, j: int, causal: bool) -> float:
    """One additive term's bias (:data:`REFERENCE_BIASES`)."""
    if type(term) not in REFERENCE_BIASES:
        raise LookupError(f"no independent reference for {type(term).__name__}: add one to REFERENCE_BIASES "
                          "in tests/reference_attention.py")
    return REFERENCE_BIASES[type(term)](term, h, i, j, causal)


def _rotated(vector: Tensor, position: int) -> Tensor:
    """RoPE: turn each pair of dimensions (2k, 2k + 1) by position * 10000^(-2k/d) (Su et al. 2021)."""
    d = vector.numel()
    out = vector.clone()
    for k in range(d // 2):
        angle = position * 10000.0 ** (-2.0 * k / d)
        a, b = float(vector[2 * k]), float(vector[2 * k + 1])
        out[2 * k] = a * math.cos(angle) - b * math.sin(angle)
        out[2 * k + 1] = a * math.sin(angle) + b * math.cos(angle)
    return out


def reference_attention(
    attn: PositionAwareMultiheadAttention, x: Tensor, causal: bool
) -> Tuple[Tensor, Tensor]:
    """Attention of one sentence ``x`` (length L, embed E): returns (output L x E, probs H x L x L).

    ``probs`` is the matrix the heads multiply V with (after the convolution, if any).
    """
    L, E = x.shape
    H, d = attn.num_heads, attn.head_dim
    gammas = attn.projection_term.gamma if attn.projection_term is not None else torch.ones(3, H, dtype=x.dtype)
    heads_out = []
    probs_all = torch.zeros(H, L, L, dtype=x.dtype)
    for h in range(H):
        rows = slice(h * d, (h + 1) * d)
        q = x @ (attn.q_proj.weight[rows] * gammas[0, h]).t() + attn.q_proj.bias[rows]
        k = x @ (attn.k_proj.weight[rows] * gammas[1, h]).t() + attn.k_proj.bias[rows]
        v = x @ (attn.v_proj.weight[rows] * gammas[2, h]).t() + attn.v_proj.bias[rows]
        if len(attn.query_key_terms) > 0:  # rotary
            q = torch.stack([_rotated(q[i], i) for i in range(L)])
            k = torch.stack([_rotated(k[j], j) for j in range(L)])
        logits = torch.full((L, L), float("-inf"), dtype=x.dtype)
        for i in range(L):
            for j in range(L):
                if causal and j > i:
                    continue
                key = k[j].clone()
                for term in attn.key_value_terms:
                    c = term.clip
                    key = key + term.key_table[max(-c, min(c, j - i)) + c]
                e = float(q[i] @ key) / math.sqrt(d)
                if attn.scaling_term is not None:
                    w, vv = float(attn.scaling_term.w[h]), float(attn.scaling_term.v[h])
                    e = max(e, 0.0) * _f_distance(w * abs(i - j), vv)
                for term in attn.additive_terms:
                    e += _additive(term, h, i, j, causal)
                logits[i, j] = e
        probs = torch.softmax(logits, dim=-1)
        if attn.post_softmax_term is not None:
            probs = _reference_convolution(attn.post_softmax_term, probs, h, causal)
        out = torch.zeros(L, d, dtype=x.dtype)
        for i in range(L):
            for j in range(L):
                value = v[j].clone()
                for term in attn.key_value_terms:
                    c = term.clip
                    if term.values:
                        value = value + term.value_table[max(-c, min(c, j - i)) + c]
                out[i] += probs[i, j] * value
        heads_out.append(out)
        probs_all[h] = probs
    concat = torch.cat(heads_out, dim=-1)
    return concat @ attn.out_proj.weight.t() + attn.out_proj.bias, probs_all


def _reference_convolution(term, S: Tensor, h: int, causal: bool) -> Tensor:
    """ReLU(conv(S)) by explicit sums, zero outside the matrix, then masked again."""
    L = S.size(0)
    k = term.kernel_size
    half = k // 2
    # query-axis offsets: centred window, or the current and k - 1 earlier rows when causal
    offsets = [a - (k - 1) for a in range(k)] if causal else [a - half for a in range(k)]

    def at(i: int, j: int) -> float:
        return float(S[i, j]) if 0 <= i < L and 0 <= j < L else 0.0

    out = torch.zeros(L, L, dtype=S.dtype)
    if term.__class__.__name__ == "ConvolvedAttention2d":
        w, b = term.conv.weight[h, 0], float(term.conv.bias[h])
        for i in range(L):
            for j in range(L):
                total = b
                for a, di in enumerate(offsets):
                    for c in range(k):
                        total += float(w[a, c]) * at(i + di, j + c - half)
                out[i, j] = total
    else:  # 1d: channels are the t key columns, sliding along queries
        t = term.max_positions
        weight = term.conv.weight[h * t : (h + 1) * t]  # t_out x t_in x k
        bias = term.conv.bias[h * t : (h + 1) * t]
        for i in range(L):
            for col in range(L):
                total = float(bias[col])
                for a, di in enumerate(offsets):
                    for c_in in range(L):
                        total += float(weight[col, c_in, a]) * at(i + di, c_in)
                out[i, col] = total
    out = torch.relu(out)
    if causal:
        out = torch.tril(out)
    return out


def randomize_(module: torch.nn.Module, seed: int = 0) -> None:
    """Give every parameter random values (many terms start at zero, which would test nothing)."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=generator, dtype=p.dtype) * 0.5)
        for name, p in module.named_parameters():
            if name.endswith("gamma"):
                p.copy_(1 + 0.3 * torch.randn(p.shape, generator=generator, dtype=p.dtype))


def sentence_of(x: Tensor, b: int, mask: Optional[Tensor]) -> Tensor:
    """Real tokens of batch element ``b`` from ``x`` (T x B x E) given a padding mask (B x T)."""
    if mask is None:
        return x[:, b]
    return x[~mask[b], b]
