"""The fused attention paths, checked where they run against the explicit path.

A layer's fused path (``flex_attention``, or SDPA with its biases folded into the mask) computes what
the explicit path computes only as far as the kernels under it are right, and public PyTorch issues
list silent errors in exactly the cases position terms produce (docs/benchmark.md, "Defences"): wrong
or NaN gradients of a compiled ``flex_attention`` at some lengths, lost bias gradients, NaN query
gradients of cuDNN's SDPA with a mask. Users run torch versions and GPUs no test here sees, so the
kernel checks itself where it runs:

The first time a configuration takes a fused path in a process, :func:`fused_path_agrees` runs that
path and the explicit path on a random batch of awkward lengths (:data:`CHECK_LENGTHS`, padded as the
side pads, with the side's causality and the side data its terms need) and compares the outputs and, for a
layer in training mode, the gradients of the queries, keys, values, the layer input (where a token-difference
bias computes its values from it) and every learned position parameter the path reads (each against the largest
gradient of its module's parameters), with a tolerance by dtype. A configuration is everything the kernels see:
the layer's terms and their sizes, the path (with the SDPA path's form: its causal kernel, no mask, a boolean or
a float mask), which tokens are queries (all, the last one, several after cached keys), dtype, device, causality,
padding side (or no pad at all) and training mode; the check's batch is shaped so (the same form), and the layers
of one configuration share one check. A fused path that fails to run (a compilation error, such as Triton's
"No valid triton configs" where the kernel needs more shared memory than the GPU has) counts as a mismatch. On a
mismatch or a non-finite value, ``--{side}-attention-self-check``:

- ``warn`` (default): one warning line (torch and CUDA versions, the layer, the path, the largest
  error) and the configuration takes the explicit path for the rest of the process;
- ``error``: :class:`FusedKernelMismatch`, one line, the process stops;
- ``off``: no check.

The check runs eagerly (not inside a ``torch.compile`` graph, where the verdict already reached is
used), with its own random generator (the training's random stream is untouched) and its own
saved-tensor hooks (activation checkpointing's do not see it). It synchronises with the device once,
when it compares.
"""

import logging
import time
from dataclasses import dataclass
from typing import Dict, Hashable, List, Optional, Tuple

import torch
from torch import Tensor, nn

from posattn.position_context import PositionContext
from posattn.errors import UserError

logger = logging.getLogger(__name__)

#: ``--{side}-attention-self-check`` values
SELF_CHECK_CHOICES = ("warn", "error", "off")
#: the sentence lengths of the check's batch: neither a multiple of 64 nor of 128, two paddings apart
CHECK_LENGTHS = (200, 137)
#: the largest error allowed, relative to the largest magnitude of the explicit path's tensor. In half precision
#: both paths round and accumulate differently (a bias table's gradient sums every pair of a head): on an H200
#: flex_attention and the explicit path differed by up to 4.7e-2 in bf16 and 1.4e-6 in fp32 where both were
#: right; a wrong kernel (NaN, a lost gradient, wrong values) differs by far more
TOLERANCE = {torch.float64: 1e-9, torch.float32: 2e-3, torch.float16: 5e-2, torch.bfloat16: 1e-1}


class FusedKernelMismatch(UserError, RuntimeError):
    """A fused attention path disagrees with the explicit path (``--{side}-attention-self-check error``)."""


@dataclass(frozen=True)
class Comparison:
    """A fused path against the explicit path on one batch.

    Attributes:
        errors: per compared tensor (``output``, ``grad q``, ``grad <term>.<parameter>``, ...), the largest
            absolute difference relative to the largest magnitude of the explicit path's tensor (for a learned
            parameter, of its module's parameters' gradients: :func:`module_scales`); ``inf``
            where either path gave a non-finite value.
        tolerance: the largest relative error allowed for the dtype.
        seconds: the time both paths and the comparison took.
        failure: the error the fused path raised (its type and first line), empty when it ran.
    """

    errors: Dict[str, float]
    tolerance: float
    seconds: float
    failure: str = ""

    @property
    def largest(self) -> Tuple[str, float]:
        """The compared tensor with the largest error, and that error (``inf`` when the fused path failed)."""
        if self.failure:
            return "output", float("inf")
        return max(self.errors.items(), key=lambda item: item[1])

    @property
    def agrees(self) -> bool:
        return self.largest[1] <= self.tolerance

    def finding(self) -> str:
        """What a mismatch report says was found."""
        if self.failure:
            return f"it failed to run ({self.failure})"
        name, error = self.largest
        return f"largest relative error {error:.1e} in {name} (tolerance {self.tolerance:.0e})"


def relative_error(got: Tensor, expected: Tensor, scale: Optional[Tensor] = None) -> float:
    """``max |got - expected| / scale`` in fp64, ``scale`` by default ``max |expected|``; ``inf`` where either has a
    non-finite value."""
    got, expected = got.detach().double(), expected.detach().double()
    if not (torch.isfinite(got).all() and torch.isfinite(expected).all()):
        return float("inf")
    scale = (expected.abs().max() if scale is None else scale).clamp(min=torch.finfo(torch.float32).tiny)
    return float((got - expected).abs().max() / scale) if expected.numel() else 0.0


def module_scales(names: List[str], gradients: List[Tensor]) -> Dict[str, Tensor]:
    """The largest magnitude among the gradients of each module's parameters (``<module>.<parameter>`` names),
    the scale a parameter's gradient error is measured against. A parameter's own magnitude would not do: one
    whose exact gradient is zero, such as the output bias of a bias network (a constant per head added to every
    logit of a row, which the softmax cancels), leaves both paths with rounding noise only, and noise against
    noise reads as a relative error near 1."""
    scales: Dict[str, Tensor] = {}
    for name, gradient in zip(names, gradients):
        module = name.split(".")[0]
        largest = gradient.detach().double().abs().max() if gradient.numel() else torch.zeros((), dtype=torch.float64)
        scales[module] = largest if module not in scales else torch.maximum(scales[module], largest)
    return scales


def check_lengths(attn: nn.Module) -> Tuple[int, ...]:
    """:data:`CHECK_LENGTHS`, shortened to the longest sequence the side of ``attn`` takes and to the fewest
    positions a term of it was built for: the check costs no more than the model's own batches (a term that
    computes a network on every pair of positions costs its length squared)."""
    limits = [term.max_positions for term in attn.score_terms() if term.max_positions is not None]
    limits += [attn.max_positions] if getattr(attn, "max_positions", None) else []
    longest = min([CHECK_LENGTHS[0], *limits])
    return (longest, max(1, longest * CHECK_LENGTHS[1] // CHECK_LENGTHS[0]))


def causal_mask(length: int, dtype: torch.dtype, device: torch.device) -> Tensor:
    """fairseq's future mask: ``-inf`` above the diagonal."""
    return torch.triu(torch.full((length, length), float("-inf"), dtype=dtype, device=device), 1)


def query_rows(tgt_len: int, src_len: int) -> str:
    """``last``: one query, the last token (a decoding step); ``all``: every token (a full pass); ``some``: the last
    ``tgt_len`` of ``src_len`` tokens (several queries after cached keys). The SDPA path's form depends on it."""
    if tgt_len == 1:
        return "last"
    return "all" if tgt_len == src_len else "some"


def queries_of(rows: str, length: int) -> int:
    """The number of queries of the check's batch of ``length`` tokens for ``rows``: all, the last one, or the
    last half."""
    return {"all": length, "last": 1, "some": (length + 1) // 2}[rows]


def query_key_size(attn: nn.Module, device: torch.device, dtype: torch.dtype) -> int:
    """The size of a query or key after the query/key transforms of ``attn`` (a transform may change it: the paths
    then multiply queries and keys of another size than the values): theirs of one zero key at position 0."""
    probe = torch.zeros(1, attn.num_heads, 1, attn.head_dim, device=device, dtype=dtype)
    with torch.no_grad():
        for term in attn.query_key_terms:
            probe = term(probe, probe, PositionContext.unpadded(1, device))[1]
    return probe.size(-1)


def compare_paths(attn: nn.Module, path: str, ctx: PositionContext, dtype: torch.dtype, gradients: bool,
                  seed: int = 0, rows: str = "all") -> Comparison:
    """Run ``path`` and the explicit path of ``attn`` on random queries, keys and values of the batch
    ``ctx`` describes, and compare the outputs of the real query rows and, with ``gradients``, the
    gradients of q, k, v and of the learned position parameters (of a random projection of the output; a
    parameter's against the largest gradient of its module's parameters, :func:`module_scales`).
    ``rows``: which tokens are queries (:func:`query_rows`; the keys are every token)."""
    start = time.perf_counter()
    device, (batch, length) = ctx.padding_mask.device, ctx.padding_mask.shape
    queries = queries_of(rows, length)
    generator = torch.Generator().manual_seed(seed)

    def draw(*shape: int) -> Tensor:
        return torch.randn(*shape, generator=generator, dtype=torch.float32).to(device=device, dtype=dtype)

    sizes = [query_key_size(attn, device, dtype)] * 2 + [attn.head_dim]  # as the query/key transforms leave them
    qkv = [draw(batch, attn.num_heads, n, size).requires_grad_(gradients)
           for n, size in zip((queries, length, length), sizes)]
    qkv[0] = qkv[0].detach().mul_(attn.head_dim ** -0.5).requires_grad_(gradients)  # scaled, as projected
    real_rows = ~ctx.query_padding_mask(queries)[:, None, :, None]
    weights = draw(batch, attn.num_heads, queries, attn.head_dim).masked_fill(~real_rows, 0)
    attn_mask = causal_mask(length, dtype, device)[length - queries:] if ctx.causal and queries > 1 else None
    parameters = attn.learned_position_parameters()
    # the layer input, only where token-difference or content-logits terms make their values of it
    layer_input = draw(length, batch, attn.embed_dim).requires_grad_(gradients) if attn.reads_layer_input() else None
    inputs = [*qkv, *([] if layer_input is None else [layer_input]), *(parameter for _, parameter in parameters)]
    names = ["q", "k", "v", *([] if layer_input is None else ["x"]), *(name for name, _ in parameters)]

    def run(kernel_path: str) -> List[Tensor]:
        out = attn.path_output(kernel_path, *qkv, ctx, attn_mask, layer_input)
        results = [out.masked_fill(~real_rows, 0)]
        if gradients:
            grads = torch.autograd.grad((out.float() * weights.float()).sum(), inputs, allow_unused=True)
            results += [torch.zeros_like(x) if g is None else g for g, x in zip(grads, inputs)]
        return results

    tolerance = TOLERANCE.get(dtype, TOLERANCE[torch.float32])
    with torch.enable_grad() if gradients else torch.no_grad(), \
            torch.autograd.graph.saved_tensors_hooks(lambda saved: saved, lambda saved: saved):
        try:
            fused = run(path)
        except Exception as error:  # noqa: BLE001 (whatever the kernel raises, the explicit path is right)
            failure = f"{type(error).__name__}: {next(iter(str(error).splitlines()), '')}"
            return Comparison({}, tolerance, time.perf_counter() - start, failure)
        explicit = run(attn.reference_path)
    errors = {"output": relative_error(fused[0], explicit[0])}
    scales = module_scales(names, explicit[1:])  # q, k, v and x are modules of their own
    errors.update((f"grad {name}", relative_error(got, expected, scales[name.split(".")[0]]))
                  for name, got, expected in zip(names, fused[1:], explicit[1:]))
    return Comparison(errors, tolerance, time.perf_counter() - start)


def configuration_key(attn: nn.Module, path: str, ctx: PositionContext, dtype: torch.dtype, rows: str,
                      form: Optional[str]) -> Hashable:
    """What the kernels of one call see, besides the batch's sizes (see the module docstring)."""
    return (attn.configuration(), path, form, rows, dtype, ctx.padding_mask.device, ctx.causal, ctx.positions is None,
            ctx.pad_free, attn.training)


#: the verdict of every configuration checked in this process
_VERDICTS: Dict[Hashable, bool] = {}


def fused_path_agrees(attn: nn.Module, path: str, ctx: PositionContext, dtype: torch.dtype, tgt_len: int,
                      src_len: int, form: Optional[str] = None) -> bool:
    """Whether ``attn`` may take the fused ``path`` (in the SDPA path's ``form``) for the last ``tgt_len`` of
    ``src_len`` tokens of a batch like ``ctx`` in ``dtype``: checked the first time its configuration comes
    (module docstring), remembered for the rest of the process."""
    if attn.self_check == "off":
        return True
    rows = query_rows(tgt_len, src_len)
    key = configuration_key(attn, path, ctx, dtype, rows, form)
    if torch.compiler.is_compiling():
        return _VERDICTS.get(key, True)
    verdict = _VERDICTS.get(key)
    if verdict is None:
        verdict = _VERDICTS[key] = self_check(attn, path, ctx, dtype, rows, form)
    return verdict


def self_check(attn: nn.Module, path: str, ctx: PositionContext, dtype: torch.dtype, rows: str = "all",
               form: Optional[str] = None) -> bool:
    """Compare ``path`` (in ``form``) with the explicit path once on the check's batch, shaped as ``ctx`` (its
    padding side, or no pad at all) with ``rows`` of its tokens as queries; say what was found."""
    example = PositionContext.example(check_lengths(attn), ctx.positions is None, ctx.causal,
                                      ctx.padding_mask.device, attn.all_terms(), pad_free=ctx.pad_free)
    comparison = compare_paths(attn, path, example, dtype, gradients=attn.training, rows=rows)
    name, error = comparison.largest
    kernel, lengths = path if form is None else f"{path} ({form})", check_lengths(attn)
    batch = f"{len(lengths)} x {max(lengths)} tokens" if ctx.pad_free else f"lengths {'/'.join(map(str, lengths))}"
    what = (f"{attn.where}: the {kernel} kernel against the explicit path "
            f"({describe(dtype, ctx, attn.training, rows)}, {batch})")
    if comparison.agrees:
        logger.info("%s: self-check passed in %.3f s (largest relative error %.1e, %s)",
                    what, comparison.seconds, error, name)
        return True
    found = f"{comparison.finding()}; {versions()}"
    flag = f"--{attn.where.split()[0]}-attention-self-check"
    if attn.self_check == "error":
        raise FusedKernelMismatch(f"{what} disagrees: {found}. Stopped by {flag} error; {flag} warn "
                                  "falls back to the explicit path instead")
    logger.warning("%s disagrees: %s. This configuration takes the explicit path for the rest of the process "
                   "(%s error stops instead)", what, found, flag)
    return False


def describe(dtype: torch.dtype, ctx: PositionContext, training: bool, rows: str = "all") -> str:
    padding = "no pads" if ctx.pad_free else "right-padded" if ctx.positions is None else "left-padded"
    side = "causal" if ctx.causal else "bidirectional"
    queries = {"all": "", "last": ", the last token's query", "some": ", queries after cached keys"}[rows]
    return f"{str(dtype).replace('torch.', '')}, {side}, {padding}{queries}, {'training' if training else 'scoring'}"


def versions() -> str:
    """torch, CUDA and the device, as a mismatch report names them."""
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else "no GPU"
    return f"torch {torch.__version__}, CUDA {torch.version.cuda}, {device}"


def forget_verdicts() -> None:
    """Forget every verdict: the next fused call of each configuration is checked again."""
    _VERDICTS.clear()
