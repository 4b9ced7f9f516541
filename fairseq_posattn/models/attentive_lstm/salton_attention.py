"""Salton et al. 2017's attention over the memory, the attention of ``attentive_lstm_lm`` (Dagan eq. 1, 2
and 4; the equations of the whole model: the package docstring). W_1 is affine (``nn.Linear`` with bias),
as in the authors' code; w_2 has no bias (it would cancel in the softmax)."""

from typing import Tuple

import torch
from fairseq.models.lstm import Linear
from torch import Tensor, nn

from fairseq_posattn.models.attentive_lstm.memory_attention import causal_memory_attention
from fairseq_posattn.models.attentive_lstm.numerics import fp32_linear, full_precision


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
