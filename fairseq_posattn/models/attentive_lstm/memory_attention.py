"""The step both attentions share: a causal softmax over the memory h_1..h_{t-1} and the weighted sum
``c_t = sum_{i<t} a_it h_i`` (Dagan eq. 2 / 13; c_1 = 0: empty memory)."""

from typing import Tuple

import torch
from torch import Tensor

from fairseq_posattn.models.attentive_lstm.numerics import full_precision


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
