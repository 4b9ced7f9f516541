"""The Forgetting Transformer's forget gate (Lin et al. 2025, "Forgetting Transformer: Softmax Attention with a
Forget Gate", ICLR 2025, section 3), a baseline.

Forgetting Attention gives every head h a scalar forget gate per token t, computed from the token's input to
the attention layer,

    f_t = sigmoid(w_h . x_t + b_h),

and multiplies the unnormalised attention of query i on key j <= i by the product of the gates after j:
``exp(q_i . k_j) * prod_{l = j+1 .. i} f_l``. In logits this is an additive bias

    D_ij = sum_{l = j+1 .. i} log f_l = c_i - c_j,     c_i = sum_{l <= i} log f_l,

a difference of per-token cumulative sums, which is how the kernel takes it: a
:class:`~posattn.position_terms.base.TokenDifferenceBias`, whose values ``c`` are computed in
the forward pass with their gradient and fused by flex_attention as ``score + c_i - c_j``.

Choices:

- **the gate's input** is the attention layer's input as fairseq hands it to self-attention (after the layer
  norm on a pre-norm side), one linear map with one output per head and a bias; initialised as the authors'
  code does (weights normal with standard deviation 0.02, bias 0: every gate starts at 0.5);
- **the values in fp32** (fp64 for a double model): ``log sigmoid`` and the cumulative sum run there, as in the
  authors' code, whatever the model's precision; ``c`` reaches about ``-0.7`` per token at the start, and fp32
  keeps ``c_i - c_j`` to 1e-3 at 4,096 tokens;
- **padding**: a pad's gate is 1 (``log f = 0``), so a pad changes no ``c`` and a padded batch gives each
  sentence the biases it has alone;
- **incremental decoding** caches ``c`` of the earlier tokens (the kernel keeps it beside the keys, reordered
  with them for beam search); a step continues the sum from the last cached value;
- **causal sides only** (the decoder, the language model): the gates accumulate along the order of the
  tokens, which a bidirectional encoder does not have; the option exists on the decoder only;
- the paper's FoX uses no position embedding: for its setting add ``--no-token-positional-embeddings``;
  the "Pro" block's output gate, QK-norm and key/value shift are not part of this method.
"""

from typing import Any, List, Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from posattn.position_context import PositionContext
from posattn.position_terms.base import TokenDifferenceBias, at_least_fp32, same_dtype
from posattn.position_terms.quantities import BARS, Quantity
from posattn.position_terms.registry import LayerSpec, MethodOption, PositionMethod, register

#: the standard deviation of the gate weights' initialisation (the authors' ``initializer_range``)
GATE_INIT_STD = 0.02


class ForgetGateBias(TokenDifferenceBias):
    """``logits[b, h, i, j] += c[b, h, i] - c[b, h, j]``, ``c`` the cumulative log forget gates of head h."""

    def __init__(self, embed_dim: int, num_heads: int):
        super().__init__()
        self.gate = nn.Linear(embed_dim, num_heads)
        nn.init.normal_(self.gate.weight, std=GATE_INIT_STD)
        nn.init.zeros_(self.gate.bias)

    def log_gates(self, x: Tensor, ctx: PositionContext) -> Tensor:
        """``(batch, heads, tgt_len)``: ``log f_t`` of the current tokens (0 at pads), in fp32 at least."""
        logits = self.gate(x)  # tgt_len x batch x heads
        log_gates = F.logsigmoid(same_dtype(logits, at_least_fp32(logits.dtype))).permute(1, 2, 0)
        return log_gates.masked_fill(ctx.query_padding_mask(x.size(0))[:, None, :], 0.0)

    def token_values(self, x: Tensor, ctx: PositionContext, earlier: Optional[Tensor]) -> Tensor:
        """``c`` of every token: the earlier tokens' followed by the sums continued over the current ones."""
        return self.continued_sums(self.log_gates(x, ctx), earlier)

    def inspect(self, positions: int) -> List[Quantity]:
        """Per head, the gate at a zero input ``sigmoid(b_h)`` and the norm of its weights ``|w_h|`` (the gates
        themselves depend on the tokens)."""
        bias = torch.sigmoid(self.gate.bias.detach().float().cpu())
        norm = self.gate.weight.detach().float().cpu().norm(dim=1)
        return [Quantity("gate-at-zero-input", bias, BARS, "forget gate sigmoid(b_h) at a zero input", signed=False),
                Quantity("gate-weight-norm", norm, BARS, "norm of the forget gate's weights |w_h|", signed=False)]


class ForgetGateMethod(PositionMethod):
    name = "forget-gate"
    citation = "Lin et al. 2025, section 3"
    sides = ("decoder",)
    options = (
        MethodOption("forget_gate", False,
                     "the Forgetting Transformer's data-dependent forget gate in every layer of the {what} (Lin "
                     "et al. 2025): f_t = sigmoid(w_h . x_t + b_h) per head and token, the logit of query i and key "
                     "j biased by sum_{{l=j+1..i}} log f_l (the paper's FoX also drops position embeddings: "
                     "--no-token-positional-embeddings)"),
    )
    benchmark_target = "additive"
    variants = {"forget-gate": {"forget_gate": True}}
    labels = {"forget-gate": "FoX"}
    combined = {"forget_gate": True}

    def is_on(self, options: Any) -> bool:
        return options.forget_gate

    def terms(self, options: Any, layer: LayerSpec) -> List[nn.Module]:
        return [ForgetGateBias(layer.num_heads * layer.head_dim, layer.num_heads)]


register(ForgetGateMethod())
