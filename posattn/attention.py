"""The attention kernel: multi-head attention with pluggable position terms, on tensors only.

:class:`PositionKernel` is the position method of one attention layer: it holds the layer's terms, grouped
by kind, and computes attention from projected queries, keys and values with them. It knows no front-end
and no method: the fairseq plugin's attention subclasses it together with fairseq's ``MultiheadAttention``
(fairseq's projections and incremental state), :class:`posattn.SelfAttention` together with its own
projections and decoding cache, and :func:`posattn.position_attention` calls it on ``q, k, v`` as
``F.scaled_dot_product_attention`` is called.

Order of operations for one head (docs/methods.md, Order of operations in one head):

1. ``q, k, v`` projections (their weights rescaled by a projection scaling: the front-end's); ``q`` scaled by
   1/sqrt(d_h); the query/key transforms of the current tokens' queries and keys;
2. content logits ``q k^T`` (a content-logits term's in their place) plus the key/value augmentations' key term
   ``q_i . a^K_ij``;
3. logit scaling: an elementwise rescaling of the content logits;
4. additive biases of the query and key positions, then the token-difference biases ``c_i - c_j`` of
   values computed from the layer's input;
5. masks: ``attn_mask`` (causal) and key padding, as -inf *after* the steps above; then a row-dependent bias,
   computed from each query's masked row of logits; then the logit-matrix transforms, every head's logits at once;
6. softmax (or the layer's normalisation in its place); the logit-matrix transforms' mixing of the heads' weights;
   post-softmax transform of the attention matrix, which re-masks;
7. dropout; ``probs v`` plus the augmentations' value term ``sum_j alpha_ij a^V_ij``; output projection
   (the front-end's).

**Kernel paths.** Each term declares its forms (:mod:`~posattn.position_terms.base`):
the explicit one of its kind, and a pointwise ``score_mod`` where it is a function of the logit and
of tensors prepared once per batch. Each call takes the path its terms allow (:meth:`PositionKernel.path`):

- ``sdpa``: ``F.scaled_dot_product_attention``, when only projection scalings, query/key transforms and
  additive biases are on, in the fastest form the call allows (:meth:`PositionKernel.sdpa_form`): with biases,
  one float mask (the parameter-free biases and the blocked entries summed once per batch); without, a boolean
  mask on a padded batch, and on a batch known to hold no pad SDPA's causal kernel (``is_causal=True``) or no
  mask at all;
- ``flex_attention``: on CUDA, when every term that changes a logit has a ``score_mod`` form and at
  least one of them learns or rescales (compiled ``flex_attention``, a block mask for padding and
  causality prepared once per batch; no (length x length) tensor is kept for the backward pass);
- ``library``: an outside library's fused kernel for the whole attention, declared by the layer's content-logits or
  normalisation term (:class:`~posattn.position_terms.base.LibraryAttention`: PaTH in flash-linear-attention's
  ``parallel_path_attn``), on a causal full pass without attention dropout of a batch padded on the right (or not at
  all), where the library is installed and takes the call (on CUDA);
- ``explicit``: steps 2-7 written out, when a term needs the attention matrix (a post-softmax transform, a
  key/value augmentation's value term, a row-dependent bias, a normalisation in place of the softmax) or the call
  asks for the weights.

The kernel choice ``explicit`` forces the explicit path (reference, inspection); ``flex``
forces flex_attention where the terms allow it (on the CPU its eager, unfused implementation: for
checks, and for no-grad scoring). Every path computes the same function (tested). A decoding step
(one query) and a training step with attention dropout take the explicit or SDPA path: flex_attention
has no dropout.

**The position context travels with the call** (:class:`~posattn.position_context.PositionContext`):
nothing of a batch is stored on a module, so every call, including activation checkpointing's recomputation
in the backward pass and a compiled graph, receives exactly the geometry of its batch.

**Decoding state** is a dictionary of batch-first tensors that the front-end keeps per layer and sequence
(fairseq's incremental-state buffer, :class:`posattn.DecodingCache`): ``prev_key`` / ``prev_value``, the rows a
post-softmax transform needs (``prev_attn_rows``), the token-difference terms' values
(:func:`token_values_key`), the rows a logit-matrix transform needs (:func:`logit_rows_key`), a content-logits
term's state (its keys are ``prev_key`` as it returns them: carried to the last token); reordering it along its first
dimension reorders beam search's hypotheses.

Precision: the softmax, and every term's sensitive part, run in fp32 and are cast back to the
model's dtype (fp16 / bf16), as fairseq's own attention does for its softmax. The module keeps nothing of a call.
"""

import functools
import logging
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterator, List, MutableMapping, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from posattn.compat import autocast_dtype
from posattn.kernel_self_check import fused_path_agrees
from posattn.position_context import (
    BlockedBias, BlockedEntries, CausalMask, PositionContext, Preparation, VisibleEntries,
)
from posattn.position_terms.base import (
    AdditiveLogitBias,
    AttentionNormalisation,
    ContentLogits,
    LibraryAttention,
    LogitMatrixTransform,
    LogitParts,
    KeyValueAugmentation,
    LogitScaling,
    PositionTerm,
    PostSoftmaxTransform,
    ProjectionScaling,
    QueryKeyTransform,
    RowDependentBias,
    ScoreMod,
    TokenDifferenceBias,
    at_least_fp32,
    same_dtype,
)


@functools.lru_cache(maxsize=None)
def flex_functions() -> Optional[Tuple[Callable[..., Any], Callable[..., Tensor]]]:
    """torch's ``(create_block_mask, flex_attention)``, or None where this torch has none (before 2.5, or 2.5 on
    Python 3.13, where flex_attention refuses to run without dynamo). Imported on first use, never at import:
    the module pulls in dynamo, which would add seconds to every process that imports posattn (every fairseq
    command with ``--user-dir``) although only the flex path needs it."""
    try:  # PyTorch >= 2.5
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    except ImportError:  # pragma: no cover - older torch: the kernel never takes the flex path
        return None
    if not torch._dynamo.is_dynamo_supported():  # pragma: no cover
        return None
    return create_block_mask, flex_attention


try:  # PyTorch >= 2.3
    from torch.nn.attention import SDPBackend, sdpa_kernel
except ImportError:  # pragma: no cover - older torch: SDPA chooses its backend itself
    SDPBackend = sdpa_kernel = None

logger = logging.getLogger(__name__)

EXPLICIT, SDPA, FLEX, LIBRARY = "explicit", "sdpa", "flex_attention", "library"
#: the SDPA path's forms (:meth:`PositionKernel.sdpa_form`), from the fastest
IS_CAUSAL, NO_MASK, BOOLEAN_MASK, FLOAT_MASK = "is_causal", "no mask", "boolean mask", "float mask"
#: ``--{side}-attention-kernel`` values
KERNEL_CHOICES = ("auto", "explicit", "flex")


@dataclass
class PositionTerms:
    """The position terms of one attention module, grouped by kind."""

    query_key: List[QueryKeyTransform] = field(default_factory=list)
    additive: List[AdditiveLogitBias] = field(default_factory=list)
    scaling: Optional[LogitScaling] = None
    key_value: List[KeyValueAugmentation] = field(default_factory=list)
    post_softmax: Optional[PostSoftmaxTransform] = None
    projection: Optional[ProjectionScaling] = None
    token_difference: List[TokenDifferenceBias] = field(default_factory=list)
    row_dependent: Optional[RowDependentBias] = None
    normalisation: Optional[AttentionNormalisation] = None
    content: Optional[ContentLogits] = None
    logit_matrix: List[LogitMatrixTransform] = field(default_factory=list)
    #: the kernel choice and the self-check (``--{side}-attention-kernel``, ``--{side}-attention-self-check``), and
    #: the layer's name in the log
    #: ("encoder self-attention, layer 0")
    kernel: str = "auto"
    self_check: str = "warn"
    where: str = "self-attention"
    #: the side the terms were built for is causal (None: not said)
    causal: Optional[bool] = None
    #: t, the longest sequence the side takes (None: not said); the self-check's batch is no longer
    max_positions: Optional[int] = None

    def add(self, term: nn.Module) -> None:
        """File ``term`` under its kind (at most one logit scaling, post-softmax transform, projection scaling
        and row-dependent bias)."""
        for kind, listed in ((QueryKeyTransform, self.query_key), (AdditiveLogitBias, self.additive),
                             (KeyValueAugmentation, self.key_value), (TokenDifferenceBias, self.token_difference),
                             (LogitMatrixTransform, self.logit_matrix)):
            if isinstance(term, kind):
                listed.append(term)
                return
        for kind, name in ((LogitScaling, "scaling"), (PostSoftmaxTransform, "post_softmax"),
                           (ProjectionScaling, "projection"), (RowDependentBias, "row_dependent"),
                           (AttentionNormalisation, "normalisation"),
                           (ContentLogits, "content")):
            if isinstance(term, kind):
                if getattr(self, name) is not None:
                    raise ValueError(f"two {name} terms in one layer: {getattr(self, name)} and {term}")
                setattr(self, name, term)
                return
        raise TypeError(f"{type(term).__name__} is of no kind of position term (see position_terms.base)")

    def is_empty(self) -> bool:
        return not (
            self.query_key or self.additive or self.key_value or self.token_difference
            or self.scaling is not None or self.post_softmax is not None or self.projection is not None
            or self.row_dependent is not None or self.normalisation is not None
            or self.content is not None or bool(self.logit_matrix)
        )


def learns(term: PositionTerm) -> bool:
    """``term`` has learned parameters: its own or those of the side-wide modules it reads."""
    return any(True for module in (term, *term.side_modules()) for _ in module.parameters())


class PositionKernel(nn.Module):
    """The position method of one attention layer: its terms, by kind, and the attention they compute.

    Args:
        num_heads: attention heads.
        head_dim: the size of one head's queries, keys and values.
        terms: the layer's terms, grouped by kind (:meth:`~posattn.position_options.SidePositionOptions.build_terms`).
        dropout: the attention dropout's probability.
        embed_dim: the size of the layer input that token-difference terms read (default ``num_heads * head_dim``).

    A front-end that has its own module base (fairseq's ``MultiheadAttention``) subclasses both and calls
    :meth:`hold_terms` after its own ``__init__``; it then provides ``num_heads``, ``head_dim``, ``embed_dim`` and
    ``dropout_module`` (a dropout with a ``p``) itself.
    """

    def __init__(self, num_heads: int, head_dim: int, terms: PositionTerms, dropout: float = 0.0,
                 embed_dim: Optional[int] = None):
        super().__init__()
        self.num_heads, self.head_dim = num_heads, head_dim
        self.embed_dim = num_heads * head_dim if embed_dim is None else embed_dim
        self.dropout_module = nn.Dropout(dropout)
        self.hold_terms(terms)

    def hold_terms(self, terms: PositionTerms) -> None:
        """Register ``terms`` by kind (their names in the state dict: ``additive_terms.0.*``, ...)."""
        self.query_key_terms = nn.ModuleList(terms.query_key)
        self.additive_terms = nn.ModuleList(terms.additive)
        self.scaling_term = terms.scaling
        self.key_value_terms = nn.ModuleList(terms.key_value)
        self.post_softmax_term = terms.post_softmax
        self.projection_term = terms.projection
        self.token_difference_terms = nn.ModuleList(terms.token_difference)
        self.row_term = terms.row_dependent
        self.normalisation_term = terms.normalisation
        self.content_term = terms.content
        self.logit_matrix_terms = nn.ModuleList(terms.logit_matrix)
        if any(term.reads_bias for term in self.logit_matrix_terms) and not self.additive_terms:
            raise ValueError(f"{self.where}: a logit-matrix term reads the layer's additive biases, and it has none")
        self.kernel, self.self_check, self.where = terms.kernel, terms.self_check, terms.where
        self.causal, self.max_positions = terms.causal, terms.max_positions
        #: what the path depends on besides the call: the terms rescale the logits; an additive one learns
        self.rescales = self.scaling_term is not None or len(self.key_value_terms) > 0
        self.learned_bias = any(learns(term) for term in (*self.additive_terms, *self.token_difference_terms))
        self.pointwise = self.fusable()
        # in a tuple: an attribute holding the module itself would register it a second time (in the state dict)
        self._library_term = (self.term_with_library_kernel(),)
        self._logged_paths: set = set()
        self._configuration: Optional[Tuple[str, ...]] = None

    def scale_projections(self, q_w: Tensor, k_w: Tensor, v_w: Tensor) -> Tuple[Tensor, Tensor, Tensor]:
        """Step 1's projection weights, rescaled by the projection scaling where the layer has one."""
        if self.projection_term is None:
            return q_w, k_w, v_w
        return self.projection_term.scale_weights(q_w, k_w, v_w)

    # ----------------------------------------------------------------- kernel paths
    def score_terms(self) -> List[PositionTerm]:
        """The terms that change the logits, in the order of docs/methods.md (keys, scaling, biases)."""
        scaling = [self.scaling_term] if self.scaling_term is not None else []
        row = [self.row_term] if self.row_term is not None else []
        content = [self.content_term] if self.content_term is not None else []
        return [*content, *self.key_value_terms, *scaling, *self.additive_terms, *self.token_difference_terms, *row,
                *self.logit_matrix_terms]

    def all_terms(self) -> List[PositionTerm]:
        """Every term of the layer, of every kind, in the kernel's order."""
        single = [self.projection_term, *self.query_key_terms, *self.score_terms(), self.normalisation_term,
                  self.post_softmax_term]
        return [term for term in single if term is not None]

    def needs_matrix(self) -> bool:
        """A term needs the attention matrix itself: a post-softmax transform, a value term, a row-dependent
        bias or a normalisation in place of the softmax."""
        return (self.post_softmax_term is not None or self.row_term is not None
                or self.normalisation_term is not None
                or self.content_term is not None or len(self.logit_matrix_terms) > 0
                or any(term.values for term in self.key_value_terms))

    def fusable(self) -> bool:
        """Every term of the layer has a pointwise form (``flex`` is allowed)."""
        return not self.needs_matrix() and all(term.has_score_mod() for term in self.score_terms())

    def term_with_library_kernel(self) -> Optional[LibraryAttention]:
        """The layer's term whose library kernel may compute its whole attention: its one content-logits or
        normalisation term that declares one, where every other term is a query/key transform or a projection
        scaling (or a token-difference bias, which the kernel takes as its gate); None otherwise."""
        declared = [term for term in (self.content_term, self.normalisation_term) if isinstance(term, LibraryAttention)]
        if len(declared) != 1:
            return None
        term = declared[0]
        others = [other for other in self.all_terms() if other is not term
                  and not isinstance(other, (QueryKeyTransform, ProjectionScaling))
                  and not (term.takes_gate and isinstance(other, TokenDifferenceBias))]
        return None if others else term

    def token_values(self, x: Tensor, ctx: PositionContext,
                     earlier: Optional[Sequence[Optional[Tensor]]] = None) -> List[Tensor]:
        """The values of each token-difference term for the layer input ``x`` ``(tgt_len, batch, embed_dim)``
        of the current tokens, after the ``earlier`` tokens' (one per term, cached by incremental decoding;
        None: a full pass)."""
        earlier = [None] * len(self.token_difference_terms) if earlier is None else earlier
        return [term.token_values(x, ctx, cached) for term, cached in self.with_values(earlier)]

    def reads_layer_input(self) -> bool:
        """A term computes values from the layer's input ``x`` (a token-difference or a content-logits term)."""
        return len(self.token_difference_terms) > 0 or self.content_term is not None

    def content_of(self, q: Tensor, k: Tensor, ctx: PositionContext, x: Optional[Tensor],
                   state: Optional[MutableMapping[str, Tensor]]) -> Tuple[Optional[Tensor], Optional[Tensor]]:
        """The content-logits term's logits of ``q`` (the current tokens') and ``k`` (every token's), and in decoding
        (``state`` given, its own state updated) the keys to cache; ``(None, None)`` for a layer without one."""
        term = self.content_term
        if term is None:
            return None, None
        earlier = None if state is None or "prev_key" not in state else state.get(term.cache_key)
        if earlier is None and q.size(2) < k.size(2):
            raise ValueError(f"{self.where}: {q.size(2)} queries after {k.size(2) - q.size(2)} cached keys without "
                             f"the content term's state ({term.cache_key}): decode with the layer's whole decoding "
                             "state")
        term_values, kept_state = term.token_values(x, ctx, earlier)
        logits, keys = term.content_logits(q, k, term_values, keep_keys=state is not None)
        if state is not None:
            state[term.cache_key] = kept_state
        return logits, keys

    def with_values(self, values: Sequence[Any]) -> Iterator[Tuple[TokenDifferenceBias, Any]]:
        """The token-difference terms paired with ``values``, one each (a missing one would drop a bias)."""
        if len(values) != len(self.token_difference_terms):
            raise ValueError(f"{self.where}: {len(values)} sets of token values for "
                             f"{len(self.token_difference_terms)} token-difference terms")
        return zip(self.token_difference_terms, values)

    def biases(self, ctx: PositionContext, values: Sequence[Tensor], tgt_len: int, src_len: int) -> Iterator[Tensor]:
        """Step 4's dense biases, in order: each additive term's, then each token-difference term's of its
        ``values``; each broadcastable to ``(batch, heads, tgt_len, src_len)``."""
        for term in self.additive_terms:
            yield term.bias(ctx, tgt_len, src_len)
        for term, token_values in self.with_values(values):
            yield term.bias_of(token_values, tgt_len)

    def path(self, need_weights: bool, device: torch.device, decoding: bool,
             kernel: Optional[str] = None, left_padded: bool = False, dtype: torch.dtype = torch.float32,
             prompt: bool = False) -> Tuple[str, str]:
        """The path of one call and why, derived from what the terms declare (module docstring); ``kernel``:
        ``auto``, ``explicit`` or ``flex`` for this call (None: the layer's); ``left_padded``: a pad may come before
        a real token (the side pads on the left); ``dtype``: the queries'; ``prompt``: a decoding call with no key
        cached yet (a prompt's pass)."""
        kernel = self.kernel if kernel is None else kernel
        if need_weights:
            return EXPLICIT, "the attention weights were asked for"
        if kernel == "explicit":
            return EXPLICIT, "--attention-kernel explicit"
        if self.library_term is not None and kernel == "auto":
            refusal = self.library_refusal(device, decoding and not prompt, left_padded, dtype)
            if not refusal:
                return LIBRARY, self.library_term.library_kernel
            if device.type == "cuda":
                return EXPLICIT, f"{self.library_term.library_kernel} does not take this call: {refusal}"
        if self.needs_matrix():
            return EXPLICIT, ("a term needs the attention matrix (a post-softmax transform, a value term, a "
                              "row-dependent bias, a normalisation in place of the softmax or a logit-matrix "
                              "transform)")
        wanted = kernel == "flex" or (device.type == "cuda" and (self.rescales or self.learned_bias))
        possible = (wanted and self.pointwise and not decoding and not (self.training and self.dropout_module.p > 0)
                    and (device.type == "cuda" or not torch.is_grad_enabled())  # no backward on the CPU
                    and flex_functions() is not None)
        if possible:
            return FLEX, "every term has a score_mod form"
        if not self.rescales:
            return SDPA, "query/key transforms and additive biases only"
        return EXPLICIT, "a term rescales the logits and flex_attention is not used here"

    @property
    def library_term(self) -> Optional[LibraryAttention]:
        """The layer's term whose library kernel may compute its whole attention (:meth:`term_with_library_kernel`)."""
        return self._library_term[0]

    def library_refusal(self, device: torch.device, decoding: bool, left_padded: bool, dtype: torch.dtype) -> str:
        """Why the layer's library kernel does not take a call (empty: it does): a library kernel computes a causal
        full pass without attention dropout and without a padding mask, right for a batch padded on the right (a
        causal query never reads the pads after it; the pads' own rows are not compared: nothing reads them), where
        its term finds the library and the call's device and dtype its kernel's."""
        if decoding:
            return "a decoding step (the explicit path continues from the cached keys)"
        if left_padded:
            return "a left-padded batch (the kernel has no padding mask, and a pad before a token would be read)"
        if self.training and self.dropout_module.p > 0:
            return "attention dropout (the kernel has none)"
        return self.library_term.library_refusal(device, dtype)

    def configuration(self) -> Tuple[str, ...]:
        """What the kernels see of this layer besides dtype, device and the batch: its sizes and its terms
        with theirs (the self-check's key: layers of one configuration share one check)."""
        if self._configuration is None:
            self._configuration = (f"{self.num_heads} x {self.head_dim}",
                                   *(repr(term) for term in self.score_terms()))
        return self._configuration

    def learned_position_parameters(self) -> List[Tuple[str, nn.Parameter]]:
        """The learned parameters the logit-changing terms read (their own and their side-wide modules'),
        named ``<term class>.<parameter>``, each once."""
        named: Dict[int, Tuple[str, nn.Parameter]] = {}
        for term in self.score_terms():
            for module in (term, *term.side_modules()):
                for name, parameter in module.named_parameters():
                    if parameter.requires_grad:
                        named.setdefault(id(parameter), (f"{type(module).__name__}.{name}", parameter))
        return list(named.values())

    def _log_path(self, path: str, reason: str) -> None:
        """Say once per layer and path which path it takes (not from a compiled graph: eager calls say it)."""
        if not torch.compiler.is_compiling() and path not in self._logged_paths:
            self._logged_paths.add(path)
            logger.info("%s: %s kernel (%s)", self.where, path, reason)

    # ----------------------------------------------------------------- one call
    def attend(
        self, q: Tensor, k: Tensor, v: Tensor, ctx: PositionContext, attn_mask: Optional[Tensor] = None,
        state: Optional[MutableMapping[str, Tensor]] = None, x: Optional[Tensor] = None, need_weights: bool = False,
        kernel: Optional[str] = None,
    ) -> Tuple[Tensor, Optional[Tensor], Optional[Tensor]]:
        """Steps 1 (the query/key transforms) to 7 (before the output projection) of the current tokens.

        Args:
            q, k, v: ``(batch, heads, tgt_len, head_dim)`` of the current tokens, ``q`` already scaled.
            ctx: the batch's context; its padding mask covers every key (the cached ones included).
            attn_mask: ``(tgt_len, src_len)`` float, ``-inf`` where a key comes after the query on a causal side
                (fairseq's future mask); None: the context's (the paths take causality from the context; the
                explicit path builds this mask from it where it is needed, once per batch).
            state: the layer's decoding state (module docstring), read and updated in place; None outside
                decoding.
            x: ``(tgt_len, batch, embed_dim)``, the layer input the token-difference terms read (None: the layer
                has none).
            need_weights: return the attention weights (the explicit path).
            kernel: ``auto``, ``explicit`` or ``flex`` for this call (None: the layer's).

        Returns:
            the output ``(batch, heads, tgt_len, head_dim)``; with ``need_weights`` the softmax and the weights
            that multiply V (after the post-softmax transform), each ``(batch, heads, tgt_len, src_len)``.
        """
        check_causality(ctx, attn_mask)
        for term in self.query_key_terms:  # the current tokens', before the cache
            q, k = term(q, k, ctx)
        history: Optional[Tensor] = None
        earlier: List[Optional[Tensor]] = [None] * len(self.token_difference_terms)
        if state is not None and "prev_key" in state:
            k = torch.cat([state["prev_key"], k], dim=2)
            v = torch.cat([state["prev_value"], v], dim=2)
            history = state.get("prev_attn_rows")
            earlier = [state.get(token_values_key(i)) for i in range(len(earlier))]
        if self.reads_layer_input() and x is None:
            raise ValueError(f"{self.where}: a token-difference or content-logits term computes its values from the "
                             "layer input: pass it (x)")
        values = self.token_values(x, ctx, earlier) if self.token_difference_terms else []

        path, reason = self.path(need_weights, q.device, decoding=state is not None, kernel=kernel,
                                 left_padded=ctx.positions is not None, dtype=computed_dtype(q),
                                 prompt=state is not None and "prev_key" not in state)
        form = self.sdpa_form(ctx, q.size(2), k.size(2)) if path == SDPA else None
        if path != EXPLICIT and not fused_path_agrees(self, path, ctx, computed_dtype(q), q.size(2), k.size(2), form):
            kernel_name = path if form is None else f"{path} ({form})"
            path, reason = EXPLICIT, f"the {kernel_name} kernel failed its self-check here"
        self._log_path(path, reason)
        softmax = probs = rows = None
        kept_keys: Optional[Tensor] = None
        if path == EXPLICIT:
            content, kept_keys = self.content_of(q, k, ctx, x, state)
            out, softmax, probs, rows = self._attend_explicitly(q, k, v, ctx, attn_mask, history, values, state=state,
                                                                content=content)
        elif path == LIBRARY:
            out, kept_keys, term_state = self._attend_library(q, k, v, ctx, x, values, keep_state=state is not None)
            if state is not None:
                state.update(term_state)
        elif path == FLEX:
            out = self._attend_flex(q, k, v, ctx, values)
        else:
            out = self._attend_fused(q, k, v, ctx, values)

        if state is not None:
            state["prev_key"], state["prev_value"] = k if kept_keys is None else kept_keys, v
            if rows is not None:
                state["prev_attn_rows"] = rows
            for i, token_values in enumerate(values):
                state[token_values_key(i)] = token_values
        return out, softmax, probs

    #: the path every fused path is checked against (kernel_self_check)
    reference_path = EXPLICIT

    def path_output(self, path: str, q: Tensor, k: Tensor, v: Tensor, ctx: PositionContext,
                    attn_mask: Optional[Tensor], x: Optional[Tensor]) -> Tensor:
        """The ``(batch, heads, tgt_len, head_dim)`` output of ``path`` without dropout (the self-check's
        comparison; ``q`` scaled and transformed, ``k`` and ``v`` of every key, ``x`` the layer input
        ``(tgt_len, batch, embed_dim)`` that the token-difference terms read, None for a layer without them)."""
        values = self.token_values(x, ctx) if self.token_difference_terms else []
        if path == EXPLICIT:
            content = self.content_of(q, k, ctx, x, None)[0]
            return self._attend_explicitly(q, k, v, ctx, attn_mask, None, values, dropout=False, content=content)[0]
        if path == FLEX:
            return self._attend_flex(q, k, v, ctx, values)
        if path == LIBRARY:
            return self._attend_library(q, k, v, ctx, x, values)[0]
        return self._attend_fused(q, k, v, ctx, values, dropout=False)

    def sdpa_form(self, ctx: PositionContext, tgt_len: int, src_len: int) -> str:
        """How the SDPA path calls ``F.scaled_dot_product_attention`` for the last ``tgt_len`` of ``src_len`` tokens
        of the batch ``ctx`` (docs/methods.md, Kernel paths): a layer with biases, one float mask (the biases, and
        -inf where a key is not seen); without biases, on a batch with pads, a boolean mask (True where seen); on a
        pad-free batch (:attr:`~posattn.position_context.PositionContext.pad_free`), SDPA's causal kernel for a
        causal full pass (``is_causal=True``, no mask), no mask where every key is seen (a bidirectional call, or
        one query after the cached keys: the last token), else the bottom-right causal boolean mask (several
        queries after cached keys)."""
        if self.additive_terms or self.token_difference_terms:
            return FLOAT_MASK
        if not ctx.pad_free or (ctx.causal and 1 < tgt_len < src_len):
            return BOOLEAN_MASK
        return IS_CAUSAL if ctx.causal and tgt_len > 1 else NO_MASK

    def _attend_fused(self, q: Tensor, k: Tensor, v: Tensor, ctx: PositionContext, values: Sequence[Tensor],
                      dropout: bool = True) -> Tensor:
        """The SDPA path in the call's :meth:`sdpa_form`; the masks come from the context (its causality and
        padding), as flex_attention's block mask does, never from the caller's ``attn_mask``."""
        tgt_len, src_len = q.size(2), k.size(2)
        form = self.sdpa_form(ctx, tgt_len, src_len)
        dropout_p = self.dropout_module.p if self.training and dropout else 0.0
        if form == FLOAT_MASK:
            mask = self.float_mask(ctx, values, tgt_len, src_len, q.dtype)
        else:  # a boolean mask, or None
            mask = None if form == IS_CAUSAL else ctx.prepared(VisibleEntries(tgt_len, src_len))
        if mask is None:  # on CUDA any backend: FlashAttention, cuDNN, memory-efficient, math
            return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=form == IS_CAUSAL, scale=1.0)
        return masked_sdpa(q, k, v, mask, dropout_p)

    def _attend_library(self, q: Tensor, k: Tensor, v: Tensor, ctx: PositionContext, x: Optional[Tensor],
                        values: Sequence[Tensor], keep_state: bool = False
                        ) -> Tuple[Tensor, Optional[Tensor], Dict[str, Any]]:
        """The library path: the layer's library term's kernel on the whole call, the token-difference biases'
        values ``c`` (summed over the terms) handed to it as their per-token increments; the output, and with
        ``keep_state`` (a prompt's pass) the keys to cache (None: ``k``) and the term's decoding state."""
        if not (ctx.causal and ctx.positions is None and q.size(2) == k.size(2)):
            raise ValueError(f"{self.where}: the library path computes a causal full pass of a batch padded on the "
                             "right only (no cached keys)")
        gate = None
        if values:
            summed = sum(same_dtype(value, torch.float32) for value in values)
            gate = torch.diff(summed, dim=-1, prepend=torch.zeros_like(summed[..., :1]))
        return self.library_term.library_attention(q, k, v, ctx, x, gate, keep_state)

    def float_mask(self, ctx: PositionContext, values: Sequence[Tensor], tgt_len: int, src_len: int,
                   dtype: torch.dtype) -> Tensor:
        """The float mask of :data:`FLOAT_MASK`, in ``dtype``: -inf where a key is not seen, plus every bias. The
        blocked entries and the parameter-free biases (those that declare their :meth:`prepared_bias`) are summed
        once per batch (:class:`MaskedBiases`, shared by the layers: never changed in place); a learned bias and
        the token-difference biases, which need their gradients, are added in the call. In incremental decoding
        with sequence tables every bias is the call's (a row sliced from the sequence's table)."""
        additive = [(term, None if ctx.tables is not None else term.prepared_bias(tgt_len, src_len))
                    for term in self.additive_terms]
        mask = ctx.prepared(MaskedBiases(dtype, tgt_len, src_len,
                                         tuple(prepared for _, prepared in additive if prepared is not None)))
        called = [term.bias(ctx, tgt_len, src_len) for term, prepared in additive if prepared is None]
        called += [term.bias_of(token_values, tgt_len) for term, token_values in self.with_values(values)]
        for bias in called:
            mask = same_dtype(bias, dtype) if mask is None else mask + same_dtype(bias, dtype)
        return mask

    def score_mod(self, ctx: PositionContext, q: Tensor, src_len: int, values: Sequence[Tensor]) -> ScoreMod:
        """The layer's terms composed into one ``score_mod``, in the kernel's order (``values``: those of the
        token-difference terms)."""
        mods = [term.score_mod(ctx, q, src_len) for term in self.score_terms()
                if not isinstance(term, TokenDifferenceBias)]
        mods += [term.score_mod_of(token_values, q.size(2))
                 for term, token_values in self.with_values(values)]
        if any(mod is None for mod in mods):
            raise ValueError(f"{self.where}: a term has no score_mod form: {self.score_terms()}")
        return compose(mods)

    def _attend_flex(self, q: Tensor, k: Tensor, v: Tensor, ctx: PositionContext, values: Sequence[Tensor]) -> Tensor:
        """flex_attention on queries and keys padded to a multiple of :data:`FLEX_BLOCK` (the padded
        keys are masked, the padded query rows dropped; the terms read their tables at clamped
        indices, so that no index leaves them)."""
        tgt_len, src_len = q.size(2), k.size(2)
        block_mask = ctx.prepared(FlexBlockMask(tgt_len, src_len))
        score_mod = within(self.score_mod(ctx, q, src_len, values), tgt_len, src_len)
        q, k, v = (pad_to_block(t) for t in (q, k, v))
        out = flex_kernel(q.device)(q, k, v, score_mod=score_mod, block_mask=block_mask, scale=1.0)
        return out[:, :, :tgt_len]

    def explicit_logits(self, q: Tensor, k: Tensor, ctx: PositionContext, attn_mask: Optional[Tensor],
                        values: Sequence[Tensor], state: Optional[MutableMapping[str, Tensor]] = None,
                        content: Optional[Tensor] = None) -> Tensor:
        """Steps 2-5 written out: ``(batch, heads, tgt_len, src_len)`` logits, -inf where masked (``state``: the
        decoding state, which a logit-matrix term continues from and updates; None outside decoding; ``content``:
        the content-logits term's logits, in place of ``q k^T``)."""
        tgt_len, src_len = q.size(2), k.size(2)
        # the logits are a fresh tensor (as is the scaling term's result, in fp32) that no backward
        # pass needs: the terms and masks go in place, without another (tgt_len x src_len) tensor
        logits = torch.matmul(q, k.transpose(-1, -2)) if content is None else content
        for term in self.key_value_terms:
            logits.add_(term.key_logits(q, ctx, tgt_len, src_len))
        if self.scaling_term is not None:
            logits = self.scaling_term(logits, ctx)
        content_logits = logits.clone() if any(term.reads_bias for term in self.logit_matrix_terms) else None
        for bias in self.biases(ctx, values, tgt_len, src_len):
            logits.add_(same_dtype(bias, logits.dtype))
        if attn_mask is None and ctx.causal and tgt_len > 1:  # the context's causal mask
            attn_mask = ctx.prepared(CausalMask(tgt_len, src_len, logits.dtype))
        if attn_mask is not None:
            logits.add_(same_dtype(attn_mask, logits.dtype))
        logits.masked_fill_(ctx.key_padding_4d(tgt_len), float("-inf"))
        if self.row_term is not None:
            logits = logits + same_dtype(self.row_term(logits, q, ctx), logits.dtype)  # -inf stays -inf
        if self.logit_matrix_terms:
            logits = self.transformed_matrix(logits, ctx, state, content_logits)
        return logits

    def transformed_matrix(self, logits: Tensor, ctx: PositionContext, state: Optional[MutableMapping[str, Tensor]],
                           content_logits: Optional[Tensor]) -> Tensor:
        """Step 5's last: each logit-matrix term on every head's masked ``logits`` at once, in order, each handed them
        zero where they are -inf (a key a query may not see) and masked again there after it; those that read them
        get the content logits ``content_logits`` and the sum of the additive biases. In decoding each continues from
        the rows it cached (``state[logit_rows_key(i)]``, batch first) and caches its new ones."""
        tgt_len, src_len = logits.shape[-2:]
        masked = torch.isneginf(logits)
        parts = None
        if content_logits is not None:
            bias = sum(same_dtype(term.bias(ctx, tgt_len, src_len), content_logits.dtype)
                       for term in self.additive_terms)
            parts = LogitParts(content_logits, bias)
        for index, term in enumerate(self.logit_matrix_terms):
            history = None if state is None else state.get(logit_rows_key(index))
            out, rows = term(logits.masked_fill(masked, 0.0), ctx, history, parts)
            logits = same_dtype(out, logits.dtype).masked_fill(masked, float("-inf"))
            if state is not None and rows is not None:
                state[logit_rows_key(index)] = rows
        return logits

    def _attend_explicitly(
        self, q: Tensor, k: Tensor, v: Tensor, ctx: PositionContext,
        attn_mask: Optional[Tensor], history: Optional[Tensor], values: Sequence[Tensor], dropout: bool = True,
        state: Optional[MutableMapping[str, Tensor]] = None,
        content: Optional[Tensor] = None,
    ) -> Tuple[Tensor, Tensor, Tensor, Optional[Tensor]]:
        """Steps 2-7: the output, the softmax S, the weights that multiply V (S after the post-softmax
        transform; S itself without one) and the rows to cache for the transform's next step."""
        tgt_len, src_len = q.size(2), k.size(2)
        logits = self.explicit_logits(q, k, ctx, attn_mask, values, state, content)
        if self.normalisation_term is None:  # the softmax in fp32 at least, as fairseq's
            softmax = same_dtype(torch.softmax(logits, dim=-1, dtype=at_least_fp32(logits.dtype)), v.dtype)
        else:  # the layer's normalisation in place of the softmax
            softmax = same_dtype(self.normalisation_term(logits, ctx), v.dtype)

        probs, rows = softmax, None
        for term in self.logit_matrix_terms:  # every head's weights at once (a mixing of heads), where a term does
            if term.transforms_weights:
                probs = same_dtype(term.weights(probs, ctx), softmax.dtype)
        if self.post_softmax_term is not None:
            # the softmax gave blocked keys zero weight already; padded query rows get zeros too
            probs = probs.masked_fill(ctx.query_padding_mask(tgt_len)[:, None, :, None], 0.0)
            blocked = ctx.prepared(BlockedEntries(tgt_len, src_len))
            probs, rows = self.post_softmax_term(probs, blocked, ctx, history)

        dropped = self.dropout_module(probs) if dropout else probs
        out = torch.matmul(dropped, v)
        for term in self.key_value_terms:
            if term.values:
                out.add_(term.value_output(dropped, ctx))
        return out, softmax, probs, rows

def computed_dtype(q: Tensor) -> torch.dtype:
    """The dtype the kernels multiply ``q`` in: under autocast (on ``q``'s device) fp32 is cast down to autocast's
    dtype, which the self-check then compares in, with its tolerance."""
    autocast = autocast_dtype(q.device.type) if q.dtype == torch.float32 else None
    return q.dtype if autocast is None else autocast


def logit_rows_key(index: int) -> str:
    """The decoding state's key of the rows that the layer's ``index``-th logit-matrix term cached (batch first, so
    that fairseq's reordering for beam search reorders them)."""
    return f"prev_logit_rows_{index}"


def token_values_key(index: int) -> str:
    """The incremental-state key of the values of the layer's ``index``-th token-difference term (batch first,
    so that fairseq's reordering for beam search reorders them with the keys)."""
    return f"prev_token_values_{index}"


def check_causality(ctx: PositionContext, attn_mask: Optional[Tensor]) -> None:
    """The kernel takes a side's causality from its context (the blocked entries, SDPA's masks or causal kernel,
    flex_attention's block mask); fairseq's layers hand the causal side's ``attn_mask`` too, which the explicit
    path adds. Refuse a causal mask on a bidirectional context, which the paths would mask differently."""
    if attn_mask is not None and not ctx.causal:
        raise ValueError("an attn_mask was given with a bidirectional PositionContext: build the context "
                         "of a causal side with causal=True")


def compose(mods: Sequence[ScoreMod]) -> ScoreMod:
    """One ``score_mod`` applying ``mods`` in order."""
    def composed(score: Tensor, b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        for mod in mods:
            score = mod(score, b, h, q_idx, kv_idx)
        return score
    return composed


#: flex_attention's lengths are padded to a multiple of its block size: its backward with a block mask
#: and a score_mod gave NaN at other lengths (pytorch#153799), and translation batches, whose lengths
#: change from batch to batch, then compile for a few lengths only
FLEX_BLOCK = 128


def padded_length(length: int) -> int:
    """``length`` rounded up to a multiple of :data:`FLEX_BLOCK`."""
    return -(-length // FLEX_BLOCK) * FLEX_BLOCK


def pad_to_block(t: Tensor) -> Tensor:
    """``(batch, heads, length, head_dim)`` zero-padded to :func:`padded_length` along the length."""
    extra = padded_length(t.size(2)) - t.size(2)
    return F.pad(t, (0, 0, 0, extra)) if extra else t


def within(score_mod: ScoreMod, tgt_len: int, src_len: int) -> ScoreMod:
    """``score_mod`` read at query and key indices clamped to the ``tgt_len`` x ``src_len`` real ones:
    flex_attention evaluates it on the padded block too (where the block mask then hides it)."""
    last_query, last_key = tgt_len - 1, src_len - 1

    def clamped(score: Tensor, b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        return score_mod(score, b, h, torch.clamp(q_idx, max=last_query), torch.clamp(kv_idx, max=last_key))
    return clamped


@dataclass(frozen=True)
class FlexBlockMask(Preparation):
    """flex_attention's block mask of the batch, over the lengths padded to :data:`FLEX_BLOCK`: a query
    sees the keys that are real (not pads, not padding of the block) and, on a causal side, not after
    it (the last ``tgt_len`` of ``src_len`` tokens)."""

    tgt_len: int
    src_len: int

    def build(self, ctx: PositionContext) -> Any:
        padding, causal, offset = ctx.padding_mask[:, : self.src_len], ctx.causal, self.src_len - self.tgt_len
        last_key, last_row = self.src_len - 1, padding.size(0) - 1  # one row: a batch without pads

        def visible(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
            seen = (kv_idx <= last_key) & ~padding[torch.clamp(b, max=last_row), torch.clamp(kv_idx, max=last_key)]
            return seen & (kv_idx <= q_idx + offset) if causal else seen
        create_block_mask, _ = flex_functions()
        return create_block_mask(visible, padding.size(0), None, padded_length(self.tgt_len),
                                 padded_length(self.src_len), device=str(padding.device))


@dataclass(frozen=True)
class MaskedBiases(Preparation):
    """The batch's part of a float mask in ``dtype``: the parameter-free ``biases`` (each a term's
    :meth:`~posattn.position_terms.base.AdditiveLogitBias.prepared_bias`, built here and not kept apart: only the
    sum is) and -inf where a query may not see a key (:class:`~posattn.position_context.VisibleEntries`); None where
    that is nothing."""

    dtype: torch.dtype
    tgt_len: int
    src_len: int
    biases: Tuple[Preparation, ...] = ()

    def build(self, ctx: PositionContext) -> Optional[Tensor]:
        if not self.biases:
            return ctx.prepared(BlockedBias(self.dtype, self.tgt_len, self.src_len))
        mask = same_dtype(self.biases[0].build(ctx), self.dtype)
        for preparation in self.biases[1:]:
            mask = mask + same_dtype(preparation.build(ctx), self.dtype)
        visible = ctx.prepared(VisibleEntries(self.tgt_len, self.src_len))
        return mask if visible is None else mask.masked_fill(~visible, float("-inf"))


def masked_sdpa(q: Tensor, k: Tensor, v: Tensor, mask: Tensor, dropout_p: float) -> Tensor:
    """SDPA with a float or a boolean mask, ``q`` already scaled. On CUDA only the memory-efficient and math backends
    may run it: cuDNN's, torch 2.11's default on H100/H200, gives NaN query gradients with a mask at lengths % 128
    == 64 (pytorch#196678), FlashAttention takes no mask, and of the fused backends only the memory-efficient one
    computes a mask's gradient (a learned bias's). (Without a mask the kernel calls SDPA itself, on any backend.)"""
    if q.device.type != "cuda" or sdpa_kernel is None:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p, scale=1.0)
    with sdpa_kernel([SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p, scale=1.0)


#: flex_attention's Triton tiles on CUDA: 64 x 64, one pipeline stage. With a learned table captured in fp32
#: the default tiles need more shared memory than an H200 has (245,760 of 232,448 bytes: "No valid triton
#: configs", pytorch#133254); these ran as fast as the default on plain causal attention (docs/benchmark.md)
FLEX_KERNEL_OPTIONS = {"BLOCK_M": 64, "BLOCK_N": 64, "num_stages": 1}
_COMPILED_FLEX: Dict[str, Callable[..., Tensor]] = {}


def flex_kernel(device: torch.device) -> Callable[..., Tensor]:
    """``flex_attention``, compiled on CUDA (the fused Triton kernel, with :data:`FLEX_KERNEL_OPTIONS`); on
    the CPU its eager implementation (unfused: for checks and no-grad scoring)."""
    _, flex_attention = flex_functions()
    if device.type != "cuda":
        return flex_attention
    if "cuda" not in _COMPILED_FLEX:
        compiled = torch.compile(flex_attention)

        def tiled(*args: Any, **kwargs: Any) -> Tensor:
            return compiled(*args, kernel_options=dict(FLEX_KERNEL_OPTIONS), **kwargs)
        _COMPILED_FLEX["cuda"] = tiled
    return _COMPILED_FLEX["cuda"]
