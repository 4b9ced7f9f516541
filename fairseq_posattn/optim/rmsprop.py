"""``--optimizer rmsprop``: the optimizer of Dufter et al. (2020, Table 1b), which fairseq lacks.

The paper trains "RMSprop with default parameters as in keras.io": learning rate 0.001, rho 0.9,
epsilon 1e-7, no momentum. Keras adds epsilon to the square root of the running average, as
:class:`torch.optim.RMSprop` does; its ``alpha`` is Keras's ``rho``.
"""

from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any, Dict, List

import torch
from fairseq.dataclass import FairseqDataclass
from fairseq.optim import FairseqOptimizer, register_optimizer
from omegaconf import II


@dataclass
class RMSpropConfig(FairseqDataclass):
    rmsprop_rho: float = field(default=0.9, metadata={"help": "decay of the running average of squared gradients"})
    rmsprop_eps: float = field(default=1e-7, metadata={"help": "added to the root mean square"})
    rmsprop_momentum: float = field(default=0.0, metadata={"help": "momentum"})
    weight_decay: float = field(default=0.0, metadata={"help": "weight decay"})
    lr: List[float] = II("optimization.lr")


@register_optimizer("rmsprop", dataclass=RMSpropConfig)
class FairseqRMSprop(FairseqOptimizer):
    def __init__(self, cfg: RMSpropConfig, params):
        super().__init__(cfg)
        self._optimizer = torch.optim.RMSprop(params, **self.optimizer_config)

    @property
    def optimizer_config(self) -> Dict[str, Any]:
        return {
            "lr": self.cfg.lr[0] if isinstance(self.cfg.lr, Collection) else self.cfg.lr,
            "alpha": self.cfg.rmsprop_rho,
            "eps": self.cfg.rmsprop_eps,
            "momentum": self.cfg.rmsprop_momentum,
            "weight_decay": self.cfg.weight_decay,
        }
