"""Faulty fused kernels for the self-check's tests (tests/test_kernel_self_check.py), put where the attention
kernel calls them: values off by 0.1 (a miscompiled flex_attention), NaN gradients (pytorch#153799, #196678),
a compilation that fails (Triton's shared-memory limit, pytorch#133254)."""

from typing import Callable

import torch

from posattn import attention

FLEX_KERNEL, REAL_SDPA = attention.flex_kernel, attention.masked_sdpa


class NaNGradient(torch.autograd.Function):
    """The identity whose backward is NaN."""

    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        return torch.full_like(grad, float("nan"))


def shifted_flex(device: torch.device) -> Callable[..., torch.Tensor]:
    """A flex_attention whose values are off by 0.1."""
    real = FLEX_KERNEL(device)
    return lambda *args, **kwargs: real(*args, **kwargs) + 0.1


def nan_gradient_sdpa(*args) -> torch.Tensor:
    """SDPA with its mask whose backward is NaN."""
    return NaNGradient.apply(REAL_SDPA(*args))


def uncompilable_flex(device: torch.device) -> Callable[..., torch.Tensor]:
    """A flex_attention that fails to compile, as Triton does where its tiles need too much shared memory."""
    def failing(*args, **kwargs):
        raise RuntimeError("No valid triton configs. OutOfMemoryError: out of resource: triton_tem_fused_flex_attention_0"
                           " Required: 245760 Hardware limit:232448\nReducing block sizes or `num_stages` may help.")
    return failing
