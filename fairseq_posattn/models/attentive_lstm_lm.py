"""``attentive_lstm_lm`` (Salton et al. 2017), ``positional_attentive_lstm_lm`` (Dagan 2019) and
``baseline_lstm_lm``, Dagan's LSTM baseline.

The first two are LSTM language models that attend over their own past states (docs/methods.md); the
baseline is the same LSTM without attention, as the authors' code builds it (their model with attention
off, run in Merity et al.'s setting: 3 layers of 400, tied, dropout 0.4 / 0.25 / 0.5), ``logits_t = E
h_t + b``.
Notation: tokens x_1..x_T (fairseq's ``prev_output_tokens``; output t predicts target t), LSTM
states h_1..h_T of the top layer, H their size, N the position normalizer.

For the prediction after step t the model attends over the *memory* h_1..h_{t-1} (never h_t or a
later state), then::

    c_t      = sum_{i<t} a_it h_i                    (Dagan eq. 2 / 13; c_1 = 0: empty memory)
    out_t    = tanh(W_c [c_t ; h_t] + b_c)           (concatenation layer, 2H -> embedding size)
    logits_t = E out_t + b                           (output embedding E tied to the input one)

Salton (``attentive_lstm_lm``), Dagan eq. 1 and 4::

    score(h_i) = w_2 . tanh(W_1 h_i + b_1)           a_it = softmax_{i<t} score(h_i)

Dagan (``positional_attentive_lstm_lm``), eq. 5-13, with the clamp that eq. 8's text means::

    h~_t       = LSTM_pos(h_1..h_t)                  (position generator, hidden 20)
    b_t        = [mu_{t-1}, 1/N, t/N]                mu_0 = 0
    mu_t       = clamp(ReLU(W_mu h~_t + b_mu) . b_t, 0, t/N)
    sigma_t    = sigmoid(w_sigma . h~_t + b_sigma)
    gamma_it   = exp(-(i/N - mu_t)^2 / (2 sigma_t^2 + eps)),  normalised over i < t;  eps = 1e-3

Choices (the papers leave them open; the authors' code, gautierdag/pytorch-attentive-lm,
decides where it is unambiguous; docs/methods.md has the table, row by row):

* eps (``--positional-attention-eps``): 1e-3, the authors' value (their ``10e-4``). It is part of the
  function: with N = 35, the neighbour of the Gaussian's peak keeps at least 0.44 of its weight
  however small sigma gets, where 1e-6 lets the attention focus on a single state. Models trained
  when the default was 1e-6 keep it: :class:`PositionalAttention` saves an integer ``version``
  buffer, and a state dict without one (version 1) is loaded with eps 1e-6
  (``upgrade_state_dict_named``, which fairseq's checkpoint loading calls).
* N (``--positional-attention-normalizer``): ``block`` (default) is the fixed block length
  ``--tokens-per-sample`` of the training run (stored in the checkpoint, so evaluation with another
  ``--tokens-per-sample`` keeps the trained N). ``sentence`` is the paper's choice, the true length
  of the row (its non-pad tokens): it **leaks the future** (the output at t depends on how many
  tokens follow t) and cannot be used for step-by-step generation, which raises. Positions past N
  (longer inputs than the block, generation) simply give t/N > 1.
* The normalisation of gamma is computed as a softmax of the Gaussian log-scores, which is the same
  function as exp(.) / sum exp(.) but never divides 0 by 0 when every exp underflows.
* W_1, W_mu, w_sigma and the concatenation layer are affine (``nn.Linear`` with bias), as in the
  authors' code; w_2 has no bias (it would cancel in the softmax). The tied output layer keeps a
  bias, as the authors' code and the paper's parameter counts (7.06M / 6.9M on PTB) have.
* Dropout, as in the authors' code: ``--decoder-dropout-in`` on the embeddings,
  ``--dropout`` between the stacked LSTM layers (what the paper calls the recurrent connections),
  ``--decoder-dropout-out`` after the concatenation layer. The attention reads the undropped h.
  Defaults are the paper's 0.5 / 0.2 / 0.5; a ``--dropout`` given on the command line also becomes
  the default of the other two, as in fairseq's ``lstm_lm``.
* Initialisation (``--attentive-lm-init``): ``authors`` (default), as the released code: PyTorch's
  defaults for the LSTM layers (U(+-1/sqrt(H)), biases too), the concatenation layer, the position
  generator, W_mu and w_sigma (U(+-1/sqrt(fan_in)), biases too); xavier-uniform for Salton's W_1 and
  w_2, b_1 zero; the embedding U(+-0.1) (pad row 0) and the output bias zero. ``uniform``: every
  weight and bias U(+-0.1) (the paper's text, "all the weight matrices"; fairseq's LSTM helpers),
  output bias zero. The initialisation only matters for a new model: a checkpoint's weights replace it.

The memory h_1..h_{t-1}, the clamp of mu to [0, t/N], the 1-based positions i/N and the block N
follow the paper's text; the authors' code attends over h_t as well, bounds mu from below by the
current state's position, counts positions from 0 and uses the sentence length.

Training runs the LSTMs fused over the whole sequence (``nn.LSTM``) and computes every step's
attention at once with a causal mask; the only loop over time is the scalar mu recurrence,
vectorised over the batch. Incremental decoding caches the LSTM states, the memory (and Salton's
scores), mu_{t-1} and the position generator's state. The forward pass never reads a tensor's value
on the host (no ``.item()``, no data-dependent shapes).

Mixed precision (``--fp16``, ``--bf16``, ``--amp``): the LSTMs, the projections and the weighted
sum run in the model's dtype; the numerically sensitive part of the attention runs in fp32 (autocast
disabled there) and its weights are cast back, as fairseq does for its softmax: Salton's tanh and
w_2 product, the softmax over the memory, and everything of Dagan's after the position generator
(W_mu, w_sigma and the sigmoid, the mu recurrence, i/N, the Gaussian log-scores). In half precision
the gradient of the log-score overflows once sigma is below about 0.04, and in bf16 the positions
i/N of a long block are not distinct. fp32 results are unchanged.

Subnormal gradients (CPU training): once a row's logits span more than about 87 (which training at
the paper's lr 30 reaches within the first ten updates of ``scripts/benchmark_lstm_lm.py``), the
softmax gives probabilities below fp32's smallest normal number (2^-126, 1.2e-38), and the
criterion's gradient of the logits holds millions of subnormal entries, or entries whose products
with the output embedding are subnormal. The CPU computes with subnormals about 60 times slower: the
output layer's backward pass then takes seconds instead of tens of milliseconds (a whole train step
up to 25 times its usual time). On the CPU (GPUs compute with subnormals at full speed), a hook on
the logits sets the entries of their gradient below ``SUBNORMAL_GUARD`` = 2^-100 (8e-31) to 0 before
the output layer's backward pass (one elementwise pass, ``flush_subnormal``); their products with
any weight above 2^-26 are then normal. An entry that small is below fp32's resolution of every sum
it enters unless that sum is itself below about 1e-23: the gradients are the same numbers in
practice, and bit for bit the same while no entry is that small.

Activation checkpointing (``--checkpoint-activations``): in training, the attention over the past
states (the B x T x T scores and weights, Salton's B x T x H tanh, the position generator and the
mu recurrence) is recomputed in the backward pass instead of kept; the gradients are those of the
plain model. ``--offload-activations`` sets it too and keeps the other tensors saved for the
backward pass in CPU memory (:class:`SavedOnCPU`: pinned on CUDA; the parameters stay where they
are). The LSTMs themselves are not recomputed: cuDNN's dropout between layers would draw other
masks the second time. Incremental decoding and evaluation (no gradients) never checkpoint.
"""

import argparse
import contextlib
from typing import Any, ContextManager, Dict, Optional, Tuple

import torch
import torch.nn.functional as F
from fairseq import utils
from fairseq.models import (
    FairseqIncrementalDecoder,
    FairseqLanguageModel,
    register_model,
    register_model_architecture,
)
from fairseq.models.lstm import LSTM, Embedding, Linear
from fairseq.modules import FairseqDropout
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from fairseq_posattn.models.evaluation_coverage import score_every_block
from fairseq_posattn.models.hub_loading import PosattnHubMixin
from fairseq_posattn.models.position_record import PositionOptionsRecord

DEFAULT_MAX_TARGET_POSITIONS = int(1e5)
GAUSSIAN_EPS = 1e-3  # the authors' code (model.py, written 10e-4)
LEGACY_GAUSSIAN_EPS = 1e-6  # models trained before the default became 1e-3 (version 1, no ``version`` buffer)
POSITIONAL_ATTENTION_VERSION = 2  # saved as PositionalAttention's ``version`` buffer
ATTENTIONS = ("salton", "positional", "none")
NORMALIZERS = ("block", "sentence")
INITS = ("authors", "uniform")
# on the CPU, the logits' gradient entries below this are set to 0 (module docstring), in fp32 and
# bf16 (whose subnormals lie below 2^-126); fp16's start at 6e-5 and are left alone
SUBNORMAL_GUARD = 2.0 ** -100
SUBNORMAL_FLUSHED_DTYPES = (torch.float32, torch.bfloat16)

IncrementalState = Dict[str, Dict[str, Optional[Tensor]]]


def full_precision(device: torch.device) -> ContextManager:
    """A region computed in the dtype of its inputs even under ``torch.autocast`` (``--amp``):
    the callers cast to fp32 themselves."""
    return torch.autocast(device_type=device.type, enabled=False)


def is_parameter(tensor: Tensor) -> bool:
    """Whether ``tensor`` is a parameter or a view of one (a linear layer saves ``W^T``)."""
    return isinstance(tensor, nn.Parameter) or isinstance(tensor._base, nn.Parameter)


class SavedOnCPU(torch.autograd.graph.saved_tensors_hooks):
    """The tensors saved for the backward pass wait in CPU memory (pinned when they come from
    CUDA) and return to their device when the backward pass needs them; unlike
    ``torch.autograd.graph.save_on_cpu``, parameters and views of them stay where they are (they
    are resident anyway) and every tensor keeps its strides. With save_on_cpu, on an H100 (torch
    2.11), the checkpointed attention's inputs came back contiguous, so its recomputation ran other
    kernels than its first pass (``CheckpointError``: other saved shapes), and the LSTM's weight
    gradients differed from the plain model's (save_on_cpu copies the weights too). Tensors already
    on the CPU are copied as well: one path on every device, which the CPU tests exercise."""

    def __init__(self) -> None:
        def pack(tensor: Tensor) -> Tuple[Optional[torch.device], Tensor]:
            if is_parameter(tensor):
                return None, tensor
            pinned = tensor.device.type == "cuda"
            copy = torch.empty_like(tensor, device="cpu", pin_memory=pinned)  # the same strides
            copy.copy_(tensor, non_blocking=pinned)  # no wait: only the stream reads it back
            return tensor.device, copy

        def unpack(packed: Tuple[Optional[torch.device], Tensor]) -> Tensor:
            device, tensor = packed
            if device is None:
                return tensor
            return tensor.to(device, non_blocking=tensor.is_pinned())

        super().__init__(pack, unpack)


def flush_subnormal(grad: Tensor) -> Tensor:
    """The logits' gradient with its entries below ``SUBNORMAL_GUARD`` in magnitude set to 0, so that
    the output layer's backward matrix products see no subnormal numbers (module docstring)."""
    return F.hardshrink(grad, SUBNORMAL_GUARD)


def fp32_linear(layer: nn.Linear, x: Tensor) -> Tensor:
    """``layer(x)`` computed in fp32 (the weights cast, not changed); the same numbers in fp32."""
    bias = None if layer.bias is None else layer.bias.float()
    return F.linear(x.float(), layer.weight.float(), bias)


def causal_memory_attention(logits: Tensor, memory: Tensor, offset: int) -> Tuple[Tensor, Tensor]:
    """Attend from S steps over the memory, each step only over the states before it.

    Args:
        logits: B x S x K unnormalised log-weights of the K memory states for S query steps.
        memory: B x K x H states h_1..h_K.
        offset: number of steps before the first query: query s is step t = offset + s + 1 and
            sees h_1..h_{t-1}, i.e. memory index k < offset + s.

    Returns:
        context c (B x S x H) and weights (B x S x K), both in the dtype of ``memory``; a step
        with an empty memory (t = 1) gets zero weights and c_1 = 0 without evaluating a softmax
        over nothing (no NaN, forward or backward). The softmax (and its backward) runs in fp32,
        as fairseq's; the weights are cast back to the memory's dtype for the weighted sum.
    """
    steps, keys = logits.shape[-2:]
    query = torch.arange(offset, offset + steps, device=logits.device)
    key = torch.arange(keys, device=logits.device)
    allowed = key.unsqueeze(0) < query.unsqueeze(1)  # S x K: i < t
    empty = query == 0
    # give an empty row one finite entry, then zero the whole row
    allowed = allowed | (empty.unsqueeze(1) & (key == 0).unsqueeze(0))
    with full_precision(logits.device):
        weights = torch.softmax(logits.float().masked_fill(~allowed, float("-inf")), dim=-1)
    weights = weights.masked_fill(empty.unsqueeze(1), 0.0).to(memory.dtype)
    return torch.bmm(weights, memory), weights


class SaltonAttention(nn.Module):
    """Self-attention over the memory (Salton et al. 2017; Dagan eq. 1, 2, 4).

    ``score(h_i) = w_2 . tanh(W_1 h_i + b_1)``, ``a_it = softmax_{i<t} score(h_i)``,
    ``c_t = sum_{i<t} a_it h_i``. The score of a state does not depend on t, so it is computed once
    per state (and cached in incremental decoding). ``W_1 h_i`` runs in the model's dtype; the tanh
    and the product with w_2 in fp32 (in bf16 a score near 10 would be rounded to a multiple of
    1/16, moving its softmax weight by up to 3%).
    """

    def __init__(self, hidden_size: int) -> None:
        super().__init__()
        self.W_1 = Linear(hidden_size, hidden_size)
        self.w_2 = Linear(hidden_size, 1, bias=False)

    def initialise_as_authors(self) -> None:
        """As the authors' code: xavier-uniform W_1 and w_2, zero b_1."""
        nn.init.xavier_uniform_(self.W_1.weight)
        nn.init.zeros_(self.W_1.bias)
        nn.init.xavier_uniform_(self.w_2.weight)

    def score(self, h: Tensor) -> Tensor:
        """B x S x H states -> B x S scores (fp32)."""
        projected = self.W_1(h)
        with full_precision(h.device):
            return fp32_linear(self.w_2, torch.tanh(projected.float())).squeeze(-1)

    def forward(self, memory: Tensor, scores: Tensor, offset: int, steps: int) -> Tuple[Tensor, Tensor]:
        """Contexts of the last ``steps`` steps given the memory h_1..h_K and its scores (B x K)."""
        logits = scores.unsqueeze(1).expand(-1, steps, -1)
        return causal_memory_attention(logits, memory, offset)


class PositionalAttention(nn.Module):
    """Positional attention over the memory (Dagan 2019, eq. 5-13).

    A position-generator LSTM over the states gives h~_t; ``mu_t = clamp(ReLU(W_mu h~_t) . b_t, 0,
    t/N)`` with ``b_t = [mu_{t-1}, 1/N, t/N]``; ``sigma_t = sigmoid(w_sigma . h~_t)``; the weight of
    h_i (i < t) is the Gaussian ``exp(-(i/N - mu_t)^2 / (2 sigma_t^2 + eps))``, normalised over
    i < t.

    The position generator LSTM runs in the model's dtype; everything after it (the W_mu and
    w_sigma heads, the sigmoid, the mu recurrence, the positions i/N, the Gaussian log-scores and
    their softmax) in fp32: in bf16 the positions i/N of a 1024-token block are not even distinct,
    and in fp16 the gradient of the log-score overflows once sigma is below about 0.04. mu (and
    the cached mu) are fp32; context and weights come back in the model's dtype.

    ``eps`` (``--positional-attention-eps``, default 1e-3 as the authors' code) is part of the
    function. The integer buffer ``version`` (2), saved in the state dict, marks models built since
    that default; a state dict without it (version 1, trained when eps was 1e-6) sets eps to
    ``LEGACY_GAUSSIAN_EPS`` = 1e-6 when fairseq loads it (:meth:`upgrade_state_dict_named`), and keeps
    version 1 when saved again.
    """

    def __init__(self, hidden_size: int, generator_size: int = 20, eps: float = GAUSSIAN_EPS) -> None:
        super().__init__()
        if not eps >= 0:
            raise ValueError(f"--positional-attention-eps must not be negative, got {eps}")
        self.position_generator = LSTM(hidden_size, generator_size, batch_first=True)
        self.W_mu = Linear(generator_size, 3)
        self.w_sigma = Linear(generator_size, 1)
        self.configured_eps = eps
        self.eps = eps
        # integer: .half() / .to(dtype) leave it alone; fairseq's EMA skips keys named "version"
        self.register_buffer("version", torch.tensor([POSITIONAL_ATTENTION_VERSION]))

    def upgrade_state_dict_named(self, state_dict: Dict[str, Tensor], name: str) -> Dict[str, Tensor]:
        """Called by fairseq's ``load_state_dict`` (``BaseFairseqModel.upgrade_state_dict``) before
        the weights are copied: a state dict without ``<name>.version`` comes from a model trained
        when eps was 1e-6; it gets version 1, and this module eps 1e-6 (whatever the arguments say,
        which such a checkpoint does not hold). Version 2: the eps the module was built with."""
        key = f"{name}.version" if name else "version"
        version = state_dict.setdefault(key, torch.tensor([1]))
        self.eps = LEGACY_GAUSSIAN_EPS if int(version[0]) == 1 else self.configured_eps
        return state_dict

    def initialise_as_authors(self) -> None:
        """PyTorch's defaults, as the authors' code: the position generator U(+-1/sqrt(20)), W_mu and
        w_sigma U(+-1/sqrt(fan_in)), weights and biases."""
        self.position_generator.reset_parameters()
        self.W_mu.reset_parameters()
        self.w_sigma.reset_parameters()

    def generate(
        self, h: Tensor, state: Optional[Tuple[Tensor, Tensor]] = None
    ) -> Tuple[Tensor, Tensor, Tuple[Tensor, Tensor]]:
        """Position generator (eq. 5, 7, 9): B x S x H -> mu weights (B x S x 3, after the ReLU),
        sigma (B x S), both fp32, and the generator's final (h, c)."""
        h_tilde, state = self.position_generator(h, state)
        with full_precision(h.device):
            mu_weights = F.relu(fp32_linear(self.W_mu, h_tilde))
            sigma = torch.sigmoid(fp32_linear(self.w_sigma, h_tilde)).squeeze(-1)
        return mu_weights, sigma, state

    @staticmethod
    def recur_mu(mu_weights: Tensor, prev_mu: Tensor, normalizer: Tensor, offset: int) -> Tensor:
        """mu_t = clamp(mu_weights_t . [mu_{t-1}, 1/N, t/N], 0, t/N) for t = offset+1..offset+S
        (eq. 6, 8). The only loop over time; each iteration is one vector op over the batch.

        mu_weights: B x S x 3; prev_mu: B (mu_offset, 0 at the start); normalizer: B x 1; all
        fp32 (the caller's). Returns B x S."""
        steps = mu_weights.size(1)
        t = torch.arange(offset + 1, offset + steps + 1, device=mu_weights.device, dtype=mu_weights.dtype)
        t_over_n = t.unsqueeze(0) / normalizer  # B x S
        # the building blocks 1/N and t/N do not depend on mu: take them out of the loop
        known = mu_weights[..., 1] / normalizer + mu_weights[..., 2] * t_over_n
        carry = mu_weights[..., 0]
        mus = []
        mu = prev_mu
        for s in range(steps):
            mu = torch.minimum((carry[:, s] * mu + known[:, s]).clamp(min=0.0), t_over_n[:, s])
            mus.append(mu)
        return torch.stack(mus, dim=1)

    def forward(
        self,
        h: Tensor,
        memory: Tensor,
        offset: int,
        normalizer: Tensor,
        prev_mu: Optional[Tensor] = None,
        generator_state: Optional[Tuple[Tensor, Tensor]] = None,
    ) -> Tuple[Tensor, Tensor, Tensor, Tuple[Tensor, Tensor]]:
        """Contexts of the S new steps.

        Args:
            h: B x S x H new states (steps offset+1..offset+S).
            memory: B x K x H all states so far (K = offset + S; the last S are ``h``).
            offset: steps before ``h``.
            normalizer: B x 1 N (cast to fp32).
            prev_mu: B, mu_offset (None: mu_0 = 0).
            generator_state: the position generator's (h, c) after step ``offset``.

        Returns:
            context (B x S x H) and weights (B x S x K) in the dtype of ``memory``, mu (B x S,
            fp32), generator state.
        """
        mu_weights, sigma, generator_state = self.generate(h, generator_state)
        with full_precision(h.device):
            normalizer = normalizer.float()
            if prev_mu is None:
                prev_mu = torch.zeros(h.size(0), device=h.device, dtype=torch.float32)
            mu = self.recur_mu(mu_weights, prev_mu.float(), normalizer, offset)
            position = torch.arange(1, memory.size(1) + 1, device=h.device, dtype=torch.float32)
            position = position.unsqueeze(0) / normalizer  # B x K: p_i = i / N (eq. 12)
            distance = position.unsqueeze(1) - mu.unsqueeze(2)  # B x S x K
            log_gamma = -distance.pow(2) / (2 * sigma.pow(2).unsqueeze(2) + self.eps)  # eq. 10
        context, weights = causal_memory_attention(log_gamma, memory, offset)  # eq. 11, 13
        return context, weights, mu, generator_state


class AttentiveLSTMDecoder(FairseqIncrementalDecoder):
    """Multi-layer LSTM, attention over its own past top-layer states, concatenation layer, tied
    output embedding (see the module docstring for the equations)."""

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
        if attention not in ATTENTIONS:
            raise ValueError(f"unknown attention {attention!r}")
        if init not in INITS:
            raise ValueError(f"--attentive-lm-init must be one of {INITS}, not {init!r}")
        if positional_attention_normalizer not in NORMALIZERS:
            raise ValueError(
                f"--positional-attention-normalizer must be one of {NORMALIZERS}, "
                f"not {positional_attention_normalizer!r}")
        if attention == "positional" and positional_attention_normalizer == "block" and not block_length:
            raise ValueError("the block normalizer needs the block length (--tokens-per-sample)")
        if share_input_output_embed and out_embed_dim != embed_dim:
            raise ValueError(
                "--share-decoder-input-output-embed requires --decoder-embed-dim to match "
                "--decoder-out-embed-dim")
        if attention == "none" and out_embed_dim != hidden_size:
            raise ValueError(
                "without attention there is no concatenation layer: --decoder-out-embed-dim must equal "
                "--decoder-hidden-size")
        self.attention_type = attention
        self.hidden_size = hidden_size
        self.num_layers = num_layers
        self.share_input_output_embed = share_input_output_embed
        self.normalizer_type = positional_attention_normalizer
        self.block_length = block_length
        self.max_target_positions = max_target_positions
        self.offload_activations = offload_activations
        self.checkpoint_activations = checkpoint_activations or offload_activations

        padding_idx = dictionary.pad()
        self.padding_idx = padding_idx
        if pretrained_embed is None:
            self.embed_tokens = Embedding(len(dictionary), embed_dim, padding_idx)
        else:
            self.embed_tokens = pretrained_embed
        self.dropout_in_module = FairseqDropout(dropout_in, module_name=self.__class__.__name__)
        self.dropout_out_module = FairseqDropout(dropout_out, module_name=self.__class__.__name__)
        self.lstm = LSTM(
            embed_dim, hidden_size, num_layers=num_layers, batch_first=True,
            dropout=dropout_hidden if num_layers > 1 else 0.0,
        )
        self.attention: Optional[nn.Module] = None
        self.concat_proj: Optional[nn.Linear] = None
        if attention == "salton":
            self.attention = SaltonAttention(hidden_size)
        elif attention == "positional":
            self.attention = PositionalAttention(hidden_size, positional_attention_hidden, eps=positional_attention_eps)
        if self.attention is not None:
            self.concat_proj = Linear(2 * hidden_size, out_embed_dim)
        if share_input_output_embed:
            self.output_bias = nn.Parameter(torch.zeros(len(dictionary)))
        else:
            self.fc_out = Linear(out_embed_dim, len(dictionary))
            nn.init.zeros_(self.fc_out.bias)
        if init == "authors":
            self.initialise_as_authors()
        # the options of the model are recorded when it is built (PosattnHubMixin); N is derived here
        self.position_record = PositionOptionsRecord("decoder", reset=reset_position_options)
        if attention == "positional" and positional_attention_normalizer == "block":
            self.position_record.record({"positional_attention_block_length": (
                "--tokens-per-sample (the positional attention's N)", block_length)})

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
        cached = None
        if incremental_state is not None:
            cached = self.get_incremental_state(incremental_state, "cached_state")
        leaking = self.attention_type == "positional" and self.normalizer_type == "sentence"
        if incremental_state is not None and leaking:
            raise ValueError(
                "--positional-attention-normalizer sentence uses the length of the whole sentence "
                "(it leaks the future) and cannot decode step by step; train with the default "
                "'block' normalizer to generate")
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

        if self.attention is None:  # the baseline: out_t = h_t
            context = weights = None
            attention_state: Dict[str, Tensor] = {}
        elif self.checkpoint_activations and incremental_state is None and torch.is_grad_enabled():
            # the B x T x T part is recomputed in the backward pass instead of kept; no randomness
            context, weights, attention_state = checkpoint(
                self.attend, h, memory, offset, normalizer, cached, use_reentrant=False, preserve_rng_state=False)
        else:
            context, weights, attention_state = self.attend(h, memory, offset, normalizer, cached)

        if incremental_state is not None:
            new_state: Dict[str, Optional[Tensor]] = {"hidden": hidden, "cell": cell, "memory": memory}
            new_state.update(attention_state)
            self.set_incremental_state(incremental_state, "cached_state", new_state)

        out = h if context is None else torch.tanh(self.concat_proj(torch.cat([context, h], dim=-1)))
        out = self.dropout_out_module(out)
        # "attn" stays None: fairseq's generator reads it as attention over a *source*
        return out, {"attn": [None], "memory_attention": weights}

    def attend(
        self,
        h: Tensor,
        memory: Tensor,
        offset: int,
        normalizer: Optional[Tensor],
        cached: Optional[Dict[str, Optional[Tensor]]],
    ) -> Tuple[Tensor, Tensor, Dict[str, Tensor]]:
        """The attention of the S new steps ``h`` over ``memory`` (the segment that
        ``--checkpoint-activations`` recomputes): context (B x S x H), weights (B x S x K) and the
        attention's part of the incremental state (Salton's scores; mu_t and the position
        generator's state)."""
        if self.attention_type == "salton":
            scores = self.attention.score(h)
            if cached is not None:
                scores = torch.cat([cached["scores"], scores], dim=1)
            context, weights = self.attention(memory, scores, offset, h.size(1))
            return context, weights, {"scores": scores}
        generator_state = None
        if cached is not None:
            generator_state = (cached["generator_hidden"], cached["generator_cell"])
        prev_mu = None if cached is None else cached["mu"]
        context, weights, mu, (gen_h, gen_c) = self.attention(h, memory, offset, normalizer, prev_mu, generator_state)
        return context, weights, {"mu": mu[:, -1], "generator_hidden": gen_h, "generator_cell": gen_c}

    def output_layer(self, features: Tensor) -> Tensor:
        """Tied (or untied) projection to the vocabulary; on the CPU, the near-subnormal entries of
        the logits' gradient are set to 0 before its backward pass (module docstring)."""
        if self.share_input_output_embed:
            logits = F.linear(features, self.embed_tokens.weight, self.output_bias)
        else:
            logits = self.fc_out(features)
        if logits.requires_grad and logits.device.type == "cpu" and logits.dtype in SUBNORMAL_FLUSHED_DTYPES:
            logits.register_hook(flush_subnormal)
        return logits

    # ------------------------------------------------------------------ incremental state
    def reorder_incremental_state(self, incremental_state: IncrementalState, new_order: Tensor) -> None:
        cached = self.get_incremental_state(incremental_state, "cached_state")
        if cached is None:
            return
        batch_dim = {"hidden": 1, "cell": 1, "generator_hidden": 1, "generator_cell": 1}
        reordered: Dict[str, Optional[Tensor]] = {}
        for key, value in cached.items():
            reordered[key] = None if value is None else value.index_select(batch_dim.get(key, 0), new_order)
        self.set_incremental_state(incremental_state, "cached_state", reordered)

    def max_positions(self) -> int:
        return self.max_target_positions


def _add_lstm_lm_args(parser: argparse.ArgumentParser) -> None:
    # fmt: off
    parser.add_argument('--dropout', type=float, metavar='D',
                        help='dropout between the stacked LSTM layers (the paper\'s "recurrent '
                             'connections"), and the default of --decoder-dropout-in/-out when '
                             'given (default: the paper\'s, 0.2 between layers, 0.5 in and out; '
                             'baseline_lstm_lm: 0.25 between, 0.4 in, 0.5 out)')
    parser.add_argument('--decoder-embed-dim', type=int, metavar='N',
                        help='embedding dimension (default: 400)')
    parser.add_argument('--decoder-embed-path', type=str, metavar='STR',
                        help='path to pre-trained decoder embedding')
    parser.add_argument('--decoder-hidden-size', type=int, metavar='N',
                        help='LSTM hidden size (default: --decoder-embed-dim)')
    parser.add_argument('--decoder-layers', type=int, metavar='N',
                        help='number of stacked LSTM layers (default: 2; baseline_lstm_lm: 3)')
    parser.add_argument('--decoder-out-embed-dim', type=int, metavar='N',
                        help='output of the concatenation layer [c_t; h_t] -> this size; must equal '
                             '--decoder-embed-dim when tied (default: --decoder-embed-dim)')
    parser.add_argument('--decoder-dropout-in', type=float, metavar='D',
                        help='dropout on the input embeddings (default: --dropout if given, else 0.5; '
                             'baseline_lstm_lm: 0.4)')
    parser.add_argument('--decoder-dropout-out', type=float, metavar='D',
                        help='dropout after the concatenation layer (baseline_lstm_lm: after the LSTM), before '
                             'the output embedding (default: --dropout if given, else 0.5)')
    parser.add_argument('--share-decoder-input-output-embed', action=argparse.BooleanOptionalAction,
                        help='tie the output embedding to the input embedding (default: tied, as '
                             'the paper; --no-share-decoder-input-output-embed unties)')
    parser.add_argument('--checkpoint-activations', action='store_true',
                        help='recompute the attention over the past states (its B x T x T scores '
                             'and weights) in the backward pass instead of keeping it')
    parser.add_argument('--offload-activations', action='store_true',
                        help='keep the tensors saved for the backward pass in CPU memory; sets '
                             '--checkpoint-activations')
    parser.add_argument('--attentive-lm-init', choices=INITS,
                        help='authors (default): the released code\'s initialisation (PyTorch defaults '
                             'for the LSTMs, the concatenation layer, W_mu and w_sigma; xavier for '
                             'Salton\'s W_1 and w_2, zero biases); uniform: U(+-0.1) for every weight '
                             'and bias, as the paper\'s text')
    parser.add_argument('--decoder-reset-position-options', action='store_true',
                        help='load weights trained with other options that change what the model computes '
                             '(--tokens-per-sample of the positional attention\'s block N, the normaliser, the '
                             'sizes...: fine-tuning one model into another); refused otherwise, so that a resumed '
                             'checkpoint never silently becomes another model')
    # fmt: on


def _add_positional_args(parser: argparse.ArgumentParser) -> None:
    # fmt: off
    parser.add_argument('--positional-attention-hidden', type=int, metavar='N',
                        help='hidden size of the position-generator LSTM (default: 20)')
    parser.add_argument('--positional-attention-normalizer', choices=NORMALIZERS,
                        help='N in the positions i/N and t/N: "block" = --tokens-per-sample of the '
                             'training run (default, causal); "sentence" = the true length of each '
                             'sentence, the paper\'s choice, which LEAKS THE FUTURE (outputs depend '
                             'on the number of tokens that follow) and cannot generate step by step')
    parser.add_argument('--positional-attention-eps', type=float, metavar='EPS',
                        help='epsilon added to 2 sigma^2 in the Gaussian (default: 1e-3, the authors\' '
                             'code; models trained before this default keep 1e-6)')
    # fmt: on


@register_model("attentive_lstm_lm")
class AttentiveLSTMLanguageModel(PosattnHubMixin, FairseqLanguageModel):
    """Attentive LSTM language model (Salton et al. 2017), sizes of Dagan 2019 by default."""

    attention_type = "salton"

    def __init__(self, decoder: AttentiveLSTMDecoder) -> None:
        super().__init__(decoder)

    @staticmethod
    def add_args(parser: argparse.ArgumentParser) -> None:
        """Add model-specific arguments to the parser."""
        _add_lstm_lm_args(parser)

    @classmethod
    def build_model(cls, args: Any, task: Any) -> "AttentiveLSTMLanguageModel":
        """Build a new model instance (as fairseq's ``lstm_lm``)."""
        if cls.attention_type == "positional":
            positional_attentive_lstm_lm(args)
        elif cls.attention_type == "none":
            baseline_lstm_lm(args)
        else:
            attentive_lstm_lm(args)
        task_cfg = getattr(task, "args", None) or getattr(task, "cfg", None)
        # the training run's block length is in the model args (and so in the checkpoint)
        block_length = getattr(args, "tokens_per_sample", None) or getattr(task_cfg, "tokens_per_sample", None)
        max_target_positions = (
            getattr(args, "max_target_positions", None) or block_length or DEFAULT_MAX_TARGET_POSITIONS
        )

        dictionary = task.target_dictionary
        pretrained_embed = None
        if args.decoder_embed_path:
            embed = Embedding(len(dictionary), args.decoder_embed_dim, dictionary.pad())
            embed_dict = utils.parse_embedding(args.decoder_embed_path)
            utils.print_embed_overlap(embed_dict, dictionary)
            pretrained_embed = utils.load_embedding(embed_dict, dictionary, embed)

        if args.share_decoder_input_output_embed and task.source_dictionary != task.target_dictionary:
            raise ValueError("--share-decoder-input-output-embed requires a joint dictionary")

        decoder = AttentiveLSTMDecoder(
            dictionary,
            attention=cls.attention_type,
            embed_dim=args.decoder_embed_dim,
            hidden_size=args.decoder_hidden_size,
            out_embed_dim=args.decoder_out_embed_dim,
            num_layers=args.decoder_layers,
            dropout_in=args.decoder_dropout_in,
            dropout_hidden=args.dropout,
            dropout_out=args.decoder_dropout_out,
            share_input_output_embed=args.share_decoder_input_output_embed,
            pretrained_embed=pretrained_embed,
            positional_attention_hidden=getattr(args, "positional_attention_hidden", 20),
            positional_attention_normalizer=getattr(args, "positional_attention_normalizer", "block"),
            block_length=block_length,
            max_target_positions=int(max_target_positions),
            checkpoint_activations=args.checkpoint_activations,
            offload_activations=args.offload_activations,
            positional_attention_eps=getattr(args, "positional_attention_eps", GAUSSIAN_EPS),
            init=args.attentive_lm_init,
            reset_position_options=args.decoder_reset_position_options,
        )
        score_every_block(task, fixed_limit=None)  # no parameter depends on a position
        return cls(decoder)


@register_model("positional_attentive_lstm_lm")
class PositionalAttentiveLSTMLanguageModel(AttentiveLSTMLanguageModel):
    """Positional attentive LSTM language model (Dagan 2019)."""

    attention_type = "positional"

    @staticmethod
    def add_args(parser: argparse.ArgumentParser) -> None:
        """Add model-specific arguments to the parser."""
        _add_lstm_lm_args(parser)
        _add_positional_args(parser)


@register_model("baseline_lstm_lm")
class BaselineLSTMLanguageModel(AttentiveLSTMLanguageModel):
    """Dagan's LSTM baseline (2019, Table 1: "Merity et al.", 7.86M parameters on PTB) as the authors' code
    builds it: their language model with attention off (no concatenation layer; ``logits_t = E h_t + b``),
    3 LSTM layers of 400, tied, dropout 0.4 on the embeddings, 0.25 between the layers, 0.5 on the output.
    Not AWD-LSTM: no weight drop, no variational dropout, no ASGD, as theirs."""

    attention_type = "none"


@register_model_architecture("attentive_lstm_lm", "attentive_lstm_lm")
def attentive_lstm_lm(args: Any) -> None:
    """The paper's sizes: embeddings and two LSTM layers of 400, tied, dropout 0.5 / 0.2 / 0.5."""
    dropout = getattr(args, "dropout", None)
    args.dropout = 0.2 if dropout is None else dropout
    args.decoder_embed_dim = getattr(args, "decoder_embed_dim", 400)
    args.decoder_embed_path = getattr(args, "decoder_embed_path", None)
    args.decoder_hidden_size = getattr(args, "decoder_hidden_size", args.decoder_embed_dim)
    args.decoder_layers = getattr(args, "decoder_layers", 2)
    args.decoder_out_embed_dim = getattr(args, "decoder_out_embed_dim", args.decoder_embed_dim)
    for name in ("decoder_dropout_in", "decoder_dropout_out"):
        if getattr(args, name, None) is None:
            setattr(args, name, 0.5 if dropout is None else dropout)
    if getattr(args, "share_decoder_input_output_embed", None) is None:
        args.share_decoder_input_output_embed = True
    args.offload_activations = getattr(args, "offload_activations", False)
    args.checkpoint_activations = getattr(args, "checkpoint_activations", False) or args.offload_activations
    # only matters for a new model: a checkpoint's weights replace the initialisation
    args.attentive_lm_init = getattr(args, "attentive_lm_init", None) or "authors"
    args.decoder_reset_position_options = getattr(args, "decoder_reset_position_options", False)


@register_model_architecture("positional_attentive_lstm_lm", "positional_attentive_lstm_lm")
def positional_attentive_lstm_lm(args: Any) -> None:
    """:func:`attentive_lstm_lm` plus a position generator of 20 and the causal block normalizer."""
    attentive_lstm_lm(args)
    args.positional_attention_hidden = getattr(args, "positional_attention_hidden", 20)
    args.positional_attention_normalizer = getattr(args, "positional_attention_normalizer", "block")
    # a checkpoint trained when the default was 1e-6 has no such argument: it gets 1e-3 here, and
    # PositionalAttention.upgrade_state_dict_named sets 1e-6 back when its weights are loaded
    if getattr(args, "positional_attention_eps", None) is None:
        args.positional_attention_eps = GAUSSIAN_EPS


@register_model_architecture("baseline_lstm_lm", "baseline_lstm_lm")
def baseline_lstm_lm(args: Any) -> None:
    """The authors' run of the baseline (their test.py): 3 LSTM layers of 400, tied, dropout 0.4 / 0.25 / 0.5
    (embeddings / between the layers / output)."""
    dropout = getattr(args, "dropout", None)
    args.dropout = 0.25 if dropout is None else dropout
    args.decoder_layers = getattr(args, "decoder_layers", 3)
    for name, default in (("decoder_dropout_in", 0.4), ("decoder_dropout_out", 0.5)):
        if getattr(args, name, None) is None:
            setattr(args, name, default if dropout is None else dropout)
    attentive_lstm_lm(args)
