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
from posattn.position_terms.cable import ContextAwareSlopeBias
from posattn.position_terms.contextual import ContextualPositionBias
from posattn.position_terms.dape import DataAdaptiveBias
from posattn.position_terms.convolution import ConvolvedAttention1d, ConvolvedAttention2d
from posattn.position_terms.direct import DirectAbsolutePositionBias, DirectRelativePositionBias
from posattn.position_terms.distance_aware import DistanceAwareScaling
from posattn.position_terms.fire import FireBias
from posattn.position_terms.forget_gate import ForgetGateBias
from posattn.position_terms.hope import HighFrequencyRotaryEmbedding
from posattn.position_terms.kerple import KerpleBias
from posattn.position_terms.multi_token import MultiTokenAttention
from posattn.position_terms.p_rope import PRotaryEmbedding
from posattn.position_terms.path_attention import PathTransforms
from posattn.position_terms.polar import PolarEmbedding
from posattn.position_terms.relative_embeddings import RelativePositionEmbeddings
from posattn.position_terms.rotary import RotaryEmbedding
from posattn.position_terms.sandwich import SandwichBias
from posattn.position_terms.scalable_softmax import ScalableSoftmaxQuery
from posattn.position_terms.selective import SelectionBias
from posattn.position_terms.structural import StructuralRelativeEmbeddings
from posattn.position_terms.stick_breaking import StickBreakingNormalisation
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


def _cable(term, x: Tensor, h: int, i: int, j: int) -> float:
    """CABLE (Veisi et al. 2025): minus the sum of the slopes m_l = softplus(w_h . x_l + b_h) over l = j+1 .. i."""
    total = 0.0
    for position in range(j + 1, i + 1):
        slope_logit = float(term.slope.weight[h] @ x[position]) + float(term.slope.bias[h])
        total -= math.log(1.0 + math.exp(slope_logit))
    return total


#: the token-difference biases, ``(term, x, h, i, j) -> float``: the bias of head h, query i and key j of the
#: sentence whose layer input is x
REFERENCE_TOKEN_BIASES = References("REFERENCE_TOKEN_BIASES", {ForgetGateBias: _forget_gate,
                                                               ContextAwareSlopeBias: _cable})


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


def scaled_rope_angle(scaling, k: int, d: int, position: int) -> float:
    """The angle of pair k at ``position`` under RoPE's context extension ``scaling`` (a ``RotaryScaling``'s
    kind, factor s, original positions L, ...), each in its source's form: position interpolation turns
    ``position / s`` (Chen et al. 2023, section 2.2); NTK-aware takes the base ``10000 s^(d/(d-2))`` (Peng et al.
    2023, section 3.1); dynamic NTK that of the factor ``s n / L - (s - 1)``, n = max(position + 1, L) (section 3.3,
    with transformers' factor); YaRN ramps per pair between ``theta / s`` and ``theta`` from pair floor(k(beta_fast))
    to ceil(k(beta_slow)), ``k(r) = d ln(L / (2 pi r)) / (2 ln 10000)`` (sections 3.2 and 3.4, as the authors' code
    computes them);
    Llama 3 divides by s the pairs whose wavelength exceeds L / low, keeps those below L / high, and smooths
    between (Meta's ``apply_scaling``)."""
    kind, s, L = scaling.kind, scaling.factor, scaling.original_positions
    theta = 10000.0 ** (-2.0 * k / d)
    if kind == "linear":
        return (position / s) * theta
    if kind in ("ntk", "dynamic"):
        stretch = s if kind == "ntk" else s * max(position + 1, L) / L - (s - 1)
        return position * (10000.0 * stretch ** (d / (d - 2))) ** (-2.0 * k / d)
    if kind == "yarn":
        def pair(rotations: float) -> float:
            return d * math.log(L / (2 * math.pi * rotations)) / (2 * math.log(10000.0))
        low, high = max(math.floor(pair(scaling.beta_fast)), 0), min(math.ceil(pair(scaling.beta_slow)), d - 1)
        high = high + 0.001 if high == low else high
        gamma = min(max((k - low) / (high - low), 0.0), 1.0)
        return position * (gamma * theta / s + (1 - gamma) * theta)
    if kind == "llama3":
        wavelength = 2 * math.pi / theta
        if wavelength < L / scaling.high_frequency_factor:
            return position * theta
        if wavelength > L / scaling.low_frequency_factor:
            return position * theta / s
        smooth = (L / wavelength - scaling.low_frequency_factor) / (
            scaling.high_frequency_factor - scaling.low_frequency_factor)
        return position * ((1 - smooth) * theta / s + smooth * theta)
    return position * theta


def _rotated(vector: Tensor, position: int, scaling=None) -> Tensor:
    """RoPE: turn each pair of dimensions (2k, 2k + 1) by position * 10000^(-2k/d) (Su et al. 2021), or by
    :func:`scaled_rope_angle` with a context extension ``scaling``; YaRN's then multiplied by its
    sqrt(1/t) = 0.1 ln s + 1 (Peng et al. 2023, section 3.4: q and k both)."""
    d = vector.numel()
    out = vector.clone()
    scale = 0.1 * math.log(scaling.factor) + 1 if scaling is not None and scaling.kind == "yarn" else 1.0
    for k in range(d // 2):
        angle = position * 10000.0 ** (-2.0 * k / d) if scaling is None else scaled_rope_angle(scaling, k, d, position)
        a, b = float(vector[2 * k]), float(vector[2 * k + 1])
        out[2 * k] = scale * (a * math.cos(angle) - b * math.sin(angle))
        out[2 * k + 1] = scale * (a * math.sin(angle) + b * math.cos(angle))
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


def _rope(term, vectors: Tensor, query: bool, h: int) -> Tensor:
    return torch.stack([_rotated(v, p, term.scaling) for p, v in enumerate(vectors)])


def _xpos(term, vectors: Tensor, query: bool, h: int) -> Tensor:
    return torch.stack([_xposed(v, p, term.scale_base, query) for p, v in enumerate(vectors)])


def _scalable_softmax(term, vectors: Tensor, query: bool, h: int) -> Tensor:
    """SSMax (Nakanishi 2025): query p times s_h log n, n the keys it sees: p + 1 on a causal side, the sentence's
    length on a bidirectional one; keys unchanged."""
    if not query:
        return vectors
    length = vectors.size(0)
    seen = [p + 1 if term.causal else length for p in range(length)]
    return torch.stack([v * float(term.scale[h]) * math.log(n) for v, n in zip(vectors, seen)])


def _turned_pairs(vector: Tensor, position: int, turns: Callable[[int, int], bool]) -> Tensor:
    """RoPE's turn by position * 10000^(-2k/d) of the pairs (2k, 2k + 1) for which ``turns(k, d)``; the other pairs
    as they are."""
    d = vector.numel()
    out = vector.clone()
    for k in range(d // 2):
        if turns(k, d):
            angle = position * 10000.0 ** (-2.0 * k / d)
            a, b = float(vector[2 * k]), float(vector[2 * k + 1])
            out[2 * k] = a * math.cos(angle) - b * math.sin(angle)
            out[2 * k + 1] = a * math.sin(angle) + b * math.cos(angle)
    return out


def _p_rope(term, vectors: Tensor, query: bool, h: int) -> Tensor:
    """p-RoPE (Barbero et al. 2025): RoPE of the pairs k with 2k + 2 <= p d, the fraction p of the frequencies that
    are highest; the lower ones not turned."""
    return torch.stack([_turned_pairs(v, p, lambda k, d: 2 * k + 2 <= term.fraction * d)
                        for p, v in enumerate(vectors)])


def _hope(term, vectors: Tensor, query: bool, h: int) -> Tensor:
    """HoPE (Chen et al. 2025): RoPE of the pairs whose period 2 pi / theta_k is at most the training length L; the
    others (their period longer than L) not turned."""
    def completes_a_period(k: int, d: int) -> bool:
        return 2 * math.pi / 10000.0 ** (-2.0 * k / d) <= term.training_length

    return torch.stack([_turned_pairs(v, p, completes_a_period) for p, v in enumerate(vectors)])


def _polar(term, vectors: Tensor, query: bool, h: int) -> Tensor:
    """PoPE (Gopalakrishnan et al. 2025): each dimension c a complex number of magnitude softplus(x_c) and phase
    p theta_c, theta_c = 10000^(-c/d), plus head h's delta_c (clamped to [-2 pi, 0]) for a key; returned as the real
    parts, then the imaginary parts, so that q . k is Re[conj(q~) k~]."""
    d = vectors.size(-1)
    rows = []
    for p, v in enumerate(vectors):
        parts = []
        for c in range(d):
            phase = p * 10000.0 ** (-c / d)
            if not query:
                phase += min(max(float(term.phase_bias[h, c]), -2 * math.pi), 0.0)
            parts.append(math.log1p(math.exp(float(v[c]))) * complex(math.cos(phase), math.sin(phase)))
        rows.append(torch.tensor([z.real for z in parts] + [z.imag for z in parts], dtype=vectors.dtype))
    return torch.stack(rows)


#: the query/key transforms, ``(term, vectors, query, h) -> vectors``: the transformed rows of head h's ``vectors``
#: (row p at position p; ``query``: they are queries, else keys)
REFERENCE_TRANSFORMS = References("REFERENCE_TRANSFORMS", {RotaryEmbedding: _rope, XPosEmbedding: _xpos,
                                                           ScalableSoftmaxQuery: _scalable_softmax,
                                                           PRotaryEmbedding: _p_rope,
                                                           HighFrequencyRotaryEmbedding: _hope,
                                                           PolarEmbedding: _polar})


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


def _stick_breaking(term, logits: Tensor) -> Tensor:
    """Stick-breaking attention (Tan et al. 2025, section 2) of one head's L x L logits (-inf where a query may not
    look), entry by entry: key j < i takes sigmoid(z_ij) times the product of (1 - sigmoid(z_il)) over the keys l
    between j and i; what is left of the stick goes to the query's own key i."""
    L = logits.size(0)
    out = torch.zeros(L, L, dtype=logits.dtype)
    for i in range(L):
        for j in range(i):
            if logits[i, j] == float("-inf"):
                continue
            weight = 1.0 / (1.0 + math.exp(-float(logits[i, j])))
            for l in range(j + 1, i):
                if logits[i, l] > float("-inf"):
                    weight *= 1.0 - 1.0 / (1.0 + math.exp(-float(logits[i, l])))
            out[i, j] = weight
        out[i, i] = 1.0 - float(out[i, :i].sum())
    return out


#: the normalisations in place of the softmax, ``(term, logits) -> weights``: one head's L x L logits of one sentence
#: (-inf where a query may not look) turned into the weights that multiply the values
REFERENCE_NORMALISATIONS = References("REFERENCE_NORMALISATIONS", {StickBreakingNormalisation: _stick_breaking})


def _mta_convolution(term, logits: Tensor, parts: Tuple[Tensor, Tensor], causal: bool) -> Tensor:
    """Multi-token attention (Golovneva et al. 2025, section 3.1): each head's logits with the entries a query may not
    see set to 0, convolved by explicit sums with its c_q x c_k kernel (query rows i - c_q + 1 .. i when causal, a
    centred window otherwise; keys centred; zero outside the matrix), then -inf again where the query may not look."""
    H, L, _ = logits.shape
    cq, ck = term.query_kernel, term.key_kernel
    zeroed = torch.where(torch.isneginf(logits), torch.zeros_like(logits), logits)
    first_row = -(cq - 1) if causal else -(cq // 2)
    out = torch.full_like(logits, float("-inf"))
    for h in range(H):
        for i in range(L):
            for j in range(L):
                if logits[h, i, j] == float("-inf"):
                    continue
                total = 0.0
                for a in range(cq):
                    for b in range(ck):
                        total += float(term.kernel[h, 0, a, b]) * _entry(zeroed[h], i + first_row + a, j - ck // 2 + b)
                out[h, i, j] = total
    return out


def _dape(term, logits: Tensor, parts: Tuple[Tensor, Tensor], causal: bool) -> Tensor:
    """DAPE (Zheng et al. 2024, section 3): every visible logit of head h plus f([A; B])_h at its (i, j), A the content
    logits and B the additive biases of all heads, f(x) = W_2 LeakyReLU(W_1 x + b_1) + b_2 (slope 0.01), by
    explicit sums over inputs and hidden units."""
    content, bias = parts
    H, L, _ = logits.shape
    out = logits.clone()
    for i in range(L):
        for j in range(L):
            if logits[0, i, j] == float("-inf"):
                continue
            features = [float(content[h, i, j]) for h in range(H)] + [float(bias[h, i, j]) for h in range(H)]
            hidden = []
            for unit in range(term.width):
                total = float(term.mlp_in.bias[unit]) + sum(float(term.mlp_in.weight[unit, n]) * features[n]
                                                            for n in range(2 * H))
                hidden.append(total if total > 0 else 0.01 * total)
            for h in range(H):
                out[h, i, j] = float(logits[h, i, j]) + float(term.mlp_out.bias[h]) + sum(
                    float(term.mlp_out.weight[h, unit]) * hidden[unit] for unit in range(term.width))
    return out


def _selective(term, logits: Tensor, parts: Tuple[Tensor, Tensor], causal: bool) -> Tensor:
    """Selective attention (Leviathan et al. 2024, section 3): query k selects key j with S_kj = max(l_kj, 0) of head
    0's logits l (-inf where k may not see j), except itself (j = k) and the first token (j = 0); every head's logit
    of key j for query i loses F_ij = sum over the earlier queries k < i of S_kj."""
    H, L, _ = logits.shape
    out = logits.clone()
    for i in range(L):
        for j in range(L):
            selected = sum(max(float(logits[0, k, j]), 0.0) for k in range(i) if k != j and j != 0)
            for h in range(H):
                out[h, i, j] = logits[h, i, j] - selected
    return out


#: the logit-matrix transforms, ``(term, logits, (content, bias), causal) -> logits``: every head's logits of one
#: sentence (H x L x L, -inf where a query may not look) transformed, given the content logits and the sum of the
#: additive biases of every head apart (H x L x L each)
REFERENCE_LOGIT_MATRICES = References("REFERENCE_LOGIT_MATRICES", {
    MultiTokenAttention: _mta_convolution, DataAdaptiveBias: _dape, SelectionBias: _selective,
})


def _mta_head_mixing(term, probs: Tensor, causal: bool) -> Tensor:
    """Multi-token attention (Golovneva et al. 2025, section 3.2): heads in groups of c_h consecutive ones, head n of
    group g weighted by sum over the group's heads m of w_g[m, n] times head m's weights."""
    H, L, _ = probs.shape
    c = term.head_group
    out = torch.zeros_like(probs)
    for h in range(H):
        g, n = divmod(h, c)
        for m in range(c):
            out[h] += float(term.head_mixing[g, m, n]) * probs[g * c + m]
    return out


#: the weight transforms across heads after the softmax, ``(term, probs, causal) -> probs``: every head's weights of
#: one sentence (H x L x L), transformed
REFERENCE_HEAD_WEIGHTS = References("REFERENCE_HEAD_WEIGHTS", {MultiTokenAttention: _mta_head_mixing})


def _path_transform(term, x: Tensor, h: int, t: int) -> Tensor:
    """PaTH's H_t = I - beta_t w_t w_t^T of head h at token t of the sentence x (Yang et al. 2025, section 2, as
    flash-linear-attention's layer makes w_t and beta_t): w_t the SiLU of a 3-tap causal convolution over the tokens'
    low-rank projections (zero before the first token), of unit norm (eps 1e-6); beta_t = 2 sigmoid(u_h . x_t + b_h)."""
    d, taps = term.head_dim, term.w_conv.kernel_size[0]
    rows = slice(h * d, (h + 1) * d)
    conv = sum(term.w_conv.weight[rows, 0, tap] * (term.w_proj[1].weight[rows] @ (term.w_proj[0].weight @ x[s]))
               for tap, s in enumerate(range(t - taps + 1, t + 1)) if s >= 0)
    w = conv / (1.0 + torch.exp(-conv))  # SiLU
    w = w / torch.sqrt(w @ w + 1e-6)
    beta = 2.0 / (1.0 + torch.exp(-(term.beta_proj.weight[h] @ x[t] + term.beta_proj.bias[h])))
    return torch.eye(d, dtype=x.dtype) - beta * torch.outer(w, w)


def _path(term, x: Tensor, h: int, k: Tensor) -> List[List[Tensor]]:
    """PaTH (Yang et al. 2025, section 2): key j as query i sees it, H_i H_{i-1} ... H_{j+1} k_j (j <= i), by explicit
    products of the matrices."""
    L = x.size(0)
    transforms = [_path_transform(term, x, h, t) for t in range(L)]
    seen = [[k[j] for j in range(L)] for _ in range(L)]
    for i in range(L):
        for j in range(i):
            product = torch.eye(k.size(1), dtype=x.dtype)
            for t in range(i, j, -1):
                product = product @ transforms[t]
            seen[i][j] = product @ k[j]
    return seen


#: the content-logits terms, ``(term, x, h, k) -> keys``: ``keys[i][j]``, key j of head h as query i's content logit
#: reads it, for the sentence whose layer input is x and whose head-h keys are the rows of k
REFERENCE_CONTENT = References("REFERENCE_CONTENT", {PathTransforms: _path})


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
    logits_all, values_all = torch.zeros(H, L, L, dtype=x.dtype), []
    content_all, bias_all = torch.zeros(H, L, L, dtype=x.dtype), torch.zeros(H, L, L, dtype=x.dtype)
    for h in range(H):
        rows = slice(h * d, (h + 1) * d)
        weights = (attn.q_proj.weight[rows], attn.k_proj.weight[rows], attn.v_proj.weight[rows])
        if attn.projection_term is not None:
            weights = REFERENCE_PROJECTIONS(attn.projection_term, h, weights)
        q = x @ weights[0].t() + attn.q_proj.bias[rows]
        k = x @ weights[1].t() + attn.k_proj.bias[rows]
        v = x @ weights[2].t() + attn.v_proj.bias[rows]
        for term in attn.query_key_terms:  # in the kernel's order
            q, k = REFERENCE_TRANSFORMS(term, q, True, h), REFERENCE_TRANSFORMS(term, k, False, h)
        logits = torch.full((L, L), float("-inf"), dtype=x.dtype)
        seen = None if attn.content_term is None else REFERENCE_CONTENT(attn.content_term, x, h, k)
        for i in range(L):
            for j in range(L):
                if causal and j > i:
                    continue
                key = (k[j] if seen is None else seen[i][j]).clone()
                for term in attn.key_value_terms:
                    key = key + REFERENCE_KEY_VALUES(term, i, j, L)[0]
                e = float(q[i] @ key) / math.sqrt(d)
                if attn.scaling_term is not None:
                    e = REFERENCE_SCALINGS(attn.scaling_term, e, h, i, j)
                content_all[h, i, j] = e
                bias = sum(REFERENCE_BIASES(term, h, i, j, causal) for term in attn.additive_terms)
                bias_all[h, i, j] = bias
                e += bias
                for term in attn.token_difference_terms:
                    e += REFERENCE_TOKEN_BIASES(term, x, h, i, j)
                logits[i, j] = e
            if attn.row_term is not None:
                logits[i] = REFERENCE_ROW_BIASES(attn.row_term, logits[i], q[i])
        logits_all[h] = logits
        values_all.append(v)
    for term in attn.logit_matrix_terms:  # every head's logits at once, in the kernel's order
        logits_all = REFERENCE_LOGIT_MATRICES(term, logits_all, (content_all, bias_all), causal)
    for h in range(H):
        logits = logits_all[h]
        if attn.normalisation_term is None:
            probs = torch.softmax(logits, dim=-1)
        else:
            probs = REFERENCE_NORMALISATIONS(attn.normalisation_term, logits)
        probs_all[h] = probs
    for term in attn.logit_matrix_terms:  # every head's weights at once (head mixing), where a term does
        if term.transforms_weights:
            probs_all = REFERENCE_HEAD_WEIGHTS(term, probs_all, causal)
    for h in range(H):
        probs, v = probs_all[h], values_all[h]
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
