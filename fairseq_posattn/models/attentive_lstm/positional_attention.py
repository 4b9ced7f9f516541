"""Dagan 2019's positional attention over the memory, the attention of ``positional_attentive_lstm_lm``
(eq. 5-13, with the clamp that eq. 8's text means; the equations of the whole model: the package
docstring).

Choices (the authors' code, gautierdag/pytorch-attentive-lm, decides where it is unambiguous;
docs/methods.md has the table):

* eps (``--positional-attention-eps``): 1e-3, the authors' value (their ``10e-4``). It is part of the
  function: with N = 35, the neighbour of the Gaussian's peak keeps at least 0.44 of its weight
  however small sigma gets, where 1e-6 lets the attention focus on a single state. Models trained
  when the default was 1e-6 keep it: :class:`PositionalAttention` saves an integer ``version``
  buffer, and a state dict without one (version 1) is loaded with eps 1e-6
  (``upgrade_state_dict_named``, which fairseq's checkpoint loading calls).
* The normalisation of gamma is computed as a softmax of the Gaussian log-scores, which is the same
  function as exp(.) / sum exp(.) but never divides 0 by 0 when every exp underflows.
* W_mu and w_sigma are affine (``nn.Linear`` with bias), as in the authors' code.

The only loop over time is the scalar mu recurrence, vectorised over the batch.
"""

from typing import Dict, Optional, Tuple

import torch
import torch.nn.functional as F
from fairseq.models.lstm import LSTM, Linear
from torch import Tensor, nn

from fairseq_posattn.models.attentive_lstm.memory_attention import causal_memory_attention
from fairseq_posattn.models.attentive_lstm.numerics import fp32_linear, full_precision

GAUSSIAN_EPS = 1e-3  # the authors' code (model.py, written 10e-4)
LEGACY_GAUSSIAN_EPS = 1e-6  # models trained before the default became 1e-3 (version 1, no ``version`` buffer)
POSITIONAL_ATTENTION_VERSION = 2  # saved as PositionalAttention's ``version`` buffer

LSTMState = Tuple[Tensor, Tensor]


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

    def generate(self, h: Tensor, state: Optional[LSTMState] = None) -> Tuple[Tensor, Tensor, LSTMState]:
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

    def gaussian_log_scores(self, mu: Tensor, sigma: Tensor, normalizer: Tensor, keys: int) -> Tensor:
        """``log gamma_it = -(i/N - mu_t)^2 / (2 sigma_t^2 + eps)`` (eq. 10, 12) of the memory positions
        i = 1..``keys``: B x S x K. mu, sigma (B x S) and normalizer (B x 1) fp32 (the caller's)."""
        position = torch.arange(1, keys + 1, device=mu.device, dtype=torch.float32)
        position = position.unsqueeze(0) / normalizer  # B x K: p_i = i / N (eq. 12)
        distance = position.unsqueeze(1) - mu.unsqueeze(2)  # B x S x K
        return -distance.pow(2) / (2 * sigma.pow(2).unsqueeze(2) + self.eps)  # eq. 10

    def forward(
        self,
        h: Tensor,
        memory: Tensor,
        offset: int,
        normalizer: Tensor,
        prev_mu: Optional[Tensor] = None,
        generator_state: Optional[LSTMState] = None,
    ) -> Tuple[Tensor, Tensor, Tensor, LSTMState]:
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
            log_gamma = self.gaussian_log_scores(mu, sigma, normalizer, memory.size(1))
        context, weights = causal_memory_attention(log_gamma, memory, offset)  # eq. 11, 13
        return context, weights, mu, generator_state
