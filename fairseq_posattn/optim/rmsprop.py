"""``--optimizer rmsprop``: the optimizer of Dufter et al. (2020, Table 1b), which fairseq lacks.

The paper trains "RMSprop with default parameters as in keras.io": learning rate 0.001, rho 0.9,
epsilon 1e-7, no momentum. Keras adds epsilon to the square root of the running average, as
:class:`torch.optim.RMSprop` does; its ``alpha`` is Keras's ``rho``. For fp32 parameters the step
is exactly :class:`torch.optim.RMSprop`'s (non-centered)::

    g   <- grad + weight_decay * theta
    v   <- rho * v + (1 - rho) * g^2
    b   <- momentum * b + g / (sqrt(v) + eps)     (b = g / (sqrt(v) + eps) without momentum)
    theta <- theta - lr * b

It runs under every mixed-precision mode of fairseq. ``--fp16`` hands it one flat fp32 copy of all
parameters (the rule is elementwise, so flattening changes nothing; ``--bf16`` and
``--fp16-no-flatten-grads`` hand it one fp32 copy per parameter). ``--memory-efficient-fp16`` /
``--memory-efficient-bf16`` hand it the fp16 / bf16 parameters themselves: it then keeps its running
averages in fp32, takes the step on an fp32 copy of each parameter and writes the result back,
rounded once, so the state never loses precision.
"""

from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional

import torch
from fairseq.dataclass import FairseqDataclass
from fairseq.optim import FairseqOptimizer, register_optimizer
from omegaconf import II

LOW_PRECISION = (torch.float16, torch.bfloat16)


@dataclass
class RMSpropConfig(FairseqDataclass):
    rmsprop_rho: float = field(default=0.9, metadata={"help": "decay of the running average of squared gradients"})
    rmsprop_eps: float = field(default=1e-7, metadata={"help": "added to the root mean square"})
    rmsprop_momentum: float = field(default=0.0, metadata={"help": "momentum"})
    weight_decay: float = field(default=0.0, metadata={"help": "weight decay"})
    lr: List[float] = II("optimization.lr")


class RMSprop(torch.optim.Optimizer):
    """Non-centered RMSprop with fp32 state for fp32, fp16 and bf16 parameters.

    The state keys (``step``, ``square_avg``, ``momentum_buffer``) are :class:`torch.optim.RMSprop`'s,
    so optimizer states saved by either load into the other.
    """

    def __init__(self, params, lr: float = 1e-3, alpha: float = 0.9, eps: float = 1e-7,
                 momentum: float = 0.0, weight_decay: float = 0.0):
        super().__init__(params, dict(lr=lr, alpha=alpha, eps=eps, momentum=momentum, weight_decay=weight_decay))

    @property
    def supports_memory_efficient_fp16(self) -> bool:
        return True

    @property
    def supports_flat_params(self) -> bool:
        return True

    @torch.no_grad()
    def step(self, closure: Optional[Callable[[], torch.Tensor]] = None) -> Optional[torch.Tensor]:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            for param in group["params"]:
                if param.grad is not None:
                    self._update(param, group)
        return loss

    def _update(self, param: torch.Tensor, group: Dict[str, Any]) -> None:
        if param.grad.is_sparse:
            raise RuntimeError("--optimizer rmsprop does not support sparse gradients")
        low_precision = param.dtype in LOW_PRECISION
        weights = param.float() if low_precision else param  # the fp32 copy that takes the step
        grad = param.grad.float()
        state = self._fp32_state(param, weights, group["momentum"] > 0)
        state["step"] += 1
        if group["weight_decay"] != 0:
            grad = grad.add(weights, alpha=group["weight_decay"])
        square_avg = state["square_avg"]
        square_avg.mul_(group["alpha"]).addcmul_(grad, grad, value=1 - group["alpha"])
        root = square_avg.sqrt().add_(group["eps"])
        if group["momentum"] > 0:
            buffer = state["momentum_buffer"]
            buffer.mul_(group["momentum"]).addcdiv_(grad, root)
            weights.add_(buffer, alpha=-group["lr"])
        else:
            weights.addcdiv_(grad, root, value=-group["lr"])
        if low_precision:
            param.copy_(weights)

    def _fp32_state(self, param: torch.Tensor, weights: torch.Tensor, momentum: bool) -> Dict[str, Any]:
        """The parameter's state, created as fp32 zeros; a loaded state is moved to fp32 on the
        parameter's device (``torch.optim`` casts a loaded state to the parameter's dtype)."""
        state = self.state[param]
        if not state:
            state["step"] = 0
        names = ("square_avg", "momentum_buffer") if momentum else ("square_avg",)
        for name in names:
            state[name] = torch.zeros_like(weights) if name not in state else state[name].to(weights)
        return state


OPTIONS = {"lr": "--lr", "alpha": "--rmsprop-rho", "eps": "--rmsprop-eps", "momentum": "--rmsprop-momentum",
           "weight_decay": "--weight-decay"}


def check_options(config: Dict[str, float]) -> None:
    """Refuse a negative setting, or a rho outside [0, 1), naming the option."""
    for key, option in OPTIONS.items():
        if config[key] < 0 or (key == "alpha" and config[key] >= 1):
            allowed = "in [0, 1)" if key == "alpha" else ">= 0"
            raise ValueError(f"--optimizer rmsprop: {option} must be {allowed}, got {config[key]}")


@register_optimizer("rmsprop", dataclass=RMSpropConfig)
class FairseqRMSprop(FairseqOptimizer):
    def __init__(self, cfg: RMSpropConfig, params):
        super().__init__(cfg)
        check_options(self.optimizer_config)
        self._optimizer = RMSprop(params, **self.optimizer_config)

    @property
    def optimizer_config(self) -> Dict[str, Any]:
        return {
            "lr": self.cfg.lr[0] if isinstance(self.cfg.lr, Collection) else self.cfg.lr,
            "alpha": self.cfg.rmsprop_rho,
            "eps": self.cfg.rmsprop_eps,
            "momentum": self.cfg.rmsprop_momentum,
            "weight_decay": self.cfg.weight_decay,
        }
