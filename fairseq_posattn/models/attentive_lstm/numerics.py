"""The numerics of the attentive LSTM language models: fp32 regions under mixed precision, the flushing of
subnormal gradients on the CPU, and the offloading of saved activations to CPU memory.

Mixed precision (``--fp16``, ``--bf16``, ``--amp``): the LSTMs, the projections and the weighted
sum run in the model's dtype; the numerically sensitive part of the attention runs in fp32 (autocast
disabled there, :func:`full_precision`; the layers cast, :func:`fp32_linear`) and its weights are cast
back, as fairseq does for its softmax: Salton's tanh and w_2 product, the softmax over the memory, and
everything of Dagan's after the position generator (W_mu, w_sigma and the sigmoid, the mu recurrence,
i/N, the Gaussian log-scores). In half precision the gradient of the log-score overflows once sigma is
below about 0.04, and in bf16 the positions i/N of a long block are not distinct. fp32 results are
unchanged.

Subnormal gradients (CPU training): once a row's logits span more than about 87 (which training at
the paper's lr 30 reaches within the first ten updates of ``scripts/benchmark_lstm_lm.py``), the
softmax gives probabilities below fp32's smallest normal number (2^-126, 1.2e-38), and the
criterion's gradient of the logits holds millions of subnormal entries, or entries whose products
with the output embedding are subnormal. The CPU computes with subnormals about 60 times slower: the
output layer's backward pass then takes seconds instead of tens of milliseconds (a whole train step
up to 25 times its usual time). On the CPU (GPUs compute with subnormals at full speed), a hook on
the logits sets the entries of their gradient below ``SUBNORMAL_GUARD`` = 2^-100 (8e-31) to 0 before
the output layer's backward pass (one elementwise pass, :func:`flush_subnormal`); their products with
any weight above 2^-26 are then normal. An entry that small is below fp32's resolution of every sum
it enters unless that sum is itself below about 1e-23: the gradients are the same numbers in
practice, and bit for bit the same while no entry is that small.

Offloading (``--offload-activations``): the tensors saved for the backward pass outside the
checkpointed attention wait in CPU memory (:class:`SavedOnCPU`: pinned on CUDA; the parameters stay
where they are).
"""

from typing import ContextManager, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

# on the CPU, the logits' gradient entries below this are set to 0 (module docstring), in fp32 and
# bf16 (whose subnormals lie below 2^-126); fp16's start at 6e-5 and are left alone
SUBNORMAL_GUARD = 2.0 ** -100
SUBNORMAL_FLUSHED_DTYPES = (torch.float32, torch.bfloat16)


def full_precision(device: torch.device) -> ContextManager:
    """A region computed in the dtype of its inputs even under ``torch.autocast`` (``--amp``):
    the callers cast to fp32 themselves."""
    return torch.autocast(device_type=device.type, enabled=False)


def fp32_linear(layer: nn.Linear, x: Tensor) -> Tensor:
    """``layer(x)`` computed in fp32 (the weights cast, not changed); the same numbers in fp32."""
    bias = None if layer.bias is None else layer.bias.float()
    return F.linear(x.float(), layer.weight.float(), bias)


def flush_subnormal(grad: Tensor) -> Tensor:
    """The logits' gradient with its entries below ``SUBNORMAL_GUARD`` in magnitude set to 0, so that
    the output layer's backward matrix products see no subnormal numbers (module docstring)."""
    return F.hardshrink(grad, SUBNORMAL_GUARD)


def flushes_subnormal_gradients(logits: Tensor) -> bool:
    """Whether the gradient of ``logits`` is flushed: it has one, on the CPU, in fp32 or bf16."""
    return logits.requires_grad and logits.device.type == "cpu" and logits.dtype in SUBNORMAL_FLUSHED_DTYPES


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
