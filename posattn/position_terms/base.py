"""The kinds of position term, in the spirit of x-transformers' position modules.

The attention kernel (:mod:`posattn.attention`) owns projections, masking, softmax
and dropout; a position term only says how it changes one step of that computation:

- :class:`ProjectionScaling`: rescales the projection weights before they are applied;
- :class:`QueryKeyTransform`: transforms the projected queries and keys of the current tokens;
- :class:`AdditiveLogitBias`: adds a bias of the query and key positions (or of the batch's side data) to the
  scaled logits before the masks and the softmax;
- :class:`TokenDifferenceBias`: adds ``c_i - c_j`` of per-token values computed from the layer's input;
- :class:`LogitScaling`: rescales the content logits elementwise;
- :class:`KeyValueAugmentation`: adds a key vector and a value vector per (query, key) pair;
- :class:`RowDependentBias`: adds a bias computed from each query's row of masked logits;
- :class:`PostSoftmaxTransform`: transforms the post-softmax attention matrix;
- :class:`AttentionNormalisation`: turns the masked logits into the weights in place of the softmax;
- :class:`ContentLogits`: computes the content logits itself, from the queries, the keys and per-token values of
  the layer's input;
- :class:`LogitMatrixTransform`: transforms every head's masked logits at once (and, optionally, every head's
  weights after the softmax).

A term of the last kinds may also declare an outside library's fused kernel for the whole attention
(:class:`LibraryAttention`).

Which method is of which kind is docs/design.md's table (a method's file names its kind). Terms read token
geometry from a :class:`~posattn.position_context.PositionContext`, which is built once per
batch and shared by every layer.
"""

import itertools
from typing import Any, Callable, Dict, Hashable, List, NamedTuple, Optional, Tuple

import torch
from torch import Tensor, nn

from posattn.position_context import PositionContext, Preparation
from posattn.errors import UserError
from posattn.position_terms.quantities import Quantity


#: A term's pointwise form, ``modify(score, b, h, q_idx, kv_idx) -> score``: flex_attention's
#: ``score_mod`` (attention-gym's convention). ``score`` is the logit of query ``q_idx`` (the token at
#: index ``q_idx + src_len - tgt_len``) and key ``kv_idx`` of sentence ``b`` in head ``h`` after the
#: earlier steps of docs/methods.md's order; the indices are integer tensors that broadcast against
#: ``score`` (flex_attention hands one element at a time, the dense check a whole grid).
ScoreMod = Callable[[Tensor, Tensor, Tensor, Tensor, Tensor], Tensor]


def apply_densely(score_mod: ScoreMod, scores: Tensor, batch: Optional[int] = None) -> Tensor:
    """``score_mod`` evaluated on every (batch, head, query, key) of ``scores`` at once: the form that
    flex_attention fuses, computed on any device (the tests check it against the explicit path; an additive
    term's default dense form is this of its own ``score_mod``).

    ``batch``: the number of sentences the index ``b`` ranges over where ``scores`` has one row for them all
    (size 1 in its first dimension): the result then has a row per sentence only where ``score_mod`` reads
    ``b``; None: ``b`` ranges over the rows of ``scores``."""
    sizes = list(scores.shape)
    if batch is not None:
        sizes[0] = batch
    index = [torch.arange(n, device=scores.device) for n in sizes]
    b, h, q_idx, kv_idx = (i.view([-1 if d == axis else 1 for d in range(4)]) for axis, i in enumerate(index))
    return score_mod(scores, b, h, q_idx, kv_idx)


def at_least_fp32(dtype: torch.dtype) -> torch.dtype:
    """The dtype that precision-sensitive steps run in: fp32 for fp16/bf16 models, else the model's."""
    return torch.promote_types(dtype, torch.float32)


def same_dtype(tensor: Tensor, dtype: torch.dtype) -> Tensor:
    """``tensor`` in ``dtype``, without a call when it is already (a decoding step counts calls)."""
    return tensor if tensor.dtype == dtype else tensor.to(dtype)


def captured(table: Tensor) -> Tensor:
    """``table`` as a ``score_mod`` captures every learned tensor: in fp32 (fp64 for a double model). flex_attention's
    backward adds a captured tensor's gradient element by element, with atomic adds in the tensor's
    own dtype; a table read at many (query, key) pairs then loses its gradient in bf16 (on an H200, T5's
    table gradient was 24% off). The cast's backward hands the gradient back in the parameter's dtype.

    Learned parameters reach a ``score_mod`` only through tables of one entry per head and distance (or
    position), never as a few per-head scalars: the atomic adds into one address per head serialise
    (on an H200, DA's per-head w and v made its backward 70x its forward at 4,096 tokens).
    """
    return same_dtype(table, at_least_fp32(table.dtype))


def lookup(table: Tensor, dim: int, index: Tensor) -> Tensor:
    """``table`` indexed along ``dim`` by ``index`` of any shape, whose dims replace ``dim``.

    The same as advanced indexing, but through ``index_select``, whose backward adds with
    ``index_add_``: the backward of advanced indexing serialises over repeated indices on CUDA
    (pytorch/pytorch#41162), and a position table is read at the same few entries thousands of
    times per batch (on an H100, two position-position tables' lookups took 3.5 ms of a 20 ms
    train step this way).
    """
    return table.index_select(dim, index.flatten()).unflatten(dim, index.shape)


#: the standard deviation of a unit normal truncated at +-2, by which Keras' truncated "normal"
#: initialisers divide their scale so that the truncated draw keeps the intended variance
TRUNCATED_NORMAL_STD = 0.87962566103423978


def glorot_(tensor: Tensor, fan_in: float, fan_out: float, distribution: str) -> Tensor:
    """Glorot and Bengio's initialisation with explicit fans, in place, exactly as Keras 2.2.4's
    ``glorot_uniform`` / ``glorot_normal`` (``VarianceScaling(1, "fan_avg")``) draw it, which is what
    Dufter et al.'s released code uses: variance ``2 / (fan_in + fan_out)``, ``uniform`` on
    ``+-sqrt(6 / (fan_in + fan_out))`` or ``normal`` truncated at two standard deviations (the
    standard deviation divided by :data:`TRUNCATED_NORMAL_STD` so that the truncated draw keeps the
    variance). The fans are given because a per-head parameter block is not a 2-d weight matrix."""
    scale = 1.0 / max(1.0, (fan_in + fan_out) / 2)
    with torch.no_grad():
        if distribution == "uniform":
            limit = (3.0 * scale) ** 0.5
            return tensor.uniform_(-limit, limit)
        std = scale ** 0.5 / TRUNCATED_NORMAL_STD
        return nn.init.trunc_normal_(tensor, 0.0, std, -2 * std, 2 * std)


class SequenceTooLongError(UserError, ValueError):
    """A sequence is longer than the positions a term was built for."""


def check_length(length: int, max_positions: int, term: str) -> None:
    """Raise a clear error instead of an index crash when ``length > max_positions``. The sides
    check every batch first with the option's name (modules know no command-line names)."""
    if length > max_positions:
        raise SequenceTooLongError(
            f"a sequence of {length} tokens is longer than the {max_positions} positions that "
            f"{term} was built for")


class PositionLimitError(UserError, ValueError):
    """Weights learned for t positions loaded into a model built for another t."""


def check_loaded_positions(state_dict: dict, key: str, expected: torch.Size, what: str, positions: int,
                           learned_positions: int) -> None:
    """Refuse, in one line, weights of ``key`` learned for ``learned_positions`` positions where the model
    was built for ``positions`` (a ``max_*_positions`` override): PyTorch would say "size mismatch"."""
    loaded = state_dict.get(key)
    if loaded is not None and loaded.shape != expected:
        raise PositionLimitError(
            f"{what} was learned for {learned_positions} positions and cannot read more (the model was "
            f"built for {positions}, e.g. by --model-overrides max_target_positions / max_source_positions): "
            f"keep the checkpoint's limit and feed sequences of at most {learned_positions} tokens")


class PositionTerm(nn.Module):
    """What every term offers ``posattn-inspect`` (its learned quantities as named arrays) and the
    kernel (its forms: the explicit one of its kind, and where it has one, :meth:`score_mod`)."""

    #: the most tokens the term reads (its tables' positions), None for any number
    max_positions: Optional[int] = None

    def score_mod(self, ctx: PositionContext, q: Tensor, src_len: int) -> Optional[ScoreMod]:
        """The term as a pointwise function of the logit (:data:`ScoreMod`), for the queries ``q``
        ``(batch, heads, tgt_len, head_dim)`` (scaled) of the last ``tgt_len`` of ``src_len`` tokens;
        None where it has no such form (it needs the whole attention matrix, or changes the values)."""
        return None

    def has_score_mod(self) -> bool:
        """The term has a pointwise form (flex_attention may fuse it)."""
        return type(self).score_mod is not PositionTerm.score_mod

    def table_key(self, *built_with: Hashable) -> Tuple[Hashable, ...]:
        """This term's key in the sequence tables of incremental decoding: the term itself (its
        parameters) and whatever else the table is built with (e.g. the dtype)."""
        return (self, *built_with)

    def side_modules(self) -> List[nn.Module]:
        """The side-wide modules the term reads without registering them (the side registers them
        once, e.g. T5's table); the kernel and posattn-inspect count them as the term's."""
        return []

    def example_side_data(self, padding_mask: Tensor) -> Dict[str, Tensor]:
        """The per-token side data, by name, that the term reads from a batch padded as ``padding_mask``
        ``(batch, length)``, made up for an example batch (the kernel self-check's); {} for none."""
        return {}

    def legacy_keys(self) -> Dict[str, str]:
        """State-dict keys of weights the term kept itself in older checkpoints -> their keys under
        the side's ``position_shared`` (the side upgrades them on load); {} for none."""
        return {}

    def inspect(self, positions: int) -> List[Quantity]:
        """The term's learned quantities over the first ``positions`` positions ([] if none)."""
        raise NotImplementedError(
            f"{type(self).__name__} must say what posattn-inspect shows of it: implement "
            "inspect(positions), returning [] when it learns nothing")


class ProjectionScaling(PositionTerm):
    """Kind 5 (step 1): a rescaling of the projection weights ``W_q, W_k, W_v`` before they are applied."""

    def scale_weights(self, q_weight: Tensor, k_weight: Tensor, v_weight: Tensor) -> Tuple[Tensor, Tensor, Tensor]:
        """``W_q, W_k, W_v`` (each ``embed_dim x embed_dim``, a head's output rows together) as applied."""
        raise NotImplementedError


class QueryKeyTransform(PositionTerm):
    """Kind 0: a transform of the queries and keys of the current tokens, before the cache."""

    #: the transform undoes the queries' scale ``1/sqrt(head_dim)`` to read the projected query (it is not linear in
    #: the query): a front-end whose model scales the logits otherwise refuses it
    reads_unscaled_query: bool = False

    def forward(self, q: Tensor, k: Tensor, ctx: PositionContext) -> Tuple[Tensor, Tensor]:
        """``q`` (scaled) and ``k`` of shape ``(batch, heads, tgt_len, head_dim)``; the current
        tokens are the last ``tgt_len`` of the context."""
        raise NotImplementedError


class AdditiveLogitBias(PositionTerm):
    """Kind 1: ``logits + bias``, after the 1/sqrt(d_h) scaling and before masks and softmax.

    A term states its bias once, as its pointwise form :meth:`score_mod`; the dense form that the explicit and
    SDPA paths add (:meth:`forward`) is derived from it by default. A term that overrides :meth:`forward`
    declares a faster dense form of the same bias (prepared once per batch, or sliced from a sequence's table
    in incremental decoding), and the tests prove the two equal, for every registered variant, on both sides,
    padded left and right and for a decoding step's query, in fp64 with gradients:
    ``tests/test_kernel_paths.py::test_score_mod_equals_explicit_logits_and_their_gradients`` (the explicit
    path's logits, which add :meth:`forward`, against the layer's pointwise forms evaluated densely, as
    flex_attention fuses them; exactly in fp64, and in fp32) and
    ``tests/test_kernel_paths.py::test_each_additive_terms_dense_form_equals_the_one_derived_from_its_score_mod``
    (each term's declared :meth:`forward` against the derived one, exactly). A term without a :meth:`score_mod`
    states its bias in :meth:`forward` alone (and never takes flex_attention)."""

    #: the bias is a function of the query and key positions alone (not of the batch's tokens or
    #: parse): in incremental decoding :meth:`bias` slices each step's rows from one table per sequence
    positions_only: bool = True

    #: the number of heads, over which the default :meth:`forward` evaluates :meth:`score_mod` (a term that
    #: declares its own :meth:`forward` need not set it)
    num_heads: Optional[int] = None

    def forward(self, ctx: PositionContext, tgt_len: int, src_len: int) -> Tensor:
        """The bias, broadcastable to ``(batch, heads, tgt_len, src_len)``, in a floating dtype (the kernel
        casts it to the logits').

        By default the term's own :meth:`score_mod` evaluated on a zero grid (:func:`apply_densely`) of
        ``(1, heads, tgt_len, src_len)`` whose sentence index ``b`` ranges over the batch: the bias has a row
        per sentence only where the pointwise form reads ``b`` (token positions of a left-padded side, side
        data). It is computed in the dtype of the term's tensors promoted to fp32 at least (:meth:`dense_dtype`),
        as the kernel's precision-sensitive steps are. The queries it hands :meth:`score_mod` are a placeholder
        without head dimensions: a bias of this kind is not a function of them."""
        name = type(self).__name__
        if not self.has_score_mod():
            raise NotImplementedError(f"{name} states no bias: implement score_mod (the dense form is derived "
                                      "from it) or forward")
        if self.num_heads is None:
            raise NotImplementedError(f"{name} must set num_heads, the heads its score_mod is evaluated over "
                                      "for the dense form (or implement forward)")
        batch, device, dtype = ctx.padding_mask.size(0), ctx.padding_mask.device, self.dense_dtype()
        queries = torch.zeros(batch, self.num_heads, tgt_len, 0, dtype=dtype, device=device)
        score_mod = self.score_mod(ctx, queries, src_len)
        grid = torch.zeros(1, self.num_heads, tgt_len, src_len, dtype=dtype, device=device)
        return apply_densely(score_mod, grid, batch=batch)

    def prepared_bias(self, tgt_len: int, src_len: int) -> Optional[Preparation]:
        """The :class:`~posattn.position_context.Preparation` of a parameter-free bias's dense form for the last
        ``tgt_len`` of ``src_len`` tokens (what :meth:`forward` returns, prepared once per batch), which the SDPA
        path sums with the masks once per batch for every layer; None (the default): the bias is computed in the
        call (it learns, or it is derived from :meth:`score_mod`)."""
        return None

    def dense_dtype(self) -> torch.dtype:
        """The dtype of the default dense form: that of the term's first floating tensor (its own parameters
        and buffers, then its side-wide modules'), fp32 at least; fp32 for a term without one."""
        for module in (self, *self.side_modules()):
            for tensor in itertools.chain(module.parameters(), module.buffers()):
                if tensor.is_floating_point():
                    return at_least_fp32(tensor.dtype)
        return torch.float32

    def bias(self, ctx: PositionContext, tgt_len: int, src_len: int) -> Tensor:
        """What the kernel adds: :meth:`forward`, or in incremental decoding the last ``tgt_len`` of
        ``src_len`` rows of the sequence's table (built by :meth:`forward` for a length bucket)."""
        if not self.positions_only:
            return self(ctx, tgt_len, src_len)
        return ctx.pair_table(self.table_key(), tgt_len, src_len, self)


class TokenDifferenceBias(PositionTerm):
    """Kind 6 (step 4, after the additive biases): ``logits[b, h, i, j] + c[b, h, i] - c[b, h, j]``, where the
    values ``c`` of every token are computed from the layer's input ``x`` in the forward pass (e.g. cumulative
    log forget gates). The values depend on the tokens and need their gradient, so the kernel asks for them in
    every call (activation checkpointing's recomputation computes them again; they are never prepared); in
    incremental decoding it caches them beside the keys and hands the earlier tokens' back. The dense bias and
    the pointwise form are the kind's, written once here; a method only says how its values are computed."""

    def token_values(self, x: Tensor, ctx: PositionContext, earlier: Optional[Tensor]) -> Tensor:
        """``(batch, heads, src_len)`` values of every token, in fp32 at least: ``earlier`` (the values of the
        first ``src_len - tgt_len`` tokens, cached by incremental decoding; None in a full pass) followed by
        those of the current tokens, whose layer input is ``x`` of shape ``(tgt_len, batch, embed_dim)``."""
        raise NotImplementedError

    @staticmethod
    def continued_sums(increments: Tensor, earlier: Optional[Tensor]) -> Tensor:
        """Cumulative sums of the current tokens' ``increments`` ``(batch, heads, tgt_len)`` over the last axis,
        continued from the last of ``earlier`` (the cached tokens' sums; None in a full pass) and following them."""
        values = increments.cumsum(dim=-1)
        if earlier is None:
            return values
        return torch.cat([earlier, values + earlier[..., -1:]], dim=-1)

    def bias_of(self, values: Tensor, tgt_len: int) -> Tensor:
        """``(batch, heads, tgt_len, src_len)``: ``c_i - c_j`` for the last ``tgt_len`` tokens as queries."""
        return values[:, :, -tgt_len:, None] - values[:, :, None, :]

    def score_mod_of(self, values: Tensor, tgt_len: int) -> ScoreMod:
        """``score + c[b, h, i] - c[b, h, j]``, reading two copies of the values (flex_attention failed to lower a
        ``score_mod`` that indexes one grad-requiring tensor twice)."""
        offset = values.size(-1) - tgt_len
        queries, keys = values, values.clone()

        def difference(score: Tensor, b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
            return score + (queries[b, h, q_idx + offset] - keys[b, h, kv_idx]).to(score.dtype)
        return difference

    def has_score_mod(self) -> bool:
        return True


class RowDependentBias(PositionTerm):
    """Kind 7 (step 5, after the masks): a bias computed from each query's row of masked logits and from the
    queries (e.g. positions counted by gates over the whole row): it needs the matrix, so a layer with it
    takes the explicit path. A decoding step's row holds every cached key, so no history is cached."""

    def forward(self, logits: Tensor, q: Tensor, ctx: PositionContext) -> Tensor:
        """The bias for ``logits`` of shape ``(batch, heads, tgt_len, src_len)`` (``-inf`` where a query may not
        see a key) and the scaled queries ``q`` ``(batch, heads, tgt_len, head_dim)``."""
        raise NotImplementedError


class LogitScaling(PositionTerm):
    """Kind 2: an elementwise transform of the content logits, before biases and masks."""

    def forward(self, logits: Tensor, ctx: PositionContext) -> Tensor:
        """Return a new tensor (the kernel adds the biases and masks to it in place)."""
        raise NotImplementedError


class KeyValueAugmentation(PositionTerm):
    """Kind 3: ``e_ij = q_i . (k_j + a^K_ij)`` and ``z_i = sum_j alpha_ij (v_j + a^V_ij)``."""

    #: the value term is on (it needs the attention matrix: no pointwise form then)
    values: bool = True

    def key_logits(self, q: Tensor, ctx: PositionContext, tgt_len: int, src_len: int) -> Tensor:
        """``q . a^K_ij`` for scaled queries ``q`` of shape ``(batch, heads, tgt_len, head_dim)``."""
        raise NotImplementedError

    def value_output(self, probs: Tensor, ctx: PositionContext) -> Tensor:
        """``sum_j alpha_ij a^V_ij`` for ``probs`` of shape ``(batch, heads, tgt_len, src_len)``."""
        raise NotImplementedError


class PostSoftmaxTransform(PositionTerm):
    """Kind 4: a transform of the post-softmax attention matrix ``S``; on a causal side, incremental decoding
    passes the earlier query rows it cached (``history``)."""

    def forward(
        self,
        probs: Tensor,
        blocked: Optional[Tensor],
        ctx: PositionContext,
        history: Optional[Tensor],
    ) -> Tuple[Tensor, Optional[Tensor]]:
        """Return the transformed matrix and the rows to cache for the next decoding step.

        ``probs`` is zero wherever ``blocked`` is True: where a query may not see a key (padding,
        future) or the query row is a pad. ``blocked`` broadcasts to ``probs`` (None: nothing is
        blocked); the transform must give those entries zero weight.
        """
        raise NotImplementedError


class AttentionNormalisation(PositionTerm):
    """Kind 8 (step 6, in place of the softmax): the weights that multiply the values, computed from each query's
    row of masked logits (e.g. a weight per key broken off what the nearer keys leave). At most one per layer; it
    needs the whole row, so a layer with it takes the explicit path. A decoding step's row holds every cached key,
    so nothing is cached."""

    def forward(self, logits: Tensor, ctx: PositionContext) -> Tensor:
        """The weights ``(batch, heads, tgt_len, src_len)`` for ``logits`` of that shape (``-inf`` where a query may
        not see a key; the queries are the last ``tgt_len`` of ``src_len`` tokens), zero where a query may not see
        a key, in :func:`at_least_fp32` of the logits' dtype (the kernel casts them to the values')."""
        raise NotImplementedError


#: the first letters of a content-logits term's decoding-state key (a front-end's cache finds it by them)
CONTENT_STATE_PREFIX = "prev_content"


class ContentLogits(PositionTerm):
    """Kind 9 (step 2, in place of ``q k^T``): the content logits computed by the term from the scaled queries, the
    keys and values it computes from the layer's input ``x`` in every call (e.g. data-dependent transforms of each
    key on its way to each later query). Causal sides only; at most one per layer, which takes the explicit path.
    Incremental decoding caches the keys as the term returns them (brought up to the last token, so that the next
    step continues from them) and the term's own state under :attr:`cache_key`, batch first."""

    #: the decoding-state key of what :meth:`token_values` returns to cache (batch first; it begins with
    #: :data:`CONTENT_STATE_PREFIX`)
    cache_key: str = "prev_content_state"

    def token_values(self, x: Tensor, ctx: PositionContext, earlier: Optional[Tensor]) -> Tuple[Any, Tensor]:
        """The values :meth:`content_logits` reads for the current tokens, whose layer input is ``x`` ``(tgt_len,
        batch, embed_dim)``, and the state to cache for the next step; ``earlier``: the cached state (None: the
        first call)."""
        raise NotImplementedError

    def content_logits(self, q: Tensor, k: Tensor, values: Any, keep_keys: bool) -> Tuple[Tensor, Optional[Tensor]]:
        """The ``(batch, heads, tgt_len, src_len)`` logits of the scaled queries ``q`` of the last ``tgt_len`` tokens
        and the keys ``k`` of every token (the first ``src_len - tgt_len`` as this term returned them at the last
        step): a fresh tensor, in at least fp32; and with ``keep_keys`` the keys to cache, in ``k``'s dtype (else
        None)."""
        raise NotImplementedError


class LibraryAttention:
    """A term whose whole attention an outside library's fused kernel computes (its logits, their normalisation and
    the weighted values: e.g. PaTH in flash-linear-attention's ``parallel_path_attn``), declared in the method's file
    beside its explicit form. A layer takes it (the kernel's ``library`` path) on a causal full pass of a batch padded
    on the right or not at all (a causal query never reads the pads after it), without attention dropout or the
    weights asked for, where its other terms are query/key transforms and projection scalings (and token-difference
    biases, where :attr:`takes_gate`), and the term finds the library and the call's device, dtype and sizes its
    kernel's (:meth:`library_refusal`); the kernel's self-check compares it with the explicit path the first time
    each configuration comes. The library is imported only there (:mod:`posattn.library_kernels`)."""

    #: the library's kernel, as the logs name it
    library_kernel: str = ""
    #: the kernel adds the layer's token-difference biases ``c_i - c_j``, given the per-token increments of ``c``
    takes_gate: bool = False

    def library_refusal(self, device: torch.device, dtype: torch.dtype) -> str:
        """Why the library's kernel cannot compute a call on ``device`` in ``dtype`` (the library missing, the
        device, the dtype, the head size); empty where it can."""
        raise NotImplementedError

    def library_attention(self, q: Tensor, k: Tensor, v: Tensor, ctx: PositionContext, x: Optional[Tensor],
                          gate: Optional[Tensor], keep_state: bool) -> Tuple[Tensor, Optional[Tensor], Dict[str, Any]]:
        """The ``(batch, heads, length, head_dim)`` output of a causal full pass (right pads read as tokens) of the
        scaled queries ``q``, keys ``k`` and values ``v`` ``(batch, heads, length, head_dim)``, whose layer input is
        ``x`` ``(length, batch, embed_dim)``; ``gate`` ``(batch, heads, length)`` in fp32: the per-token increments
        of the token-difference biases' values (None: the layer has none). With ``keep_state`` (a prompt's pass in
        decoding) also the keys to cache, as the explicit path would (None: ``k`` itself), and the term's own
        decoding state by key; else None and {}."""
        raise NotImplementedError


class LogitParts(NamedTuple):
    """What a :class:`LogitMatrixTransform` that reads them gets beside the logits, each ``(batch or 1, heads,
    tgt_len, src_len)``, finite everywhere (before the masks): the content logits (steps 2-3: ``q k^T / sqrt(d_h)``,
    the key terms, the logit scaling) and the sum of the layer's additive biases (step 4's)."""

    content: Tensor
    bias: Tensor


class LogitMatrixTransform(PositionTerm):
    """Kind 10 (step 5, last): a transform of every head's masked logits at once, ``(batch, heads, tgt_len,
    src_len)`` (a convolution over queries and keys, an MLP across heads), and optionally of every head's weights
    after the softmax (:meth:`weights`, where :attr:`transforms_weights`: a mixing of heads). It needs the whole
    matrix, so a layer with it takes the explicit path. A layer may hold several, applied in registration order;
    on a causal side each may return rows that incremental decoding hands back as ``history``."""

    #: the term reads the content logits and the layer's additive biases apart (:class:`LogitParts`)
    reads_bias: bool = False
    #: the term also transforms the weights after the softmax (:meth:`weights`)
    transforms_weights: bool = False
    #: the term returns rows for incremental decoding to hand back (a front-end's cache must keep them)
    keeps_rows: bool = False

    def forward(self, logits: Tensor, ctx: PositionContext, history: Optional[Tensor],
                parts: Optional[LogitParts]) -> Tuple[Tensor, Optional[Tensor]]:
        """The new logits of the shape of ``logits`` and the rows to cache for the next decoding step (None: none).

        ``logits`` are zero where a query may not see a key (where they were -inf: the kernel masks those entries
        again afterwards, whatever the term puts there); a padded query row keeps what the kernel gave it (a
        term that reads across rows zeroes it, ``ctx.query_padding_mask``); the queries are the last ``tgt_len`` of
        ``src_len`` tokens. ``history``: what the term returned as rows in the previous decoding step (None in a
        full pass and the first step). ``parts``: where :attr:`reads_bias`, else None."""
        raise NotImplementedError

    def weights(self, probs: Tensor, ctx: PositionContext) -> Tensor:
        """The weights ``(batch, heads, tgt_len, src_len)`` after the softmax, transformed (where
        :attr:`transforms_weights`); zero where ``probs`` is zero in every head (a key a query may not see)."""
        return probs
