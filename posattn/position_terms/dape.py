"""DAPE, data-adaptive positional encoding (Zheng et al. 2024, "DAPE: Data-Adaptive Positional Encoding for Length
Extrapolation", NeurIPS, arXiv 2405.14722, section 3; docs/methods.md, DAPE).

On top of an additive bias method (the paper: ALiBi, Kerple, FIRE), the logit of query i and key j in head h gets an
MLP of the content logits and the biases of every head at that (i, j):

    A_ij = Q_i K_j^T / sqrt(d_h) + B_ij + f([Q_i K_j^T / sqrt(d_h); B_ij])_h,
    f(x) = W_2 LeakyReLU(W_1 x + b_1) + b_2,     W_1: D x 2H,  W_2: H x D,

the same MLP at every (i, j) (the authors' ``mlp2``: ``nn.Linear(2H, D)``, ``nn.LeakyReLU()`` of slope 0.01,
``nn.Linear(D, H)``, PyTorch's default initialisation; the paper's D = 32).

Choices:

- **the bias B is the sum of the layer's additive biases** (every additive method on the side: ALiBi, KERPLE, FIRE,
  T5, the direct interactions, Sandwich, ...), as the kernel adds them in step 4, rather than one named method:
  with one bias method on, as in the paper, it is that method's bias; a layer with none is refused at start-up;
- **the content logits** are those before the biases (steps 2-3: ``q k^T / sqrt(d_h)`` with any key terms and
  logit scaling); the MLP reads them before the masks, as the authors' code (its masks come after, in the softmax),
  and its output is masked with the rest;
- the MLP runs in fp32 at least (fp64 for a double model).

The MLP mixes the heads at every (query, key): flex_attention's ``score_mod`` sees one head's score at a time, so a
layer with DAPE takes the explicit path. Each entry depends on its own query and key only: decoding caches nothing.
"""

from typing import Any, List, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from posattn.position_context import PositionContext
from posattn.position_terms.base import LogitMatrixTransform, LogitParts, at_least_fp32, same_dtype
from posattn.position_terms.quantities import TABLE, Quantity
from posattn.position_terms.registry import (
    LayerSpec,
    MethodOption,
    PositionMethod,
    PositionOptionError,
    register,
)

#: the slope of ``nn.LeakyReLU()``'s default, which the authors' MLP uses
LEAKY_SLOPE = 0.01


class DataAdaptiveBias(LogitMatrixTransform):
    """``logits + f([content; bias])``: DAPE's MLP across heads (module docstring)."""

    reads_bias = True

    def __init__(self, num_heads: int, width: int):
        super().__init__()
        self.num_heads, self.width = num_heads, width
        self.mlp_in = nn.Linear(2 * num_heads, width)
        self.mlp_out = nn.Linear(width, num_heads)

    def extra_repr(self) -> str:
        return f"heads={self.num_heads}, width={self.width}"

    def forward(self, logits: Tensor, ctx: PositionContext, history: Optional[Tensor],
                parts: Optional[LogitParts]) -> Tuple[Tensor, Optional[Tensor]]:
        if parts is None:
            raise ValueError("DAPE reads the content logits and the additive biases: the kernel hands them (parts)")
        dtype = at_least_fp32(logits.dtype)
        content = same_dtype(parts.content, dtype)
        features = features_of(content, same_dtype(parts.bias, dtype).expand(content.shape))
        hidden = F.leaky_relu(F.linear(features, same_dtype(self.mlp_in.weight, dtype),
                                       same_dtype(self.mlp_in.bias, dtype)), LEAKY_SLOPE)
        out = F.linear(hidden, same_dtype(self.mlp_out.weight, dtype), same_dtype(self.mlp_out.bias, dtype))
        return same_dtype(logits, dtype) + out.movedim(-1, 1), None

    def inspect(self, positions: int) -> List[Quantity]:
        """The MLP's two weight matrices (no position axis: ``positions`` is unused)."""
        inputs = [f"logit {h}" for h in range(self.num_heads)] + [f"bias {h}" for h in range(self.num_heads)]
        return [Quantity("mlp_in", self.mlp_in.weight.detach().float().cpu(), TABLE, "DAPE MLP, first layer W_1",
                         axes=("hidden unit", "input"), ticks=(list(range(self.width)), inputs)),
                Quantity("mlp_out", self.mlp_out.weight.detach().float().cpu(), TABLE, "DAPE MLP, second layer W_2",
                         axes=("head", "hidden unit"))]


def features_of(content: Tensor, bias: Tensor) -> Tensor:
    """``(batch, tgt_len, src_len, 2 heads)``: the content logits' heads, then the biases', at every (query, key)."""
    return torch.cat([content, bias], dim=1).movedim(1, -1)


class DataAdaptiveMethod(PositionMethod):
    name = "dape"
    citation = "Zheng et al. 2024, section 3"
    options = (
        MethodOption("dape", 0,
                     "DAPE in every layer of the {what} (Zheng et al. 2024): adds f([QK^T; B]) to the logits, an MLP "
                     "across heads (2H -> D -> H, LeakyReLU) of the content logits and B, the sum of the layer's "
                     "additive biases (it needs a bias method on: ALiBi, KERPLE, FIRE, ...); the value is D, the "
                     "hidden width (the paper's 32); 0 = off"),
    )
    benchmark_target = "scaling"
    variants = {"dape-kerple": {"dape": 8, "kerple": "log"}}
    labels = {"dape-kerple": "DAPE (KERPLE log, D = 8)"}
    combined = {"dape": 8}

    def is_on(self, options: Any) -> bool:
        return options.dape > 0

    def validate(self, options: Any) -> None:
        if options.dape < 0:
            raise PositionOptionError(f"{options.flag('dape')} must be 0 (off) or the MLP's hidden width D (the "
                                      f"paper's 32), got {options.dape}")

    def terms(self, options: Any, layer: LayerSpec) -> List[nn.Module]:
        return [DataAdaptiveBias(layer.num_heads, options.dape)]


register(DataAdaptiveMethod())
