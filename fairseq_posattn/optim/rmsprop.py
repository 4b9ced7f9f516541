"""``--optimizer rmsprop``: the optimizer of Dufter et al. (2020, Table 1b), which fairseq lacks.

The paper trains "RMSprop with default parameters as in keras.io": learning rate 0.001, rho 0.9,
epsilon 1e-7, no momentum. Which Keras is not said, and the Kerases disagree on where epsilon goes:

- standalone Keras 2 (keras-team/keras up to 2.3, current when the paper's experiments ran) adds it
  to the root, ``g / (sqrt(v) + eps)``, as :class:`torch.optim.RMSprop` does:
  ``--rmsprop-eps-placement outside-root``, the default;
- tf.keras (TensorFlow 2's ``ApplyRMSProp``) and Keras 3 add it under the root,
  ``g / sqrt(v + eps)``: ``--rmsprop-eps-placement inside-root``.

The two differ only where the running average ``v`` is of the order of ``eps`` (rarely-updated
parameters, the first steps). Keras's ``rho`` is torch's ``alpha``. The step (non-centered)::

    g   <- grad + weight_decay * theta
    v   <- rho * v + (1 - rho) * g^2
    r   <- sqrt(v) + eps   (outside-root)   or   sqrt(v + eps)   (inside-root)
    b   <- momentum * b + g / r     (b = g / r without momentum)
    theta <- theta - lr * b

With ``outside-root`` and fp32 parameters it is exactly :class:`torch.optim.RMSprop`'s. (Keras 3
folds the learning rate into its momentum buffer; with a constant learning rate that is the same.)

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
EPS_PLACEMENTS = ("outside-root", "inside-root")


@dataclass
class RMSpropConfig(FairseqDataclass):
    rmsprop_rho: float = field(default=0.9, metadata={"help": "decay of the running average of squared gradients"})
    rmsprop_eps: float = field(default=1e-7, metadata={"help": "added to the root mean square"})
    # a str, not a ChoiceEnum: fairseq keeps an optimizer's enum value as an Enum member that
    # checkpoints cannot pickle; check_options refuses other values
    rmsprop_eps_placement: str = field(default="outside-root", metadata={
        "help": "outside-root: g / (sqrt(v) + eps), standalone Keras 2 and torch; inside-root: "
                "g / sqrt(v + eps), tf.keras and Keras 3"})
    rmsprop_momentum: float = field(default=0.0, metadata={"help": "momentum"})
    weight_decay: float = field(default=0.0, metadata={"help": "weight decay"})
    lr: List[float] = II("optimization.lr")


class RMSprop(torch.optim.Optimizer):
    """Non-centered RMSprop with fp32 state for fp32, fp16 and bf16 parameters.

    The state keys (``step``, ``square_avg``, ``momentum_buffer``) are :class:`torch.optim.RMSprop`'s,
    so optimizer states saved by either load into the other.
    """

    def __init__(self, params, lr: float = 1e-3, alpha: float = 0.9, eps: float = 1e-7,
                 momentum: float = 0.0, weight_decay: float = 0.0, eps_placement: str = "outside-root"):
        if eps_placement not in EPS_PLACEMENTS:
            raise ValueError(f"eps_placement must be one of {EPS_PLACEMENTS}, got {eps_placement!r}")
        super().__init__(params, dict(lr=lr, alpha=alpha, eps=eps, momentum=momentum, weight_decay=weight_decay,
                                      eps_placement=eps_placement))

    def __setstate__(self, state: Dict[str, Any]) -> None:
        """A state saved by :class:`torch.optim.RMSprop` has torch's placement: outside the root."""
        super().__setstate__(state)
        for group in self.param_groups:
            group.setdefault("eps_placement", "outside-root")

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
        root = root_mean_square(square_avg, group["eps"], group["eps_placement"])
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


def root_mean_square(square_avg: torch.Tensor, eps: float, placement: str) -> torch.Tensor:
    """The step's denominator ``r``: ``sqrt(v) + eps`` (outside-root) or ``sqrt(v + eps)`` (inside-root)."""
    if placement == "inside-root":
        return square_avg.add(eps).sqrt_()
    return square_avg.sqrt().add_(eps)


OPTIONS = {"lr": "--lr", "alpha": "--rmsprop-rho", "eps": "--rmsprop-eps", "momentum": "--rmsprop-momentum",
           "weight_decay": "--weight-decay"}


def check_options(config: Dict[str, Any]) -> None:
    """Refuse a negative setting, a rho outside [0, 1) or an unknown epsilon placement, naming the option."""
    if config["eps_placement"] not in EPS_PLACEMENTS:
        raise ValueError(f"--optimizer rmsprop: --rmsprop-eps-placement must be one of {', '.join(EPS_PLACEMENTS)}, "
                         f"got {config['eps_placement']!r}")
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
            "eps_placement": self.cfg.rmsprop_eps_placement,
        }
