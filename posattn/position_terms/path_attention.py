"""PaTH attention (Yang et al. 2025, "PaTH Attention: Position Encoding via Accumulating Householder
Transformations", NeurIPS 2025, arXiv 2505.16381), as flash-linear-attention's ``PaTHAttention`` layer
computes it (``fla/layers/path_attn.py``).

Each token t of a head has a data-dependent Householder-like transform ``H_t = I - beta_t w_t w_t^T`` (``w_t`` of
unit norm, ``beta_t`` in (0, 2)), and the content logit of query i and key j <= i is

    q_i^T H_i H_{i-1} ... H_{j+1} k_j / sqrt(d_h)

(no transform for j = i): each key is carried to the query through the transforms of the tokens after it, which
takes the place of a position encoding. As fla's layer computes them from the token's input ``x_t`` to the
attention layer:

- ``w_t``: a low-rank projection (``embed_dim -> 32 -> heads * d_h``, no biases), a causal depthwise convolution of
  3 taps over the tokens (no bias) and SiLU (fla's ``ShortConvolution``), then per head ``w / sqrt(|w|^2 + 1e-6)``
  (fla's ``l2_norm``), in fp32 at least;
- ``beta_t = 2 sigmoid(u_h . x_t + b_h)`` per head (negative eigenvalues ``1 - beta`` allowed), in fp32 at least;
- initialised as fla's models initialise every linear map and convolution: weights normal with standard deviation
  0.02, biases 0.

Not taken from fla's layer: its optional QK-norm and grouped key/value heads (the kernel's heads each have their own
``w`` and ``beta``), and its projections without biases (the front-end's projections are used as they are).

Choices:

- **a kind of its own**, :class:`~posattn.position_terms.base.ContentLogits`: the term computes the content logits
  from ``q``, ``k`` and its per-token values ``(w, beta)``; the other steps of the kernel (biases, masks, softmax)
  follow unchanged, so that PaTH-FoX is this term with the forget gate's bias added (``--decoder-forget-gate``);
- **the chunked form** (the paper's compact UT representation of products of Householder matrices, as fla's
  ``naive_path_attn`` computes it): in chunks of :data:`CHUNK` tokens,
  the transforms of a chunk are one UT/WY product ``I - W^T T (beta W)`` (``T`` from a unit lower-triangular
  solve); queries are carried back to the start of their chunk, keys forward to its end, and the chunks' products
  carry keys from chunk to chunk, one diagonal of chunk pairs per step. Time O(L^2 d_h) and, for the backward pass,
  O(L^2 d_h / C) memory besides the L x L logits; no (L x L x d_h) tensor and no product of matrices per pair;
- **padding**: a pad's transform is the identity (``beta = 0``) and its convolution input 0, so a padded batch gives
  each sentence what it computes alone (a left-padded sentence's convolution starts from zeros, as at a sequence
  start);
- **incremental decoding** caches the keys carried up to the last token (the kernel's ``prev_key``; each step
  multiplies them by the new tokens' transforms, O(L d_h) per step and head) and the convolution's last two inputs;
- **causal sides only**: the transforms accumulate along the order of the tokens (the option exists on the decoder
  only);
- **the fused kernel**: on CUDA, where flash-linear-attention is installed (the extra ``fla``: ``fla-core``), a
  causal full pass without attention dropout of a batch padded on the right or not at all (a language model's
  training and scoring blocks: fairseq's, plain PyTorch's without a padding mask) takes its
  ``parallel_path_attn`` (the kernel's ``library`` path, self-checked against the explicit path), the forget gate's
  values as its gate ``g`` (its increments, added unscaled as ours: the queries come scaled, its ``scale`` is 1).
  It takes heads of 16, 32, 64 or 128 and casts ``w`` to fp16 inside; a prompt's pass in decoding keeps its
  ``k_cache`` (the keys carried to the last token) as the explicit path keeps its own; decoding steps, left-padded
  batches and other sizes take the explicit path.
"""

from typing import Any, Dict, List, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from posattn.library_kernels import optional_module, triton_runs_on
from posattn.position_context import PositionContext
from posattn.position_terms.base import ContentLogits, LibraryAttention, at_least_fp32, same_dtype
from posattn.position_terms.quantities import BARS, Quantity
from posattn.position_terms.registry import LayerSpec, MethodOption, PositionMethod, register

#: fla's ``initializer_range``: the standard deviation of every weight's initialisation
INIT_STD = 0.02
#: the rank of fla's low-rank ``w`` projection (``use_low_rank_w``), its convolution's taps (``conv_size``) and the
#: epsilon of its ``l2_norm``
LOW_RANK, CONV_SIZE, NORM_EPS = 32, 3, 1e-6
#: tokens per chunk of the chunked form (fla's kernels use 32 or 64)
CHUNK = 64
#: flash-linear-attention's module of the fused kernel, the head sizes and the query dtypes it takes
FLA_MODULE = "fla.ops.path_attn"
FLA_HEAD_SIZES = (16, 32, 64, 128)
FLA_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


class PathTransforms(ContentLogits, LibraryAttention):
    """``q_i^T H_i ... H_{j+1} k_j`` with ``H_t = I - beta_t w_t w_t^T`` of each head, computed from the layer input;
    on CUDA, where flash-linear-attention is installed, the whole attention in its fused kernel (module docstring)."""

    cache_key = "prev_content_path_conv"
    library_kernel = "flash-linear-attention's parallel_path_attn"
    takes_gate = True

    def __init__(self, embed_dim: int, num_heads: int, head_dim: int, chunk: int = CHUNK):
        super().__init__()
        self.num_heads, self.head_dim, self.chunk = num_heads, head_dim, chunk
        width = num_heads * head_dim
        self.w_proj = nn.Sequential(nn.Linear(embed_dim, LOW_RANK, bias=False), nn.Linear(LOW_RANK, width, bias=False))
        self.w_conv = nn.Conv1d(width, width, CONV_SIZE, groups=width, bias=False)
        self.beta_proj = nn.Linear(embed_dim, num_heads)
        for module in (*self.w_proj, self.w_conv, self.beta_proj):
            nn.init.normal_(module.weight, std=INIT_STD)
        nn.init.zeros_(self.beta_proj.bias)

    def token_values(self, x: Tensor, ctx: PositionContext, earlier: Optional[Tensor]) -> Tuple[Any, Tensor]:
        """``(w, beta)`` of the current tokens, ``(batch, heads, tgt_len, head_dim)`` and ``(batch, heads, tgt_len)`` in
        fp32 at least (identity transforms at pads), and the convolution's last inputs ``(batch, width, 2)`` to
        cache; ``earlier``: those of the tokens before (None: zeros, a sequence start)."""
        length, batch = x.size(0), x.size(1)
        pads = ctx.query_padding_mask(length)  # batch x tgt_len
        inputs = self.w_proj(x).permute(1, 2, 0).masked_fill(pads[:, None, :], 0.0)  # batch x width x tgt_len
        if earlier is None:
            earlier = inputs.new_zeros(batch, inputs.size(1), CONV_SIZE - 1)
        window = torch.cat([same_dtype(earlier, inputs.dtype), inputs], dim=-1)
        dtype = at_least_fp32(inputs.dtype)
        # the convolution as a sum of shifted windows (conv1d is slow on the CPU), in fp32 at least: at fla's
        # initialisation its outputs are ~1e-4, subnormal in fp16
        taps, wide = same_dtype(self.w_conv.weight[:, 0], dtype), same_dtype(window, dtype)  # width x CONV_SIZE
        conv = sum(wide[..., tap:tap + length] * taps[:, tap, None] for tap in range(CONV_SIZE))
        w = F.silu(conv).unflatten(1, (self.num_heads, self.head_dim)).transpose(-1, -2)
        w = w * torch.rsqrt(w.pow(2).sum(-1, keepdim=True) + NORM_EPS)
        beta_logits = self.beta_proj(x)
        beta = 2 * torch.sigmoid(same_dtype(beta_logits, at_least_fp32(beta_logits.dtype))).permute(1, 2, 0)
        beta = beta.masked_fill(pads[:, None, :], 0.0)
        return (w, beta), window[..., window.size(-1) - (CONV_SIZE - 1):]

    def content_logits(self, q: Tensor, k: Tensor, values: Any, keep_keys: bool) -> Tuple[Tensor, Optional[Tensor]]:
        w, beta = values
        dtype = torch.promote_types(at_least_fp32(q.dtype), w.dtype)
        tgt_len = q.size(2)
        cached = same_dtype(k[:, :, : k.size(2) - tgt_len], dtype)
        with torch.autocast(q.device.type, enabled=False):  # the products of transforms in fp32 at least
            logits, keys = path_logits(same_dtype(q, dtype), same_dtype(k[:, :, -tgt_len:], dtype), cached,
                                       same_dtype(w, dtype), same_dtype(beta, dtype), min(self.chunk, tgt_len),
                                       keep_keys)
        return logits, (None if keys is None else same_dtype(keys, k.dtype))

    def library_refusal(self, device: torch.device, dtype: torch.dtype) -> str:
        if not triton_runs_on(device):
            return f"its Triton kernels run on CUDA, not on {device.type}"
        if dtype not in FLA_DTYPES or self.head_dim not in FLA_HEAD_SIZES:
            return (f"it takes heads of {'/'.join(map(str, FLA_HEAD_SIZES))} in fp16, bf16 or fp32, not "
                    f"{self.head_dim} in {str(dtype).replace('torch.', '')}")
        error = optional_module(FLA_MODULE)[1]
        return f"flash-linear-attention is not installed (pip install \".[fla]\"): {error}" if error else ""

    def library_attention(self, q: Tensor, k: Tensor, v: Tensor, ctx: PositionContext, x: Optional[Tensor],
                          gate: Optional[Tensor], keep_state: bool) -> Tuple[Tensor, Optional[Tensor], Dict[str, Any]]:
        """fla's ``parallel_path_attn`` on the scaled queries (its ``scale`` 1), in its layout ``(batch, length,
        heads, d)``, ``w`` and ``beta`` (and the gate) in fp32 as it asks; with ``keep_state`` its ``k_cache``, the
        keys carried to the last token (the explicit path's ``prev_key``), and the convolution's last inputs."""
        (w, beta), window = self.token_values(x, ctx, None)
        tokens_first = [t.transpose(1, 2) for t in (q, k, v, same_dtype(w, torch.float32))]
        gate = None if gate is None else gate.transpose(1, 2)
        kernel = optional_module(FLA_MODULE)[0].parallel_path_attn
        out, carried = kernel(*tokens_first, same_dtype(beta, torch.float32).transpose(1, 2), gate, scale=1.0,
                              use_cache=keep_state)
        if not keep_state:
            return out.transpose(1, 2), None, {}
        return out.transpose(1, 2), same_dtype(carried.transpose(1, 2), k.dtype), {self.cache_key: window}

    def inspect(self, positions: int) -> List[Quantity]:
        """Per head, ``beta`` at a zero input ``2 sigmoid(b_h)`` and the norm of its weights (``w`` and ``beta``
        themselves depend on the tokens)."""
        bias = 2 * torch.sigmoid(self.beta_proj.bias.detach().float().cpu())
        norm = self.beta_proj.weight.detach().float().cpu().norm(dim=1)
        return [Quantity("beta-at-zero-input", bias, BARS, "PaTH's beta 2 sigmoid(b_h) at a zero input", signed=False),
                Quantity("beta-weight-norm", norm, BARS, "norm of beta's weights |u_h|", signed=False)]


def chunked(t: Tensor, chunk: int) -> Tensor:
    """``(batch, heads, length, ...)`` zero-padded to a multiple of ``chunk`` and split: ``(batch, heads, n, chunk,
    ...)`` (a padded token's ``w`` and ``beta`` are 0: an identity transform)."""
    extra = -t.size(2) % chunk
    if extra:
        t = F.pad(t, (0, 0) * (t.dim() - 3) + (0, extra))
    return t.unflatten(2, (t.size(2) // chunk, chunk))


def carry(x: Tensor, w: Tensor, y: Tensor) -> Tensor:
    """Rows ``x`` ``(..., m, d)`` each multiplied by a chunk's product ``P = H_last ... H_first = I - W^T Y``: ``x P^T``
    ``= x - (x Y^T) W``."""
    return x - torch.matmul(torch.matmul(x, y.transpose(-1, -2)), w)


def path_logits(q: Tensor, k: Tensor, cached: Tensor, w: Tensor, beta: Tensor, chunk: int,
                keep_keys: bool) -> Tuple[Tensor, Optional[Tensor]]:
    """``q_i^T H_i ... H_{j+1} k_j`` of the ``T`` current tokens' queries ``q`` (scaled) and keys ``k`` ``(batch, heads,
    T, d)``, after ``cached`` keys ``(batch, heads, m, d)`` already carried up to the token before the first current one
    (their logit: ``q_i^T H_i ... H_first k``), in the chunked UT form (module docstring): ``(batch, heads, T, m + T)``
    logits (zero where a key comes after the query: the kernel masks them), and with ``keep_keys`` every key carried up
    to the last token, ``(batch, heads, m + T, d)``."""
    length, m = q.size(2), cached.size(2)
    qc, kc, wc, bc = (chunked(t, chunk) for t in (q, k, w, beta.unsqueeze(-1)))
    n, eye = qc.size(2), torch.eye(chunk, dtype=q.dtype, device=q.device)
    wb = wc * bc  # beta_s w_s
    strictly = torch.tril(torch.matmul(wb, wc.transpose(-1, -2)), -1)  # (s, r): beta_s w_s . w_r, r < s
    solve = torch.linalg.solve_triangular(eye + strictly, eye.expand_as(strictly), upper=False, unitriangular=True)
    y = torch.matmul(solve, wb)  # the chunk's product is I - W^T Y
    tb = torch.matmul(solve, torch.tril(torch.matmul(wb, kc.transpose(-1, -2)), -1))  # a_s of key j, s > j
    qw = torch.tril(torch.matmul(qc, wc.transpose(-1, -2)))  # q_i . w_s, s <= i
    local = torch.tril(torch.matmul(qc, kc.transpose(-1, -2))) - torch.matmul(qw, tb)
    queries = qc - torch.matmul(qw, y)  # carried back to the start of their chunk
    keys = kc - torch.matmul(tb.transpose(-1, -2), wc)  # carried forward to the end of their chunk
    grid = q.new_zeros(q.size(0), q.size(1), n, n, chunk, chunk)
    index = torch.arange(n, device=q.device)
    grid[:, :, index, index] = local
    earlier = []
    for s in range(1, n + 1):  # the diagonal of chunk pairs (a, a - s); the cached keys are chunk -1
        earlier.append(torch.matmul(queries[:, :, s - 1], cached.transpose(-1, -2)))
        if s < n:
            pairs = torch.matmul(queries[:, :, s:], keys[:, :, : n - s].transpose(-1, -2))
            grid[:, :, index[s:], index[: n - s]] = pairs
            if s < n - 1 or keep_keys:  # keys of chunk b carried through chunk b + s
                keys = torch.cat([carry(keys[:, :, : n - s], wc[:, :, s:], y[:, :, s:]), keys[:, :, n - s:]], dim=2)
        if s < n or keep_keys:
            cached = carry(cached, wc[:, :, s - 1], y[:, :, s - 1])
    current = grid.transpose(3, 4).flatten(4, 5).flatten(2, 3)[:, :, :length, :length]
    logits = torch.cat([torch.stack(earlier, dim=2).flatten(2, 3)[:, :, :length], current], dim=-1)
    if not keep_keys:
        return logits, None
    return logits, torch.cat([cached, keys.flatten(2, 3)[:, :, :length]], dim=2)


class PathAttentionMethod(PositionMethod):
    name = "path-attention"
    citation = "Yang et al. 2025, arXiv 2505.16381"
    sides = ("decoder",)
    options = (
        MethodOption("path_attention", False,
                     "PaTH attention in every layer of the {what} (Yang et al. 2025, as flash-linear-attention's "
                     "layer computes it): the content logit of query i and key j is q_i^T H_i ... H_{{j+1}} k_j with "
                     "H_t = I - beta_t w_t w_t^T of each token's input (w_t: a low-rank projection, a 3-tap causal "
                     "convolution, SiLU, unit norm; beta_t = 2 sigmoid(u_h . x_t + b_h)); with the forget gate "
                     "option: PaTH-FoX (PaTH uses no position embedding: --no-token-positional-embeddings)"),
    )
    benchmark_target = "post_softmax"
    variants = {"path-attention": {"path_attention": True}}
    labels = {"path-attention": "PaTH attention"}

    def is_on(self, options: Any) -> bool:
        return options.path_attention

    def terms(self, options: Any, layer: LayerSpec) -> List[nn.Module]:
        return [PathTransforms(layer.num_heads * layer.head_dim, layer.num_heads, layer.head_dim)]


register(PathAttentionMethod())
