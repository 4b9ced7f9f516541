"""A direct, loop-by-loop re-implementation of the methods in docs/methods.md, one sentence at a time.

Deliberately naive (Python loops over heads, queries and keys; no padding tricks): it works on the
real tokens of one sentence only, so agreeing with it also shows that padding changes nothing.

:func:`reference_attention` is the order of operations of one head, kind by kind; it names no method. Each
kind finds a term's reference in its table (``REFERENCE_*``), by the term's class: a new method adds its own
to the table of its kind, written from its paper, not from its code.
"""

import math
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch
from torch import Tensor

from posattn.attention import PositionKernel
from posattn.position_terms.alibi import LinearDistanceBias
from posattn.position_terms.contextual import ContextualPositionBias
from posattn.position_terms.convolution import ConvolvedAttention1d, ConvolvedAttention2d
from posattn.position_terms.direct import DirectAbsolutePositionBias, DirectRelativePositionBias
from posattn.position_terms.distance_aware import DistanceAwareScaling
from posattn.position_terms.fire import FireBias
from posattn.position_terms.forget_gate import ForgetGateBias
from posattn.position_terms.kerple import KerpleBias
from posattn.position_terms.relative_embeddings import RelativePositionEmbeddings
from posattn.position_terms.rotary import RotaryEmbedding
from posattn.position_terms.sandwich import SandwichBias
from posattn.position_terms.structural import StructuralRelativeEmbeddings
from posattn.position_terms.t5_bias import T5RelativeBias
from posattn.position_terms.temperature import LearnableTemperature
from posattn.position_terms.xpos import XPosEmbedding


class References(dict):
    """One kind's references by class of term, ``{class: function}``. Called with a term and the kind's
    arguments, it calls the function of the term's class with them; a LookupError names the table to add one
    to where the class has none."""

    def __init__(self, name: str, references: Dict[type, Callable[..., Any]]):
        super().__init__(references)
        self.name = name

    def __call__(self, term, *args: Any) -> Any:
        if type(term) not in self:
            raise LookupError(f"no independent reference for {type(term).__name__}: add one to {self.name} "
                              "in tests/reference_attention.py")
        return self[type(term)](term, *args)


def _temperature(term, h: int, weights: Tuple[Tensor, Tensor, Tensor]) -> Tuple[Tensor, Tensor, Tensor]:
    """Learnable temperature (Dufter et al. 2020, section 2.4): head h's rows of W_q, W_k, W_v times its
    gamma_q, gamma_k, gamma_v (the biases unscaled)."""
    return tuple(weight * term.gamma[row, h] for row, weight in enumerate(weights))


#: the projection scalings, ``(term, h, (W_q, W_k, W_v)) -> (W_q, W_k, W_v)``: head h's rows of the
#: projection weights as applied
REFERENCE_PROJECTIONS = References("REFERENCE_PROJECTIONS", {LearnableTemperature: _temperature})


def _f_distance(x: float, v: float) -> float:
    """DA-Transformer's f(x; v) = (1 + exp(v)) / (1 + exp(v - x)), in the paper's form."""
    return (1 + math.exp(v)) / (1 + math.exp(v - x))


def _distance_aware(term, e: float, h: int, i: int, j: int) -> float:
    """DA-Transformer (Wu et al. 2021, eq. 5 and 6): ReLU(e) * f(w_h |i - j|; v_h)."""
    w, vv = float(term.w[h]), float(term.v[h])
    return max(e, 0.0) * _f_distance(w * abs(i - j), vv)


#: the logit scalings, ``(term, e, h, i, j) -> float``: the scaled content logit ``e`` of head h, query i and
#: key j, rescaled
REFERENCE_SCALINGS = References("REFERENCE_SCALINGS", {DistanceAwareScaling: _distance_aware})


def _shaw(term, i: int, j: int, length: int) -> Tuple[Tensor, Optional[Tensor]]:
    """Shaw et al. 2018 (section 3): a^K and a^V of the clipped distance clip(j - i, -k, k); no a^V for the
    keys-only ablation."""
    c = term.clip
    bucket = max(-c, min(c, j - i)) + c
    return term.key_table[bucket], (term.value_table[bucket] if term.values else None)


def _example_tree_relative(length: int, clip: int) -> List[List[int]]:
    """Relative structural positions (Wang et al. 2019, 3.1-3.2) of the tests' example parse of a sentence of
    ``length`` tokens, from the word-level tree functions: two pieces per word, word w's head word (w - 1) // 2
    (w = 0 the root), EOS last and on no path (``sign(i - j) * (depth_i + depth_j)``, its depth 0). The tree
    functions are the fairseq front-end's (imported here: the rest of the reference needs torch alone)."""
    from fairseq_posattn.structure import structural_relative_positions, tree_depths

    words = [token // 2 for token in range(length - 1)]
    heads = [0 if w == 0 else (w - 1) // 2 + 1 for w in range(length // 2)]  # CoNLL: 1-based, 0 = root
    word_relative, depths = structural_relative_positions(heads), tree_depths(heads)
    depth = [depths[w] for w in words] + [0]
    out = [[0] * length for _ in range(length)]
    for i in range(length):
        for j in range(length):
            if i < length - 1 and j < length - 1:
                relative = int(word_relative[words[i]][words[j]])
            else:
                relative = (i > j) - (i < j)
                relative *= depth[i] + depth[j]
            out[i][j] = max(-clip, min(clip, relative))
    return out


def _structural(term, i: int, j: int, length: int) -> Tuple[Tensor, Optional[Tensor]]:
    """Wang et al. 2019 (3.2): a^K and a^V of the clipped relative structural position of tokens i and j, on
    the tests' example parse (the batches carry it: ``tests/model_helpers.SIDE_DATA``)."""
    bucket = _example_tree_relative(length, term.clip)[i][j] + term.clip
    return term.key_table[bucket], (term.value_table[bucket] if term.values else None)


#: the key/value augmentations, ``(term, i, j, length) -> (a^K_ij, a^V_ij)``: the vectors added to key j and to
#: value j for query i of a sentence of ``length`` tokens (``a^V_ij`` None: the term has no value term)
REFERENCE_KEY_VALUES = References("REFERENCE_KEY_VALUES", {RelativePositionEmbeddings: _shaw,
                                                           StructuralRelativeEmbeddings: _structural})


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


def _kerple(term, h: int, i: int, j: int, causal: bool) -> float:
    """KERPLE (Chi et al. 2022, section 4.3): -r1 log(1 + r2 |i - j|) or -r1 |i - j|^r2, with r1, r2 as the
    authors' code keeps them: at least 0.01, and r2 of the power kernel at most 2."""
    raw = term.side_parameters
    r1 = max(float(raw.r1[h]), 0.01)
    r2 = max(float(raw.r2[h]), 0.01)
    distance = abs(i - j)
    if raw.kernel == "log":
        return -r1 * math.log(1 + r2 * distance)
    return -r1 * distance ** min(r2, 2.0)


def _sandwich(term, h: int, i: int, j: int, causal: bool) -> float:
    """Sandwich (Chi et al. 2023, section 5): p_i . p_j of sinusoids of d' dimensions, sum over k = 1 .. d'/2
    of cos((i - j) / 10000^(2k/d')), less d'/2, over head h's compression ratio 8 (h + 1) / H."""
    d = term.dim
    product = sum(math.cos((i - j) / 10000.0 ** (2.0 * k / d)) for k in range(1, d // 2 + 1))
    return (product - d / 2) / (8.0 * (h + 1) / term.num_heads)


def _fire(term, h: int, i: int, j: int, causal: bool) -> float:
    """FIRE (Li et al. 2023, section 3): f(psi(i - j) / psi(max(L, i))), psi(x) = log(|c| x + 1), L = |m L_0|,
    1e-6 added to the normaliser; f one hidden ReLU layer. On a bidirectional side (our choice) the input is
    signed and normalised by the later position, max(L, i, j); for j <= i both are the paper's."""
    c = abs(float(term.c[0]))
    threshold = abs(float(term.threshold_scale[0]) * term.initial_threshold)
    distance = i - j
    psi = math.log(c * abs(distance) + 1)
    normaliser = math.log(c * max(threshold, i, j) + 1) + 1e-6
    x = (1 if distance > 0 else -1 if distance < 0 else 0) * psi / normaliser
    out = float(term.mlp_out.bias[h])
    for unit in range(term.hidden):
        hidden = float(term.mlp_in.weight[unit, 0]) * x + float(term.mlp_in.bias[unit])
        out += float(term.mlp_out.weight[h, unit]) * max(hidden, 0.0)
    return out


#: the additive biases, ``(term, h, i, j, causal) -> float``: the bias of head h, query i and key j (token
#: positions of one sentence); a new additive method adds its own, written from its paper, not from its code
REFERENCE_BIASES = References("REFERENCE_BIASES", {
    T5RelativeBias: _t5, LinearDistanceBias: _alibi,
    DirectAbsolutePositionBias: _direct_absolute, DirectRelativePositionBias: _direct_relative,
    KerpleBias: _kerple, SandwichBias: _sandwich, FireBias: _fire,
})


def _forget_gate(term, x: Tensor, h: int, i: int, j: int) -> float:
    """FoX (Lin et al. 2025, section 3): the sum of log f_l over l = j+1 .. i, f_l = sigmoid(w_h . x_l + b_h)."""
    total = 0.0
    for position in range(j + 1, i + 1):
        gate_logit = float(term.gate.weight[h] @ x[position]) + float(term.gate.bias[h])
        total += math.log(1.0 / (1.0 + math.exp(-gate_logit)))
    return total


#: the token-difference biases, ``(term, x, h, i, j) -> float``: the bias of head h, query i and key j of the
#: sentence whose layer input is x
REFERENCE_TOKEN_BIASES = References("REFERENCE_TOKEN_BIASES", {ForgetGateBias: _forget_gate})


def _contextual_row(term, row: Tensor, query: Tensor) -> Tensor:
    """CoPE (Golovneva et al. 2024, section 3) on one query's row of logits (-inf where it may not look): key j's
    position p = sum over the visible keys t >= j of sigmoid(logit_t), at most p_max - 1; the logit gets
    query . e[p], e interpolated between the integer positions around p."""
    out = row.clone()
    for j in range(row.numel()):
        if row[j] == float("-inf"):
            continue
        p = sum(1.0 / (1.0 + math.exp(-float(row[t]))) for t in range(j, row.numel()) if row[t] > float("-inf"))
        p = min(p, term.count_limit - 1)
        low, high = math.floor(p), math.ceil(p)
        embedding = (p - low) * term.embeddings[:, high] + (1 - (p - low)) * term.embeddings[:, low]
        out[j] = row[j] + float(query @ embedding)
    return out


#: the row-dependent biases, ``(term, row, query) -> row``: one query's row of logits (-inf where it may not
#: look) with the bias added, given its (unscaled) query vector
REFERENCE_ROW_BIASES = References("REFERENCE_ROW_BIASES", {ContextualPositionBias: _contextual_row})


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


def _xposed(vector: Tensor, position: int, scale_base: int, query: bool) -> Tensor:
    """xPos (Sun et al. 2022, section 3.2): RoPE's turn of each pair (2k, 2k + 1), then the pair scaled by
    zeta_k^(position / B) for a query and zeta_k^(-position / B) for a key, zeta_k = (2k/d + 0.4) / 1.4 (the
    paper's form, uncentred)."""
    d = vector.numel()
    out = _rotated(vector, position)
    for k in range(d // 2):
        zeta = (2.0 * k / d + 0.4) / 1.4
        scale = zeta ** ((position if query else -position) / scale_base)
        out[2 * k] = out[2 * k] * scale
        out[2 * k + 1] = out[2 * k + 1] * scale
    return out


def _rope(term, vectors: Tensor, query: bool) -> Tensor:
    return torch.stack([_rotated(v, p) for p, v in enumerate(vectors)])


def _xpos(term, vectors: Tensor, query: bool) -> Tensor:
    return torch.stack([_xposed(v, p, term.scale_base, query) for p, v in enumerate(vectors)])


#: the query/key transforms, ``(term, vectors, query) -> vectors``: the transformed rows of ``vectors`` (row p
#: at position p; ``query``: they are queries, else keys)
REFERENCE_TRANSFORMS = References("REFERENCE_TRANSFORMS", {RotaryEmbedding: _rope, XPosEmbedding: _xpos})


def _query_offsets(k: int, causal: bool) -> List[int]:
    """A k-tap filter's query-axis offsets: a centred window, or the current and k - 1 earlier rows when causal."""
    half = k // 2
    return [a - (k - 1) for a in range(k)] if causal else [a - half for a in range(k)]


def _entry(S: Tensor, i: int, j: int) -> float:
    """``S[i, j]``, zero outside the matrix."""
    L = S.size(0)
    return float(S[i, j]) if 0 <= i < L and 0 <= j < L else 0.0


def _rectified(out: Tensor, causal: bool) -> Tensor:
    """ReLU of the convolution's sums, then masked again."""
    out = torch.relu(out)
    if causal:
        out = torch.tril(out)
    return out


def _convolution_2d(term, S: Tensor, h: int, causal: bool) -> Tensor:
    """Dufter et al. 2020 (section 2.5), 2d: ReLU(conv(S)) of head h's k x k filter and bias, by explicit sums,
    zero outside the matrix, then masked again."""
    L = S.size(0)
    k = term.kernel_size
    half = k // 2
    offsets = _query_offsets(k, causal)
    out = torch.zeros(L, L, dtype=S.dtype)
    w, b = term.conv.weight[h, 0], float(term.conv.bias[h])
    for i in range(L):
        for j in range(L):
            total = b
            for a, di in enumerate(offsets):
                for c in range(k):
                    total += float(w[a, c]) * _entry(S, i + di, j + c - half)
            out[i, j] = total
    return _rectified(out, causal)


def _convolution_1d(term, S: Tensor, h: int, causal: bool) -> Tensor:
    """Dufter et al. 2020 (section 2.5), 1d: the channels are the t key columns, sliding along the queries;
    ReLU(conv(S)) by explicit sums, zero outside the matrix, then masked again."""
    L = S.size(0)
    offsets = _query_offsets(term.kernel_size, causal)
    out = torch.zeros(L, L, dtype=S.dtype)
    t = term.max_positions
    weight = term.conv.weight[h * t : (h + 1) * t]  # t_out x t_in x k
    bias = term.conv.bias[h * t : (h + 1) * t]
    for i in range(L):
        for col in range(L):
            total = float(bias[col])
            for a, di in enumerate(offsets):
                for c_in in range(L):
                    total += float(weight[col, c_in, a]) * _entry(S, i + di, c_in)
            out[i, col] = total
    return _rectified(out, causal)


#: the post-softmax transforms, ``(term, S, h, causal) -> S'``: head h's softmax matrix S of one sentence,
#: transformed (zero where a query may not see a key)
REFERENCE_POST_SOFTMAX = References("REFERENCE_POST_SOFTMAX", {
    ConvolvedAttention2d: _convolution_2d, ConvolvedAttention1d: _convolution_1d,
})


def reference_attention(
    attn: PositionKernel, x: Tensor, causal: bool
) -> Tuple[Tensor, Tensor]:
    """Attention of one sentence ``x`` (length L, embed E): returns (output L x E, probs H x L x L).

    ``probs`` is the matrix the heads multiply V with (after the post-softmax transform, if any).
    """
    L, E = x.shape
    H, d = attn.num_heads, attn.head_dim
    heads_out = []
    probs_all = torch.zeros(H, L, L, dtype=x.dtype)
    for h in range(H):
        rows = slice(h * d, (h + 1) * d)
        weights = (attn.q_proj.weight[rows], attn.k_proj.weight[rows], attn.v_proj.weight[rows])
        if attn.projection_term is not None:
            weights = REFERENCE_PROJECTIONS(attn.projection_term, h, weights)
        q = x @ weights[0].t() + attn.q_proj.bias[rows]
        k = x @ weights[1].t() + attn.k_proj.bias[rows]
        v = x @ weights[2].t() + attn.v_proj.bias[rows]
        for term in attn.query_key_terms:  # in the kernel's order
            q, k = REFERENCE_TRANSFORMS(term, q, True), REFERENCE_TRANSFORMS(term, k, False)
        logits = torch.full((L, L), float("-inf"), dtype=x.dtype)
        for i in range(L):
            for j in range(L):
                if causal and j > i:
                    continue
                key = k[j].clone()
                for term in attn.key_value_terms:
                    key = key + REFERENCE_KEY_VALUES(term, i, j, L)[0]
                e = float(q[i] @ key) / math.sqrt(d)
                if attn.scaling_term is not None:
                    e = REFERENCE_SCALINGS(attn.scaling_term, e, h, i, j)
                for term in attn.additive_terms:
                    e += REFERENCE_BIASES(term, h, i, j, causal)
                for term in attn.token_difference_terms:
                    e += REFERENCE_TOKEN_BIASES(term, x, h, i, j)
                logits[i, j] = e
            if attn.row_term is not None:
                logits[i] = REFERENCE_ROW_BIASES(attn.row_term, logits[i], q[i])
        probs = torch.softmax(logits, dim=-1)
        if attn.post_softmax_term is not None:
            probs = REFERENCE_POST_SOFTMAX(attn.post_softmax_term, probs, h, causal)
        out = torch.zeros(L, d, dtype=x.dtype)
        for i in range(L):
            for j in range(L):
                value = v[j].clone()
                for term in attn.key_value_terms:
                    added = REFERENCE_KEY_VALUES(term, i, j, L)[1]
                    if added is not None:
                        value = value + added
                out[i] += probs[i, j] * value
        heads_out.append(out)
        probs_all[h] = probs
    concat = torch.cat(heads_out, dim=-1)
    return concat @ attn.out_proj.weight.t() + attn.out_proj.bias, probs_all


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
