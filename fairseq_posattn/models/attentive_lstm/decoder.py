"""The decoder of the attentive LSTM language models: a multi-layer LSTM, an attention over its own past
top-layer states (:mod:`~fairseq_posattn.models.attentive_lstm.salton_attention`,
:mod:`~fairseq_posattn.models.attentive_lstm.positional_attention`, or none for the baseline), the
concatenation layer and the tied output embedding (the equations: the package docstring)::

    out_t    = tanh(W_c [c_t ; h_t] + b_c)           (concatenation layer, 2H -> embedding size)
    logits_t = E out_t + b                           (output embedding E tied to the input one)

Choices (docs/methods.md has the table, row by row):

* N (``--positional-attention-normalizer``): ``block`` (default) is the fixed block length
  ``--tokens-per-sample`` of the training run (stored in the checkpoint, so evaluation with another
  ``--tokens-per-sample`` keeps the trained N). ``sentence`` is the paper's choice, the true length
  of the row (its non-pad tokens): it **leaks the future** (the output at t depends on how many
  tokens follow t) and cannot be used for step-by-step generation, which raises. Positions past N
  (longer inputs than the block, generation) simply give t/N > 1.
* The concatenation layer is affine (``nn.Linear`` with bias), as in the authors' code. The tied output
  layer keeps a bias, as the authors' code and the paper's parameter counts (7.06M / 6.9M on PTB) have.
* Dropout, as in the authors' code: ``--decoder-dropout-in`` on the embeddings,
  ``--dropout`` between the stacked LSTM layers (what the paper calls the recurrent connections),
  ``--decoder-dropout-out`` after the concatenation layer. The attention reads the undropped h.
* Initialisation (``--attentive-lm-init``): ``authors`` (default), as the released code: PyTorch's
  defaults for the LSTM layers (U(+-1/sqrt(H)), biases too), the concatenation layer, the position
  generator, W_mu and w_sigma (U(+-1/sqrt(fan_in)), biases too); xavier-uniform for Salton's W_1 and
  w_2, b_1 zero; the embedding U(+-0.1) (pad row 0) and the output bias zero. ``uniform``: every
  weight and bias U(+-0.1) (the paper's text, "all the weight matrices"; fairseq's LSTM helpers),
  output bias zero. The initialisation only matters for a new model: a checkpoint's weights replace it.

Training runs the LSTMs fused over the whole sequence (``nn.LSTM``) and computes every step's
attention at once with a causal mask. Incremental decoding caches the LSTM states, the memory (and
Salton's scores), mu_{t-1} and the position generator's state. The forward pass never reads a tensor's
value on the host (no ``.item()``, no data-dependent shapes).

Activation checkpointing (``--checkpoint-activations``): in training, the attention over the past
states (the B x T x T scores and weights, Salton's B x T x H tanh, the position generator and the
mu recurrence) is recomputed in the backward pass instead of kept; the gradients are those of the
plain model. ``--offload-activations`` sets it too and keeps the other tensors saved for the
backward pass in CPU memory (:class:`~fairseq_posattn.models.attentive_lstm.numerics.SavedOnCPU`). The
LSTMs themselves are not recomputed: cuDNN's dropout between layers would draw other masks the second
time. Incremental decoding and evaluation (no gradients) never checkpoint.
"""

import contextlib
from typing import Any, ContextManager, Dict, Optional, Tuple

import torch
import torch.nn.functional as F
from fairseq.models import FairseqIncrementalDecoder
from fairseq.models.lstm import LSTM, Embedding, Linear
from fairseq.modules import FairseqDropout
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from fairseq_posattn.models.attentive_lstm.numerics import SavedOnCPU, flush_subnormal, flushes_subnormal_gradients
from fairseq_posattn.models.attentive_lstm.positional_attention import GAUSSIAN_EPS, PositionalAttention
from fairseq_posattn.models.attentive_lstm.salton_attention import SaltonAttention
from fairseq_posattn.models.position_record import PositionOptionsRecord

DEFAULT_MAX_TARGET_POSITIONS = int(1e5)
ATTENTIONS = ("salton", "positional", "none")
NORMALIZERS = ("block", "sentence")
INITS = ("authors", "uniform")

IncrementalState = Dict[str, Dict[str, Optional[Tensor]]]
CachedState = Dict[str, Optional[Tensor]]
Attended = Tuple[Optional[Tensor], Optional[Tensor], Dict[str, Tensor]]


def check_decoder_options(
    attention: str, init: str, normalizer: str, block_length: Optional[int], share_input_output_embed: bool,
    embed_dim: int, hidden_size: int, out_embed_dim: int,
) -> None:
    """Refuse a decoder whose options contradict each other or name nothing."""
    if attention not in ATTENTIONS:
        raise ValueError(f"unknown attention {attention!r}")
    if init not in INITS:
        raise ValueError(f"--attentive-lm-init must be one of {INITS}, not {init!r}")
    if normalizer not in NORMALIZERS:
        raise ValueError(f"--positional-attention-normalizer must be one of {NORMALIZERS}, not {normalizer!r}")
    if attention == "positional" and normalizer == "block" and not block_length:
        raise ValueError("the block normalizer needs the block length (--tokens-per-sample)")
    if share_input_output_embed and out_embed_dim != embed_dim:
        raise ValueError(
            "--share-decoder-input-output-embed requires --decoder-embed-dim to match "
            "--decoder-out-embed-dim")
    if attention == "none" and out_embed_dim != hidden_size:
        raise ValueError(
            "without attention there is no concatenation layer: --decoder-out-embed-dim must equal "
            "--decoder-hidden-size")


def build_attention(attention: str, hidden_size: int, generator_size: int, eps: float) -> Optional[nn.Module]:
    """Salton's or Dagan's attention over the memory, or none (the baseline)."""
    if attention == "salton":
        return SaltonAttention(hidden_size)
    if attention == "positional":
        return PositionalAttention(hidden_size, generator_size, eps=eps)
    return None


class AttentiveLSTMDecoder(FairseqIncrementalDecoder):
    """Multi-layer LSTM, attention over its own past top-layer states, concatenation layer, tied
    output embedding (see the package and module docstrings for the equations)."""

    def __init__(
        self,
        dictionary: Any,
        attention: str = "salton",
        embed_dim: int = 400,
        hidden_size: int = 400,
        out_embed_dim: int = 400,
        num_layers: int = 2,
        dropout_in: float = 0.5,
        dropout_hidden: float = 0.2,
        dropout_out: float = 0.5,
        share_input_output_embed: bool = True,
        pretrained_embed: Optional[nn.Embedding] = None,
        positional_attention_hidden: int = 20,
        positional_attention_normalizer: str = "block",
        block_length: Optional[int] = None,
        max_target_positions: int = DEFAULT_MAX_TARGET_POSITIONS,
        checkpoint_activations: bool = False,
        offload_activations: bool = False,
        positional_attention_eps: float = GAUSSIAN_EPS,
        init: str = "authors",
        reset_position_options: bool = False,
    ) -> None:
        super().__init__(dictionary)
        check_decoder_options(attention, init, positional_attention_normalizer, block_length,
                              share_input_output_embed, embed_dim, hidden_size, out_embed_dim)
        self.attention_type = attention
        self.hidden_size = hidden_size
        self.num_layers = num_layers
        self.share_input_output_embed = share_input_output_embed
        self.normalizer_type = positional_attention_normalizer
        self.block_length = block_length
        self.max_target_positions = max_target_positions
        self.offload_activations = offload_activations
        self.checkpoint_activations = checkpoint_activations or offload_activations

        self.padding_idx = dictionary.pad()
        if pretrained_embed is None:
            self.embed_tokens = Embedding(len(dictionary), embed_dim, self.padding_idx)
        else:
            self.embed_tokens = pretrained_embed
        self.dropout_in_module = FairseqDropout(dropout_in, module_name=self.__class__.__name__)
        self.dropout_out_module = FairseqDropout(dropout_out, module_name=self.__class__.__name__)
        self.lstm = LSTM(
            embed_dim, hidden_size, num_layers=num_layers, batch_first=True,
            dropout=dropout_hidden if num_layers > 1 else 0.0,
        )
        self.attention = build_attention(attention, hidden_size, positional_attention_hidden,
                                         positional_attention_eps)
        self.concat_proj: Optional[nn.Linear] = None
        if self.attention is not None:
            self.concat_proj = Linear(2 * hidden_size, out_embed_dim)
        self.build_output_layer(len(dictionary), out_embed_dim)
        if init == "authors":
            self.initialise_as_authors()
        self.record_position_options(reset_position_options)

    def build_output_layer(self, vocabulary: int, out_embed_dim: int) -> None:
        """The tied layer's own bias (0), or an untied layer (U(+-0.1), bias 0)."""
        if self.share_input_output_embed:
            self.output_bias = nn.Parameter(torch.zeros(vocabulary))
        else:
            self.fc_out = Linear(out_embed_dim, vocabulary)
            nn.init.zeros_(self.fc_out.bias)

    def record_position_options(self, reset: bool) -> None:
        """The options of the model are recorded when it is built (PosattnHubMixin); N is derived here."""
        self.position_record = PositionOptionsRecord("decoder", reset=reset)
        if self.attention_type == "positional" and self.normalizer_type == "block":
            self.position_record.record({"positional_attention_block_length": (
                "--tokens-per-sample (the positional attention's N)", self.block_length)})

    def initialise_as_authors(self) -> None:
        """``--attentive-lm-init authors``: the released code's initialisation. The LSTM layers,
        the concatenation layer and Dagan's position generator, W_mu and w_sigma get PyTorch's
        defaults (U(+-1/sqrt(H)) for an LSTM of H units, U(+-1/sqrt(fan_in)) for a linear layer,
        weights and biases); Salton's W_1 and w_2 xavier-uniform, b_1 zero. The embedding (fairseq's
        U(+-0.1), pad row 0, or the pretrained one), the output bias (0) and an untied output layer
        (U(+-0.1), bias 0) stay as built: the authors' too."""
        self.lstm.reset_parameters()
        if self.attention is not None:
            self.attention.initialise_as_authors()
            self.concat_proj.reset_parameters()

    # ------------------------------------------------------------------ forward
    def forward(
        self,
        prev_output_tokens: Tensor,
        encoder_out: Optional[Any] = None,
        incremental_state: Optional[IncrementalState] = None,
        src_lengths: Optional[Tensor] = None,
        **unused: Any,
    ) -> Tuple[Tensor, Dict[str, Any]]:
        with self.saved_activations(incremental_state):
            x, extra = self.extract_features(prev_output_tokens, incremental_state=incremental_state)
            return self.output_layer(x), extra

    def saved_activations(self, incremental_state: Optional[IncrementalState]) -> ContextManager:
        """With ``--offload-activations``, in training, the tensors saved for the backward pass
        (outside the checkpointed attention) wait in CPU memory (:class:`SavedOnCPU`)."""
        if self.offload_activations and incremental_state is None and torch.is_grad_enabled():
            return SavedOnCPU()
        return contextlib.nullcontext()

    def normalizer(self, tokens: Tensor) -> Tensor:
        """N as a B x 1 fp32 tensor: the block length, or (leaking) each row's number of real tokens."""
        if self.normalizer_type == "sentence":
            length = tokens.ne(self.padding_idx).sum(dim=1, keepdim=True).clamp(min=1)
            return length.to(torch.float32)
        return torch.full((tokens.size(0), 1), float(self.block_length), device=tokens.device,
                          dtype=torch.float32)

    def extract_features(
        self,
        prev_output_tokens: Tensor,
        encoder_out: Optional[Any] = None,
        incremental_state: Optional[IncrementalState] = None,
        **unused: Any,
    ) -> Tuple[Tensor, Dict[str, Any]]:
        """Features (B x T x out_embed_dim) before the output projection.

        With ``incremental_state``, ``prev_output_tokens`` holds every token so far and only those
        not yet seen (normally the last one) are computed, from the cached state.
        """
        cached = self.cached_state(incremental_state)
        offset = 0 if cached is None else cached["memory"].size(1)
        tokens = prev_output_tokens[:, offset:]
        if tokens.size(1) == 0:
            raise ValueError(f"incremental decoding: no new token after the {offset} cached ones")

        x = self.dropout_in_module(self.embed_tokens(tokens))
        lstm_state = None if cached is None else (cached["hidden"], cached["cell"])
        h, (hidden, cell) = self.lstm(x, lstm_state)  # B x S x H; the whole sequence at once
        # the states attended over (the baseline keeps them for their number: the next step's offset)
        memory = h if cached is None else torch.cat([cached["memory"], h], dim=1)
        normalizer = self.normalizer(prev_output_tokens) if self.attention_type == "positional" else None
        context, weights, attention_state = self.attention_over_memory(
            h, memory, offset, normalizer, cached, incremental_state)

        if incremental_state is not None:
            new_state: CachedState = {"hidden": hidden, "cell": cell, "memory": memory}
            new_state.update(attention_state)
            self.set_incremental_state(incremental_state, "cached_state", new_state)

        out = h if context is None else torch.tanh(self.concat_proj(torch.cat([context, h], dim=-1)))
        out = self.dropout_out_module(out)
        # "attn" stays None: fairseq's generator reads it as attention over a *source*
        return out, {"attn": [None], "memory_attention": weights}

    def cached_state(self, incremental_state: Optional[IncrementalState]) -> Optional[CachedState]:
        """The state cached by the previous steps (None: none yet, or a full pass); refuses to decode
        step by step with the sentence normalizer."""
        if incremental_state is None:
            return None
        if self.attention_type == "positional" and self.normalizer_type == "sentence":
            raise ValueError(
                "--positional-attention-normalizer sentence uses the length of the whole sentence "
                "(it leaks the future) and cannot decode step by step; train with the default "
                "'block' normalizer to generate")
        return self.get_incremental_state(incremental_state, "cached_state")

    def attention_over_memory(
        self,
        h: Tensor,
        memory: Tensor,
        offset: int,
        normalizer: Optional[Tensor],
        cached: Optional[CachedState],
        incremental_state: Optional[IncrementalState],
    ) -> Attended:
        """:meth:`attend`, checkpointed in training with ``--checkpoint-activations``; the baseline
        (no attention, ``out_t = h_t``) gets no context, no weights and no state."""
        if self.attention is None:
            return None, None, {}
        if self.checkpoint_activations and incremental_state is None and torch.is_grad_enabled():
            # the B x T x T part is recomputed in the backward pass instead of kept; no randomness
            return checkpoint(
                self.attend, h, memory, offset, normalizer, cached, use_reentrant=False, preserve_rng_state=False)
        return self.attend(h, memory, offset, normalizer, cached)

    def attend(
        self,
        h: Tensor,
        memory: Tensor,
        offset: int,
        normalizer: Optional[Tensor],
        cached: Optional[CachedState],
    ) -> Tuple[Tensor, Tensor, Dict[str, Tensor]]:
        """The attention of the S new steps ``h`` over ``memory`` (the segment that
        ``--checkpoint-activations`` recomputes): context (B x S x H), weights (B x S x K) and the
        attention's part of the incremental state (Salton's scores; mu_t and the position
        generator's state)."""
        if self.attention_type == "salton":
            return self.attend_salton(h, memory, offset, cached)
        return self.attend_positional(h, memory, offset, normalizer, cached)

    def attend_salton(
        self, h: Tensor, memory: Tensor, offset: int, cached: Optional[CachedState]
    ) -> Tuple[Tensor, Tensor, Dict[str, Tensor]]:
        """Salton's attention; the scores of the memory (cached ones and the new steps') are its state."""
        scores = self.attention.score(h)
        if cached is not None:
            scores = torch.cat([cached["scores"], scores], dim=1)
        context, weights = self.attention(memory, scores, offset, h.size(1))
        return context, weights, {"scores": scores}

    def attend_positional(
        self, h: Tensor, memory: Tensor, offset: int, normalizer: Tensor, cached: Optional[CachedState]
    ) -> Tuple[Tensor, Tensor, Dict[str, Tensor]]:
        """Dagan's attention; mu_t and the position generator's (h, c) after the last step are its state."""
        generator_state = None
        if cached is not None:
            generator_state = (cached["generator_hidden"], cached["generator_cell"])
        prev_mu = None if cached is None else cached["mu"]
        context, weights, mu, (gen_h, gen_c) = self.attention(h, memory, offset, normalizer, prev_mu, generator_state)
        return context, weights, {"mu": mu[:, -1], "generator_hidden": gen_h, "generator_cell": gen_c}

    def output_layer(self, features: Tensor) -> Tensor:
        """Tied (or untied) projection to the vocabulary; on the CPU, the near-subnormal entries of
        the logits' gradient are set to 0 before its backward pass
        (:mod:`~fairseq_posattn.models.attentive_lstm.numerics`)."""
        if self.share_input_output_embed:
            logits = F.linear(features, self.embed_tokens.weight, self.output_bias)
        else:
            logits = self.fc_out(features)
        if flushes_subnormal_gradients(logits):
            logits.register_hook(flush_subnormal)
        return logits

    # ------------------------------------------------------------------ incremental state
    def reorder_incremental_state(self, incremental_state: IncrementalState, new_order: Tensor) -> None:
        cached = self.get_incremental_state(incremental_state, "cached_state")
        if cached is None:
            return
        batch_dim = {"hidden": 1, "cell": 1, "generator_hidden": 1, "generator_cell": 1}
        reordered: CachedState = {}
        for key, value in cached.items():
            reordered[key] = None if value is None else value.index_select(batch_dim.get(key, 0), new_order)
        self.set_incremental_state(incremental_state, "cached_state", reordered)

    def max_positions(self) -> int:
        return self.max_target_positions
