#!/usr/bin/env python
"""Evaluate ``torch.nn.attention.flex_attention`` as a fused path for the score-modifying terms.

For the direct absolute bias ``A^p`` and relative bias ``a^r`` (Dufter et al. 2020, 2.3), T5's
bucketed bias (Raffel et al. 2020, 2.1), ALiBi (Press et al. 2022, 3) and the distance-aware
scaling ``ReLU(QK^T) * f(w |i - j|; v)`` (Wu et al. 2021, eq. 5-6), it compares on one device:

- ``explicit``: the module's own explicit path (``PositionAwareMultiheadAttention._attend_explicitly``:
  matmul, term, masks, fp32 softmax, matmul), the reference;
- ``sdpa``: the module's fused path (``_attend_fused``: ``F.scaled_dot_product_attention`` with the
  bias, padding and causal mask in one float mask), for the additive terms only;
- ``flex-eager``: ``flex_attention`` uncompiled (a dense reference implementation), with a block mask;
- ``flex-static``: ``torch.compile(flex_attention, dynamic=False)`` with a block mask;
- ``flex-auto``: ``torch.compile(flex_attention)`` (dynamic=None, "automatic dynamic") with a block
  mask, called first on another shape as fairseq's first batch would: its second graph has dynamic sizes;
- ``flex-dynamic``: ``torch.compile(flex_attention, dynamic=True)`` with the masks as ``-inf`` in the
  score_mod (on CPU, inductor's C++ flex kernel with a block mask and dynamic=True fails to build:
  the recompilation study records it).

The score_mods read the real term modules' parameters (``A^p``, ``a^r``, T5's table, ALiBi's slopes,
DA's ``w`` and ``v``), so gradients reach them as in the module. Measured:

1. equality: max abs difference of the output and of the gradients (q, k, v, the term's parameters)
   against ``explicit`` in the same dtype, fp32 and fp64, and of fp32 outputs against fp64 ``explicit``;
2. inference time (``torch.no_grad``) per call: median of paired ratios over alternating rounds, at
   1 and 2 threads; the block mask's build time (once per batch) apart;
3. training time (forward + backward) where the device supports flex_attention's backward (torch
   refuses it on CPU: the script records the refusal). On CPU the gradients of the score_mods are
   checked through the eager implementation with that guard lifted (the dense backward differentiates
   the same score_mod graph a GPU kernel's backward is generated from): a correctness check only;
4. peak memory growth of one call in a fresh subprocess (``VmHWM`` after resetting it through
   ``/proc/self/clear_refs``, large allocations mmapped so that freed tensors leave the RSS);
5. recompilation over 10 batch shapes (fairseq's batches change shape every step), cold compile
   latency, and incremental decoding (``tgt_len = 1``, ``src_len`` growing).

Left padding in some rows on the bidirectional (encoder) side, right padding on the causal side, as
fairseq pads them. Usage::

    python scripts/flex_attention_eval.py --output report.md --json results.json
    python scripts/flex_attention_eval.py --quick --json results.json   # < 60 s, for the test
"""

import argparse
import contextlib
import gc
import json
import logging
import os
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Callable, Dict, Iterator, List, Optional, Sequence, Tuple

import torch
import torch.nn.attention.flex_attention as flex_module
import torch.nn.functional as F
from torch import Tensor, nn
from torch._dynamo.utils import counters
from torch.nn.attention.flex_attention import BlockMask, create_block_mask, flex_attention

from fairseq_posattn.modules.attention import PositionAwareMultiheadAttention, PositionTerms
from fairseq_posattn.modules.position_context import PositionContext
from fairseq_posattn.modules.position_terms.alibi import LinearDistanceBias
from fairseq_posattn.modules.position_terms.direct import (
    DirectAbsolutePositionBias,
    DirectRelativePositionBias,
)
from fairseq_posattn.modules.position_terms.distance_aware import DistanceAwareScaling
from fairseq_posattn.modules.position_terms.t5_bias import T5RelativeBias, relative_buckets

TERMS = ("absolute", "relative", "t5", "alibi", "da")
ADDITIVE = ("absolute", "relative", "t5", "alibi")
FULL_SHAPES = {"wmt-like 8x4x512x64": (8, 4, 512, 64), "multi30k-like 68x4x60x128": (68, 4, 60, 128)}
QUICK_SHAPES = {"tiny 3x2x24x16": (3, 2, 24, 16)}
#: quick mode compiles flex_attention for these (term, causal) cases only (a compile is ~5-15 s)
QUICK_COMPILED = (("da", False),)
MAX_POSITIONS = 1024
T5_BUCKETS, T5_MAX_DISTANCE = 32, 128
#: fairseq-like batches of about 4096 tokens for the recompilation study: (batch, length)
RECOMPILE_SHAPES = ((178, 23), (132, 31), (110, 37), (93, 44), (82, 50), (70, 58), (67, 61), (62, 66),
                    (56, 73), (51, 80))
DECODE_LENGTHS = tuple(range(8, 18))
QUICK_DECODE_LENGTHS = (8, 13)
TOLERANCE = {torch.float32: 1e-5, torch.float64: 1e-12}

ScoreMod = Callable[[Tensor, Tensor, Tensor, Tensor, Tensor], Tensor]
Attend = Callable[[Tensor, Tensor, Tensor], Tensor]


# ----------------------------------------------------------------------------- inputs
@dataclass
class Batch:
    """q (scaled), k, v of shape (batch, heads, tgt, d_h), the context and fairseq's causal mask."""

    q: Tensor
    k: Tensor
    v: Tensor
    ctx: PositionContext
    attn_mask: Optional[Tensor]
    causal: bool


def build_term(name: str, heads: int, causal: bool, seed: int) -> nn.Module:
    """The real term module, its parameters drawn at random (they start at zero in training)."""
    torch.manual_seed(seed)
    term: nn.Module
    if name == "absolute":
        term = DirectAbsolutePositionBias(heads, MAX_POSITIONS)
    elif name == "relative":
        term = DirectRelativePositionBias(heads, MAX_POSITIONS)
    elif name == "t5":
        term = T5RelativeBias(heads, T5_BUCKETS, T5_MAX_DISTANCE, bidirectional=not causal)
    elif name == "alibi":
        return LinearDistanceBias(heads, causal)
    elif name == "da":
        term = DistanceAwareScaling(heads)
    else:
        raise ValueError(f"unknown term {name}")
    with torch.no_grad():
        for parameter in term.parameters():
            parameter.normal_(0.0, 0.5)
    return term


def build_attention(term: nn.Module, heads: int, head_dim: int, dtype: torch.dtype,
                    device: torch.device) -> PositionAwareMultiheadAttention:
    """The module whose explicit and fused paths are the references (eval mode: no dropout)."""
    terms = PositionTerms()
    terms.add(term)
    attn = PositionAwareMultiheadAttention(heads * head_dim, heads, terms)
    return attn.to(device=device, dtype=dtype).eval()


def padding_of(batch: int, length: int, causal: bool) -> Tensor:
    """Rows 1, 4, 7, ... padded by length/6, rows 2, 5, ... by length/3; rows 0, 3, ... unpadded.
    Left padding on the bidirectional side (fairseq's source), right on the causal side (targets)."""
    padding = torch.zeros(batch, length, dtype=torch.bool)
    for row in range(batch):
        pads = (row % 3) * length // 6
        if pads:
            padding[row, length - pads:] = causal
            padding[row, :pads] = not causal
    return padding


def build_batch(dims: Tuple[int, int, int, int], causal: bool, dtype: torch.dtype, device: torch.device,
                seed: int, tgt_len: Optional[int] = None) -> Batch:
    """Random q, k, v; ``tgt_len`` < length: the last queries only (incremental decoding, unpadded)."""
    batch, heads, length, head_dim = dims
    generator = torch.Generator().manual_seed(seed)
    tgt = length if tgt_len is None else tgt_len
    q = torch.randn(batch, heads, tgt, head_dim, generator=generator) * head_dim ** -0.5
    k, v = (torch.randn(batch, heads, length, head_dim, generator=generator) for _ in range(2))
    padding = padding_of(batch, length, causal) if tgt_len is None else torch.zeros(batch, length, dtype=torch.bool)
    ctx = PositionContext.from_padding(padding.to(device), right_padded=causal)
    attn_mask = None
    if causal and tgt_len is None:
        attn_mask = torch.triu(torch.full((length, length), float("-inf")), 1).to(device=device, dtype=dtype)
    q, k, v = (t.to(device=device, dtype=dtype) for t in (q, k, v))
    return Batch(q, k, v, ctx, attn_mask, causal)


# ----------------------------------------------------------------------------- score_mods
def score_mod_of(term: nn.Module, ctx: PositionContext, tgt_len: int, src_len: int) -> ScoreMod:
    """The term as a flex_attention score_mod: ``score`` is the scaled logit of query ``q_idx`` (the
    ``q_idx + offset``-th token, offset = src_len - tgt_len, a tensor so that decoding steps share a
    graph) and key ``kv_idx``."""
    offset = torch.tensor(src_len - tgt_len, device=ctx.padding_mask.device)
    if isinstance(term, DirectAbsolutePositionBias):
        return absolute_score_mod(term.weight, ctx, tgt_len, src_len, offset)
    if isinstance(term, DirectRelativePositionBias):
        weight, zero = term.weight, term.max_positions - 1

        def relative(score: Tensor, b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
            return score + weight[h, q_idx + offset - kv_idx + zero]
        return relative
    if isinstance(term, T5RelativeBias):
        span = MAX_POSITIONS - 1
        distance = torch.arange(-span, span + 1, device=ctx.padding_mask.device)
        bucket = relative_buckets(distance, term.num_buckets, term.max_distance, term.bidirectional)
        table = term.table

        def t5(score: Tensor, b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
            return score + table[bucket[q_idx + offset - kv_idx + span], h]
        return t5
    if isinstance(term, LinearDistanceBias):
        return alibi_score_mod(term.slopes, term.causal, offset)
    if isinstance(term, DistanceAwareScaling):
        return distance_aware_score_mod(term.w, term.v, offset)
    raise TypeError(f"no score_mod for {type(term).__name__}")


def absolute_score_mod(weight: Tensor, ctx: PositionContext, tgt_len: int, src_len: int,
                       offset: Tensor) -> ScoreMod:
    """``score + A^p[h, pos(i), pos(j)]`` with token positions (left padding shifts them)."""
    if ctx.positions is None:
        def absolute(score: Tensor, b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
            return score + weight[h, q_idx + offset, kv_idx]
        return absolute
    query_pos, key_pos = ctx.query_key_positions(tgt_len, src_len)

    def absolute_padded(score: Tensor, b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        return score + weight[h, query_pos[b, q_idx], key_pos[b, kv_idx]]
    return absolute_padded


def alibi_score_mod(slopes: Tensor, causal: bool, offset: Tensor) -> ScoreMod:
    """``score - m_h (i - j)`` (keys after i are masked) or ``- m_h |i - j|`` (bidirectional)."""
    def alibi(score: Tensor, b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        distance = q_idx + offset - kv_idx
        distance = distance.clamp(min=0) if causal else distance.abs()
        return score - slopes[h] * distance.to(score.dtype)
    return alibi


def distance_aware_score_mod(w: Tensor, v: Tensor, offset: Tensor) -> ScoreMod:
    """``ReLU(score) * f(w |i - j|; v)``, ``f = exp(softplus(v) - softplus(v - x))`` (eq. 5-6, in
    log space as ``distance_aware.py``)."""
    def distance_aware(score: Tensor, b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        distance = (q_idx + offset - kv_idx).abs().to(score.dtype)
        v_h, w_h = v[h].to(score.dtype), w[h].to(score.dtype)
        coefficient = torch.exp(F.softplus(v_h) - F.softplus(v_h - w_h * distance))
        return torch.relu(score) * coefficient
    return distance_aware


def mask_mod_of(ctx: PositionContext, causal: bool, tgt_len: int, src_len: int) -> Callable[..., Tensor]:
    """True where query ``q_idx`` may see key ``kv_idx``: not a pad, not in the future if causal."""
    key_padding = ctx.padding_mask[:, :src_len]
    offset = torch.tensor(src_len - tgt_len, device=key_padding.device)

    def visible(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        seen = ~key_padding[b, kv_idx]
        return seen & (q_idx + offset >= kv_idx) if causal else seen
    return visible


def masked_score_mod(score_mod: ScoreMod, visible: Callable[..., Tensor]) -> ScoreMod:
    """The masks as ``-inf`` after the term (the kernel's order), for a call without a block mask."""
    def masked(score: Tensor, b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        modified = score_mod(score, b, h, q_idx, kv_idx)
        return torch.where(visible(b, h, q_idx, kv_idx), modified, torch.full_like(modified, float("-inf")))
    return masked


def block_mask_of(batch: Batch) -> BlockMask:
    tgt_len, src_len = batch.q.size(2), batch.k.size(2)
    return create_block_mask(mask_mod_of(batch.ctx, batch.causal, tgt_len, src_len), batch.q.size(0), None,
                             tgt_len, src_len, device=str(batch.q.device))


# ----------------------------------------------------------------------------- paths
def paths_of(attn: PositionAwareMultiheadAttention, term_name: str, batch: Batch,
             compiled: Dict[str, Callable[..., Tensor]]) -> Dict[str, Attend]:
    """Each path as ``attend(q, k, v)``; ``compiled`` maps flex-static / flex-dynamic to compiled
    flex_attention functions (those absent are left out)."""
    term = attn.scaling_term if term_name == "da" else attn.additive_terms[0]
    tgt_len, src_len = batch.q.size(2), batch.k.size(2)
    score_mod = score_mod_of(term, batch.ctx, tgt_len, src_len)
    visible = mask_mod_of(batch.ctx, batch.causal, tgt_len, src_len)
    needs_mask = batch.causal or bool(batch.ctx.padding_mask.any())
    block_mask = block_mask_of(batch) if needs_mask else None
    ctx, attn_mask = batch.ctx, batch.attn_mask
    paths: Dict[str, Attend] = {
        "explicit": lambda q, k, v: attn._attend_explicitly(q, k, v, ctx, attn_mask, None)[0],
        "flex-eager": lambda q, k, v: flex_attention(q, k, v, score_mod=score_mod, block_mask=block_mask, scale=1.0),
    }
    if term_name in ADDITIVE:
        paths["sdpa"] = lambda q, k, v: attn._attend_fused(q, k, v, ctx, attn_mask)
    for name in ("flex-static", "flex-auto"):
        if name in compiled:
            paths[name] = with_block_mask(compiled[name], score_mod, block_mask)
    if "flex-dynamic" in compiled:
        dynamic = compiled["flex-dynamic"]
        dynamic_mod = masked_score_mod(score_mod, visible) if needs_mask else score_mod
        paths["flex-dynamic"] = lambda q, k, v: dynamic(q, k, v, score_mod=dynamic_mod, scale=1.0)
    return paths


def with_block_mask(function: Callable[..., Tensor], score_mod: ScoreMod, block_mask: Optional[BlockMask]) -> Attend:
    return lambda q, k, v: function(q, k, v, score_mod=score_mod, block_mask=block_mask, scale=1.0)


@contextlib.contextmanager
def cpu_backward_guard_lifted() -> Iterator[None]:
    """Let *eager* flex_attention record autograd on CPU, to check the score_mods' gradients.

    torch refuses flex_attention's backward on CPU (its compiled CPU kernel has none). The eager
    implementation is dense math whose backward differentiates the score_mod's joint graph, the graph
    a GPU kernel's backward is generated from; it is a correctness check, not a usable path."""
    original = flex_module._validate_device

    def validate(query: Tensor, key: Tensor, value: Tensor) -> None:
        if query.device.type != "cpu":
            original(query, key, value)
    flex_module._validate_device = validate
    try:
        yield
    finally:
        flex_module._validate_device = original


def flex_backward_refusal(device: torch.device) -> Optional[str]:
    """None where flex_attention accepts inputs that need gradients on ``device``, else torch's message."""
    q = torch.randn(1, 1, 16, 16, device=device, requires_grad=True)
    try:
        flex_attention(q, q, q)
    except NotImplementedError as error:
        return str(error)
    return None


def compile_flex(variants: Sequence[str]) -> Dict[str, Callable[..., Tensor]]:
    """Fresh compiled flex_attention functions (after a dynamo reset, so that no earlier case's
    graphs count against the recompile limit)."""
    torch._dynamo.reset()
    dynamic = {"flex-static": False, "flex-dynamic": True, "flex-auto": None}
    return {name: torch.compile(flex_attention, dynamic=dynamic[name]) for name in variants}


# ----------------------------------------------------------------------------- measurements
def max_diff(a: Tensor, b: Tensor) -> float:
    return float((a.double() - b.double()).abs().max())


def outputs_and_grads(attend: Attend, batch: Batch, params: List[Tensor], cotangent: Tensor,
                      grads: bool) -> List[Tensor]:
    """[output] or [output, dq, dk, dv, d(each parameter)] of ``sum(output * cotangent)``."""
    inputs = [t.detach().requires_grad_(grads) for t in (batch.q, batch.k, batch.v)]
    if not grads:
        with torch.no_grad():
            return [attend(*inputs)]
    out = attend(*inputs)
    return [out.detach(), *torch.autograd.grad((out * cotangent).sum(), inputs + params)]


@dataclass
class Setup:
    """One case in one dtype: the module, the batch, its paths and what the gradients are taken of."""

    attn: PositionAwareMultiheadAttention
    batch: Batch
    paths: Dict[str, Attend]
    params: List[Tensor]
    cotangent: Tensor
    block_mask_s: float
    first_call_s: Dict[str, float]
    failures: Dict[str, str]


def setup_case(term_name: str, dims: Tuple[int, int, int, int], causal: bool, dtype: torch.dtype,
               device: torch.device, compiled_variants: Sequence[str]) -> Setup:
    """Build the case and call each compiled path once (its compile time, no_grad)."""
    term = build_term(term_name, dims[1], causal, seed=1)
    attn = build_attention(term, dims[1], dims[3], dtype, device)
    batch = build_batch(dims, causal, dtype, device, seed=2)
    params = list((attn.scaling_term if term_name == "da" else attn.additive_terms[0]).parameters())
    cotangent = torch.randn(batch.q.shape, generator=torch.Generator().manual_seed(3)).to(device, dtype)
    start = time.perf_counter()
    block_mask_of(batch)
    block_mask_s = time.perf_counter() - start
    compiled = compile_flex(compiled_variants)
    paths = paths_of(attn, term_name, batch, compiled)
    first_call_s: Dict[str, float] = {}
    failures: Dict[str, str] = {}
    for name in compiled_variants:
        try:
            first_call_s[name] = 0.0
            if name == "flex-auto":  # as fairseq's first batch: another shape first, then a dynamic graph
                other = build_batch((dims[0] + 2, dims[1], dims[2] + 8, dims[3]), causal, dtype, device, seed=4)
                warm = paths_of(attn, term_name, other, {name: compiled[name]})[name]
                first_call_s[name] += first_call_seconds(warm, other, device)
            first_call_s[name] += first_call_seconds(paths[name], batch, device)
        except Exception as error:  # a kernel inductor cannot build: recorded, the path left out
            failures[name] = describe(error)
            first_call_s.pop(name)
            del paths[name]
    return Setup(attn, batch, paths, params, cotangent, block_mask_s, first_call_s, failures)


def describe(error: Exception) -> str:
    return f"{type(error).__name__}: {str(error).splitlines()[0][:160]}"


def equality_rows(setup: Setup, grads_of_compiled: bool,
                  truth: Optional[List[Tensor]]) -> Tuple[List[Dict[str, object]], List[Tensor]]:
    """Max abs differences of the output and gradients against ``explicit`` in the setup's dtype and,
    given ``truth`` (fp64 explicit's), against it; returns the rows and explicit's output and gradients."""
    rows: List[Dict[str, object]] = []
    with cpu_backward_guard_lifted():
        reference = outputs_and_grads(setup.paths["explicit"], setup.batch, setup.params, setup.cotangent, True)
        for name, attend in setup.paths.items():
            with_grads = name in ("explicit", "sdpa", "flex-eager") or grads_of_compiled
            rows.append(compare(name, attend, setup, reference, truth, with_grads))
    dtype = str(setup.batch.q.dtype).replace("torch.", "")
    rows += [{"path": name, "dtype": dtype, "error": error} for name, error in setup.failures.items()]
    for row in rows:
        judge(row, setup.batch.q.dtype, rows[0])
    return rows, reference


def compare(name: str, attend: Attend, setup: Setup, reference: List[Tensor], truth: Optional[List[Tensor]],
            with_grads: bool) -> Dict[str, object]:
    row: Dict[str, object] = {"path": name, "dtype": str(setup.batch.q.dtype).replace("torch.", "")}
    try:
        got = outputs_and_grads(attend, setup.batch, setup.params, setup.cotangent, with_grads)
    except Exception as error:  # a path the device or dtype does not support: recorded, not fatal
        row["error"] = describe(error)
        return row
    labels = ["out", "dq", "dk", "dv"] + [f"d{p}" for p in range(len(setup.params))]
    row["diff"] = {label: max_diff(g, r) for label, g, r in zip(labels, got, reference)}
    row["scale"] = {label: max(1.0, float(r.abs().max())) for label, r in zip(labels, reference[:len(got)])}
    if truth is not None:
        row["vs_fp64"] = {label: max_diff(g, t) for label, g, t in zip(labels, got, truth)}
    return row


def judge(row: Dict[str, object], dtype: torch.dtype, explicit: Dict[str, object]) -> None:
    """Within tolerance: every difference to explicit <= TOLERANCE * max(1, |explicit|); a gradient of
    a fp32 path also passes when its error against fp64 explicit is at most 4x explicit fp32's own (a
    parameter's gradient sums ~batch * T^2 products, so the fp32 summation order alone moves it)."""
    if "error" in row:
        return
    diff: Dict[str, float] = row["diff"]  # type: ignore[assignment]
    scale: Dict[str, float] = row["scale"]  # type: ignore[assignment]
    vs_fp64: Dict[str, float] = row.get("vs_fp64", {})  # type: ignore[assignment]
    own: Dict[str, float] = explicit.get("vs_fp64", {})  # type: ignore[assignment]

    def passes(label: str) -> bool:
        if diff[label] <= TOLERANCE[dtype] * scale[label]:
            return True
        return label != "out" and label in vs_fp64 and vs_fp64[label] <= 4 * own[label]
    row["within_tolerance"] = all(passes(label) for label in diff)
    grads = [label for label in vs_fp64 if label != "out" and own.get(label)]
    if grads:
        row["fp64_error_ratio"] = max(vs_fp64[label] / own[label] for label in grads)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def paired_timings(calls: Dict[str, Callable[[], object]], rounds: int, baseline: str,
                   device: torch.device) -> Dict[str, Dict[str, float]]:
    """Median seconds per call and median of per-round ratios to ``baseline``; the order of the paths
    rotates every round (the machine is shared: ratios of neighbouring calls, never absolutes alone)."""
    for call in calls.values():  # warm-up (compiles)
        call()
    sync(device)
    times: Dict[str, List[float]] = {name: [] for name in calls}
    names = list(calls)
    for round_index in range(rounds):
        shift = round_index % len(names)
        for name in names[shift:] + names[:shift]:
            start = time.perf_counter()
            calls[name]()
            sync(device)
            times[name].append(time.perf_counter() - start)
    return {name: {"median_s": statistics.median(values),
                   "ratio": statistics.median(t / b for t, b in zip(values, times[baseline]))}
            for name, values in times.items()}


def first_call_seconds(attend: Attend, batch: Batch, device: torch.device) -> float:
    """Wall time of the first call (compilation included)."""
    start = time.perf_counter()
    with torch.no_grad():
        attend(batch.q, batch.k, batch.v)
    sync(device)
    return time.perf_counter() - start


def timing_rows(setup: Setup, rounds: int, threads: Sequence[int], training_paths: Sequence[str],
                device: torch.device) -> List[Dict[str, object]]:
    """Inference (no_grad) timings of every path, training timings of ``training_paths``, per thread count."""
    batch, paths = setup.batch, setup.paths
    rows: List[Dict[str, object]] = []
    for count in threads:
        torch.set_num_threads(count)
        with torch.no_grad():
            inference = paired_timings({name: lambda a=attend: a(batch.q, batch.k, batch.v)
                                        for name, attend in paths.items()}, rounds, "explicit", device)
        training = paired_timings(
            {name: lambda a=paths[name]: outputs_and_grads(a, batch, setup.params, setup.cotangent, True)
             for name in training_paths if name in paths}, rounds, "explicit", device)
        rows.append({"threads": count, "inference": inference, "training": training,
                     "block_mask_s": setup.block_mask_s, "first_call_s": setup.first_call_s,
                     "load": os.getloadavg()[0]})
    torch.set_num_threads(1)
    return rows


# ----------------------------------------------------------------------------- memory (subprocess)
def _status_kib(name: str) -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(name + ":"):
                return int(line.split()[1])
    raise KeyError(name)


def memory_probe(spec: Dict[str, object]) -> Dict[str, object]:
    """Peak RSS growth (MiB) of one call, measured in this (fresh) process after two warm-up calls."""
    term_name, causal, path = str(spec["term"]), bool(spec["causal"]), str(spec["path"])
    dims = tuple(spec["dims"])  # type: ignore[arg-type]
    compiled = [path] if path.startswith("flex-") and path != "flex-eager" else []
    setup = setup_case(term_name, dims, causal, torch.float32, torch.device("cpu"), compiled)  # type: ignore[arg-type]
    attend, training = setup.paths[path], spec["mode"] == "training"

    def call() -> List[Tensor]:
        return outputs_and_grads(attend, setup.batch, setup.params, setup.cotangent, training)
    for _ in range(2):
        call()
    gc.collect()
    with open("/proc/self/clear_refs", "w") as refs:
        refs.write("5")  # VmHWM := VmRSS
    base = _status_kib("VmRSS")
    result = call()
    peak = _status_kib("VmHWM")
    del result
    return {**spec, "growth_mib": (peak - base) / 1024}


def run_memory_probe(spec: Dict[str, object]) -> Dict[str, object]:
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536", OMP_NUM_THREADS="1")
    completed = subprocess.run([sys.executable, __file__, "--memory-probe", json.dumps(spec)],
                               capture_output=True, text=True, env=env, timeout=900)
    if completed.returncode != 0:
        return {**spec, "error": completed.stderr.strip().splitlines()[-1][:200]}
    return json.loads(completed.stdout.strip().splitlines()[-1])


# ----------------------------------------------------------------------------- recompilation, decoding
def recompile_probe(variant: str) -> Dict[str, object]:
    """Over RECOMPILE_SHAPES (a DA layer, bidirectional, left padding): new graphs, first and second
    call time per shape and max difference to explicit. ``variant``: flex-static / flex-auto
    (dynamic=None) with a block mask, flex-dynamic with the masks in the score_mod, or
    flex-dynamic-block (dynamic=True with a block mask)."""
    torch.set_num_threads(1)
    device = torch.device("cpu")
    base = "flex-dynamic" if variant == "flex-dynamic-block" else variant
    function = compile_flex([base])[base]
    per_shape = []
    for batch_size, length in RECOMPILE_SHAPES:
        dims = (batch_size, 4, length, 64)
        attn = build_attention(build_term("da", 4, False, seed=1), 4, 64, torch.float32, device)
        batch = build_batch(dims, False, torch.float32, device, seed=length)
        score_mod = score_mod_of(attn.scaling_term, batch.ctx, length, length)
        if variant == "flex-dynamic":
            visible = mask_mod_of(batch.ctx, False, length, length)
            kwargs = {"score_mod": masked_score_mod(score_mod, visible)}
        else:
            kwargs = {"score_mod": score_mod, "block_mask": block_mask_of(batch)}
        graphs = counters["stats"]["unique_graphs"]
        row: Dict[str, object] = {"dims": list(dims)}
        try:
            with torch.no_grad():
                row["first_s"] = timed(lambda: function(batch.q, batch.k, batch.v, scale=1.0, **kwargs))
                row["second_s"] = timed(lambda: function(batch.q, batch.k, batch.v, scale=1.0, **kwargs))
                out = function(batch.q, batch.k, batch.v, scale=1.0, **kwargs)
                explicit = attn._attend_explicitly(batch.q, batch.k, batch.v, batch.ctx, None, None)[0]
                row["diff"] = max_diff(out, explicit)
                calls = {"flex": lambda: function(batch.q, batch.k, batch.v, scale=1.0, **kwargs),
                         "explicit": lambda: attn._attend_explicitly(batch.q, batch.k, batch.v, batch.ctx, None, None)}
                row["ratio"] = paired_timings(calls, 3, "explicit", device)["flex"]["ratio"]
        except Exception as error:
            row["error"] = describe(error)
            per_shape.append(row)
            break
        row["new_graphs"] = counters["stats"]["unique_graphs"] - graphs
        per_shape.append(row)
    return {"variant": variant, "shapes": per_shape}


def timed(call: Callable[[], object]) -> float:
    start = time.perf_counter()
    call()
    return time.perf_counter() - start


def run_recompile_probe(variant: str) -> Dict[str, object]:
    """In a fresh process, with inductor's caches off: cold compile latency."""
    env = dict(os.environ, TORCHINDUCTOR_FORCE_DISABLE_CACHES="1", OMP_NUM_THREADS="1")
    completed = subprocess.run([sys.executable, __file__, "--recompile-probe", variant],
                               capture_output=True, text=True, env=env, timeout=1800)
    if completed.returncode != 0:
        return {"variant": variant, "error": completed.stderr.strip().splitlines()[-1][:200]}
    return json.loads(completed.stdout.strip().splitlines()[-1])


def decoding_rows(term_name: str, device: torch.device, compiled: bool, rounds: int,
                  lengths: Sequence[int]) -> Dict[str, object]:
    """Incremental decoding on the causal side: one query (the last token) against src_len keys for
    each src_len in ``lengths``, no_grad; flex-dynamic without a block mask (nothing to mask).
    New graphs are counted over the compiled path's calls only (eager flex_attention traces too)."""
    functions = compile_flex(["flex-dynamic"] if compiled else [])
    cases = []
    for src_len in lengths:
        attn = build_attention(build_term(term_name, 4, True, seed=1), 4, 64, torch.float32, device)
        batch = build_batch((6, 4, src_len, 64), True, torch.float32, device, seed=src_len, tgt_len=1)
        cases.append((batch, paths_of(attn, term_name, batch, functions)))
    graphs, first_call, failure = counters["stats"]["unique_graphs"], 0.0, None
    for batch, paths in cases:
        if compiled and failure is None:
            try:
                first_call = max(first_call, first_call_seconds(paths["flex-dynamic"], batch, device))
            except Exception as error:  # a kernel inductor cannot build: recorded, the path left out
                failure = describe(error)
    new_graphs = counters["stats"]["unique_graphs"] - graphs
    for _, paths in cases:
        if failure is not None:
            del paths["flex-dynamic"]
    worst: Dict[str, float] = {}
    ratios: Dict[str, List[float]] = {}
    for batch, paths in cases:
        with torch.no_grad():
            reference = paths["explicit"](batch.q, batch.k, batch.v)
            for name, attend in paths.items():
                worst[name] = max(worst.get(name, 0.0), max_diff(attend(batch.q, batch.k, batch.v), reference))
            timing = paired_timings({name: lambda a=attend: a(batch.q, batch.k, batch.v)
                                     for name, attend in paths.items()}, rounds, "explicit", device)
        for name, measured in timing.items():
            ratios.setdefault(name, []).append(measured["ratio"])
    return {"term": term_name, "lengths": list(lengths), "max_diff": worst, "new_graphs": new_graphs,
            "slowest_first_call_s": first_call, "failure": failure,
            "ratio": {name: statistics.median(values) for name, values in ratios.items()}}


# ----------------------------------------------------------------------------- report
@dataclass
class Results:
    setting: Dict[str, object]
    equality: List[Dict[str, object]] = field(default_factory=list)
    timing: List[Dict[str, object]] = field(default_factory=list)
    memory: List[Dict[str, object]] = field(default_factory=list)
    recompile: List[Dict[str, object]] = field(default_factory=list)
    decoding: List[Dict[str, object]] = field(default_factory=list)


def fmt(value: Optional[float], pattern: str = "{:.1e}") -> str:
    return "-" if value is None else pattern.format(value)


def equality_table(rows: List[Dict[str, object]]) -> List[str]:
    """Worst case over shapes and masks per (term, path, dtype)."""
    worst: Dict[Tuple[str, str, str], Dict[str, object]] = {}
    for row in rows:
        key = (str(row["term"]), str(row["path"]), str(row["dtype"]))
        entry = worst.setdefault(key, {"ok": True, "error": None})
        if "error" in row:
            entry["error"] = row["error"]
            continue
        diff: Dict[str, float] = row["diff"]  # type: ignore[assignment]
        vs_fp64: Dict[str, float] = row.get("vs_fp64", {})  # type: ignore[assignment]
        updates = {"out": diff.get("out"), "qkv": worst_of(diff, ("dq", "dk", "dv")),
                   "param": worst_of(diff, [x for x in diff if x[1:].isdigit()]),
                   "fp64 out": vs_fp64.get("out"), "fp64 ratio": row.get("fp64_error_ratio")}
        for name, value in updates.items():
            if value is not None:
                entry[name] = max(value, entry.get(name) or 0.0)  # type: ignore[operator]
        entry["ok"] = entry["ok"] and bool(row["within_tolerance"])
    lines = ["| term | path | dtype | out | grad q,k,v | grad term params | fp32 out vs fp64 explicit | "
             "fp32 grads' error vs fp64, / explicit fp32's | within tol. |", "|---|---|---|---|---|---|---|---|---|"]
    for (term, path, dtype), e in sorted(worst.items()):
        if e["error"]:
            lines.append(f"| {term} | {path} | {dtype} | {e['error']} | | | | | n/a |")
            continue
        lines.append(f"| {term} | {path} | {dtype} | {fmt(e.get('out'))} | {fmt(e.get('qkv'))} | "
                     f"{fmt(e.get('param'))} | {fmt(e.get('fp64 out'))} | {fmt(e.get('fp64 ratio'), '{:.2f}')} | "
                     f"{'yes' if e['ok'] else 'NO'} |")
    return lines


def worst_of(diff: Dict[str, float], labels: Sequence[str]) -> Optional[float]:
    return max((diff[label] for label in labels if label in diff), default=None)


def timing_table(rows: List[Dict[str, object]], mode: str) -> List[str]:
    names = sorted({name for row in rows for name in row[mode]} - {"explicit"})  # type: ignore[attr-defined]
    header = ["shape", "causal", "term", "threads", "explicit ms"] + [n + " / explicit" for n in names]
    if mode == "inference":
        header += ["block mask ms", "first call s (compile)", "load"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in rows:
        timing: Dict[str, Dict[str, float]] = row[mode]  # type: ignore[assignment]
        if "explicit" not in timing:
            continue
        cells = [str(tuple(row["dims"])), str(row["causal"]), str(row["term"]), str(row["threads"]),
                 f"{timing['explicit']['median_s'] * 1e3:.1f}"]
        cells += [fmt(timing[n]["ratio"], "{:.2f}") if n in timing else "-" for n in names]
        if mode == "inference":
            first: Dict[str, float] = row["first_call_s"]  # type: ignore[assignment]
            cells += [f"{float(row['block_mask_s']) * 1e3:.1f}",
                      ", ".join(f"{k} {v:.1f}" for k, v in first.items()) or "-", f"{float(row['load']):.1f}"]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def render(results: Results) -> str:
    out = ["## flex_attention evaluation (scripts/flex_attention_eval.py)", "",
           "Setting: " + ", ".join(f"{k} = {v}" for k, v in results.setting.items()), "",
           "### Equality against the explicit path (max abs difference, worst over shapes and masks)", "",
           *equality_table(results.equality), "",
           "### Inference (torch.no_grad), median of paired per-round ratios to explicit", "",
           *timing_table(results.timing, "inference"), "",
           "### Training (forward + backward), median of paired ratios to explicit", "",
           f"flex_attention's backward on this device: {results.setting['flex backward']}", "",
           *timing_table(results.timing, "training"), ""]
    if results.memory:
        out += ["### Peak RSS growth of one call (fresh subprocess, MiB)", "",
                "| shape | causal | term | mode | path | growth MiB |", "|---|---|---|---|---|---|"]
        out += [f"| {tuple(m['dims'])} | {m['causal']} | {m['term']} | {m['mode']} | {m['path']} | "
                f"{fmt(m.get('growth_mib'), '{:.0f}') if 'error' not in m else m['error']} |" for m in results.memory]
        out.append("")
    if results.recompile:
        out += ["### Recompilation over 10 batch shapes (DA, bidirectional, caches off)", "",
                "| variant | (batch, length) | new graphs | first call s | second call s "
                "| / explicit (3 paired rounds) | max diff |",
                "|---|---|---|---|---|---|---|"]
        for probe in results.recompile:
            for shape in probe.get("shapes", [{"error": probe.get("error")}]):  # type: ignore[union-attr]
                if "error" in shape:
                    out.append(f"| {probe['variant']} | {shape.get('dims', '-')} | {shape['error']} | | | | |")
                    continue
                out.append(f"| {probe['variant']} | {tuple(shape['dims'][::2])} | {shape['new_graphs']} | "
                           f"{shape['first_s']:.2f} | {shape['second_s']:.4f} | {shape['ratio']:.2f} | "
                           f"{fmt(shape['diff'])} |")
        out.append("")
    if results.decoding:
        names = sorted({n for d in results.decoding for n in d["ratio"]} - {"explicit"})  # type: ignore[attr-defined]
        out += [f"### Incremental decoding (tgt_len = 1, src_len {results.decoding[0]['lengths']}, batch 6, no_grad)",
                "", f"| term | compiled graphs over the steps | slowest first call s | "
                f"{' | '.join(n + ' / explicit' for n in names)} | "
                f"{' | '.join('max diff ' + n for n in names)} | compile failure |",
                "|---|---|---|" + "---|" * (2 * len(names) + 1)]
        for d in results.decoding:
            ratio, diff = d["ratio"], d["max_diff"]
            out.append(f"| {d['term']} | {d['new_graphs']} | {float(d['slowest_first_call_s']):.1f} | "
                       f"{' | '.join(fmt(ratio.get(n), '{:.2f}') for n in names)} | "  # type: ignore[union-attr]
                       f"{' | '.join(fmt(diff.get(n)) for n in names)} | "  # type: ignore[union-attr]
                       f"{d['failure'] or '-'} |")
    return "\n".join(out) + "\n"


# ----------------------------------------------------------------------------- main
def evaluate(args: argparse.Namespace, checkpoint: Callable[[Results], None]) -> Results:
    """Every measurement; ``checkpoint`` is called with the results so far after each stage."""
    device = torch.device(args.device)
    torch.set_num_threads(1)
    refusal = flex_backward_refusal(device)
    shapes = QUICK_SHAPES if args.quick else FULL_SHAPES
    threads = (1,) if args.quick else (1, 2)
    rounds = args.rounds or (3 if args.quick else 7)
    results = Results(setting={
        "torch": torch.__version__, "device": str(device), "quick": args.quick, "rounds": rounds,
        "load average at start": round(os.getloadavg()[0], 2), "cpus": os.cpu_count(),
        "flex backward": refusal or "supported"})
    for (shape_name, dims), causal, term_name in (
            (s, c, t) for s in shapes.items() for c in (False, True) for t in TERMS):
        if args.terms and term_name not in args.terms:
            continue
        variants = flex_variants(args.quick, term_name, causal)
        print(f"[{shape_name} causal={causal} {term_name}] compiled: {variants}", file=sys.stderr, flush=True)
        label = {"term": term_name, "causal": causal, "dims": list(dims)}
        exact = setup_case(term_name, dims, causal, torch.float64, device, variants[:1])
        rows64, truth = equality_rows(exact, refusal is None, None)
        del exact
        setup = setup_case(term_name, dims, causal, torch.float32, device, variants)
        rows32, _ = equality_rows(setup, refusal is None, truth)
        results.equality += [{**row, **label} for row in rows64 + rows32]
        training = ["explicit", "sdpa"] + ([] if refusal else list(variants))
        results.timing += [{**row, **label} for row in timing_rows(setup, rounds, threads, training, device)]
        checkpoint(results)
    lengths = QUICK_DECODE_LENGTHS if args.quick else DECODE_LENGTHS
    results.decoding = [decoding_rows(t, device, not args.quick, rounds, lengths)
                        for t in TERMS if not args.terms or t in args.terms]
    checkpoint(results)
    if not args.quick and device.type == "cpu":
        results.memory = memory_specs(args.terms or TERMS, refusal is None)
        checkpoint(results)
        results.recompile = [run_recompile_probe(v)
                             for v in ("flex-static", "flex-auto", "flex-dynamic", "flex-dynamic-block")]
    return results


def flex_variants(quick: bool, term_name: str, causal: bool) -> List[str]:
    if quick:
        return ["flex-static"] if (term_name, causal) in QUICK_COMPILED else []
    return ["flex-static", "flex-auto", "flex-dynamic"]


def memory_specs(terms: Sequence[str], flex_trains: bool) -> List[Dict[str, object]]:
    dims = FULL_SHAPES["wmt-like 8x4x512x64"]
    specs = []
    for term_name in terms:
        inference = ["explicit", "flex-static"] + (["sdpa"] if term_name in ADDITIVE else [])
        training = ["explicit"] + (["sdpa"] if term_name in ADDITIVE else [])
        training += ["flex-static"] if flex_trains else []
        for mode, paths in (("inference", inference), ("training", training)):
            specs += [{"term": term_name, "dims": list(dims), "causal": False, "mode": mode, "path": path}
                      for path in paths]
    print(f"memory: {len(specs)} subprocesses", file=sys.stderr, flush=True)
    return [run_memory_probe(spec) for spec in specs]


def main(argv: Optional[List[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="tiny shapes, 2 compiled cases, 1 thread (< 60 s)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--terms", nargs="*", choices=TERMS, help="only these terms (default: all)")
    parser.add_argument("--rounds", type=int, help="timing rounds (default 3 quick, 7 full)")
    parser.add_argument("--output", help="write the markdown report here (default: stdout)")
    parser.add_argument("--json", help="write every measurement as JSON here")
    parser.add_argument("--memory-probe", help=argparse.SUPPRESS)
    parser.add_argument("--recompile-probe", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    logging.getLogger("filelock").setLevel(logging.WARNING)  # inductor's cache locks, one line each
    if args.memory_probe:
        torch.set_num_threads(1)
        print(json.dumps(memory_probe(json.loads(args.memory_probe))))
        return
    if args.recompile_probe:
        print(json.dumps(recompile_probe(args.recompile_probe)))
        return
    def save(results: Results) -> None:
        if args.json:
            with open(args.json, "w") as handle:
                json.dump(asdict(results), handle, indent=1)
    results = evaluate(args, save)
    save(results)
    report = render(results)
    if args.output:
        with open(args.output, "w") as handle:
            handle.write(report)
    else:
        print(report)


if __name__ == "__main__":
    main()
