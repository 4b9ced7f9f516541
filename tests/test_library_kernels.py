"""The kernel's ``library`` path: PaTH attention in flash-linear-attention's fused ``parallel_path_attn``
(fla-core), taken by a causal full pass of a batch without pads or padded on the right, self-checked, equal to the
explicit path with its gradients, and the explicit path, with its reason logged, where the kernel cannot compute the
call.

fla's kernels are Triton kernels. On a CUDA device they run as they are; on the CPU, under Triton's interpreter
(``make check-library-kernels`` installs fla-core and Triton beside the virtualenv and sets ``TRITON_INTERPRET=1``),
each autotuned kernel at its first configuration (the interpreter cannot time the others). Without fla-core and
Triton (``make test``'s virtualenv) the file is skipped; tests/test_path_attention.py checks the refusals there.
"""

import logging
import os
from typing import List, Optional

import pytest
import torch

import posattn
from posattn.attention import EXPLICIT, LIBRARY
from posattn.kernel_self_check import forget_verdicts
from posattn.library_kernels import optional_module
from posattn.position_context import PositionContext
from posattn.position_terms.path_attention import FLA_MODULE

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1" and not torch.cuda.is_available()
if INTERPRETED:  # before fla declares its kernels: the interpreter runs one configuration, it cannot time several
    try:
        from triton.runtime import autotuner
    except ImportError:
        autotuner = None
    if autotuner is not None:
        declare = autotuner.Autotuner.__init__

        def first_configuration(self, fn, arg_names, configs, *args, **kwargs):
            declare(self, fn, arg_names, configs[:1], *args, **kwargs)
        autotuner.Autotuner.__init__ = first_configuration

FLA, MISSING = optional_module(FLA_MODULE)
pytestmark = [
    pytest.mark.skipif(FLA is None, reason=f"flash-linear-attention (fla-core) and Triton are not installed here "
                                           f"({MISSING}); `make check-library-kernels` runs this file on the CPU"),
    pytest.mark.skipif(FLA is not None and not (torch.cuda.is_available() or INTERPRETED),
                       reason="fla's Triton kernels need CUDA, or Triton's interpreter on the CPU (TRITON_INTERPRET=1, "
                              "as `make check-library-kernels` sets it)"),
]
DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
EMBED, HEADS, LENGTH = 64, 4, 100


def path_layer(**options) -> posattn.SelfAttention:
    torch.manual_seed(0)
    return posattn.SelfAttention(EMBED, HEADS, causal=True, path_attention=True, **options).to(DEVICE).train()


def output_and_gradients(layer: posattn.SelfAttention, x: torch.Tensor, kernel: str,
                         pads: Optional[torch.Tensor] = None) -> List[torch.Tensor]:
    """The layer's output on ``x`` (its real tokens' rows; ``pads``: True at the pads of a right-padded batch) with
    ``kernel``, then the gradients (of the real rows' loss) of its input and of every parameter."""
    layer.kernel = kernel
    layer.zero_grad()
    x = x.detach().requires_grad_()
    context = None if pads is None else PositionContext.from_padding(pads, True, causal=True)
    out = layer(x, context=context)
    if pads is not None:
        out = out.masked_fill(pads[..., None], 0.0)
    out.square().mean().backward()
    return [out.detach(), x.grad] + [p.grad for p in layer.parameters()]


def largest_relative_error(got: List[torch.Tensor], expected: List[torch.Tensor]) -> float:
    return max(((a - b).abs().max() / b.abs().max().clamp_min(1e-12)).item() for a, b in zip(got, expected))


@pytest.mark.parametrize("forget_gate", [False, True], ids=["path", "path-fox"])
def test_a_pad_free_pass_takes_fla_self_checked_and_equal_to_the_explicit_path(forget_gate, caplog):
    """PaTH and PaTH-FoX (the forget gate's values handed to fla as its gate): the path the call takes, the
    self-check's verdict, the output and every gradient against the explicit path; negative control: the explicit
    path with the transforms turned off (beta = 0) is far from fla's output."""
    forget_verdicts()
    layer = path_layer(forget_gate=forget_gate)
    x = torch.randn(2, LENGTH, EMBED, device=DEVICE)
    assert layer.path(False, DEVICE, decoding=False)[0] == LIBRARY
    with caplog.at_level(logging.INFO, logger="posattn"):
        fused = output_and_gradients(layer, x, "auto")
    assert "library kernel (flash-linear-attention's parallel_path_attn)" in caplog.text
    assert "the library kernel against the explicit path" in caplog.text and "self-check passed" in caplog.text
    explicit = output_and_gradients(layer, x, "explicit")
    assert largest_relative_error(fused, explicit) < 1e-3
    with torch.no_grad():
        layer.content_term.beta_proj.bias.fill_(-1e4)  # beta = 2 sigmoid(-1e4) = 0: every transform the identity
    assert largest_relative_error(fused[:1], output_and_gradients(layer, x, "explicit")[:1]) > 1e-2


def test_a_right_padded_batch_takes_fla_equal_to_the_explicit_path_on_its_real_tokens():
    """A causal query never reads the pads after it: fla's kernel, which has no padding mask, computes a batch padded
    on the right as the explicit path does on every real token (outputs and gradients)."""
    layer = path_layer(forget_gate=True)
    x = torch.randn(2, LENGTH, EMBED, device=DEVICE)
    pads = torch.zeros(2, LENGTH, dtype=torch.bool, device=DEVICE)
    pads[1, 70:] = True
    fused = output_and_gradients(layer, x, "auto", pads)
    assert largest_relative_error(fused, output_and_gradients(layer, x, "explicit", pads)) < 1e-3


def test_left_padded_batches_decoding_dropout_and_other_dtypes_take_the_explicit_path(caplog):
    """What fla's kernel cannot compute (a left-padded batch: it has no padding mask; a decoding step; attention
    dropout; fp64) takes the explicit path, and the call's output is the explicit path's."""
    layer = path_layer()
    assert layer.path(False, DEVICE, decoding=False, left_padded=True)[0] == EXPLICIT
    assert layer.path(False, DEVICE, decoding=True)[0] == EXPLICIT
    assert "fp16, bf16 or fp32, not 16 in float64" in layer.library_refusal(DEVICE, False, False, torch.float64)
    layer.dropout_module.p = 0.1
    assert layer.library_refusal(DEVICE, False, False, torch.float32).startswith("attention dropout")
    layer.dropout_module.p = 0.0
    x = torch.randn(2, 9, EMBED, device=DEVICE)
    pads = torch.tensor([[False] * 9, [True] * 3 + [False] * 6], device=DEVICE)  # plain PyTorch: any padding
    layer.kernel = "auto"
    padded = layer(x, padding_mask=pads)
    layer.kernel = "explicit"
    assert torch.equal(padded, layer(x, padding_mask=pads))


def test_a_fairseq_language_model_takes_fla_on_its_right_padded_batches(caplog):
    """fairseq's language-model sides pad on the right: a PaTH-FoX ``transformer_lm_posattn`` scores a padded batch
    through fla's kernel, every real token as the explicit path scores it."""
    from model_helpers import build_lm

    model = build_lm("transformer_lm_posattn", ["--decoder-path-attention", "--decoder-forget-gate",
                                                "--no-token-positional-embeddings", "--decoder-embed-dim", "64",
                                                "--decoder-attention-heads", "4"]).to(DEVICE).eval()
    pad = model.decoder.dictionary.pad()
    tokens = torch.randint(pad + 3, pad + 20, (2, 24), generator=torch.Generator().manual_seed(0)).to(DEVICE)
    tokens[1, 17:] = pad
    with caplog.at_level(logging.INFO, logger="posattn"), torch.no_grad():
        fused = model(tokens)[0]
        assert "library kernel (flash-linear-attention's parallel_path_attn)" in caplog.text
        for layer in model.modules():
            if hasattr(layer, "library_term"):
                layer.kernel = "explicit"
        explicit = model(tokens)[0]
    real = tokens.ne(pad)
    assert largest_relative_error([fused[real]], [explicit[real]]) < 1e-3


def test_a_hugging_face_llama_called_without_an_attention_mask_takes_fla(caplog):
    """A Llama switched to PaTH-FoX by posattn_huggingface, called without an ``attention_mask`` (a pad-free batch):
    fla's kernel, its logits the explicit path's."""
    pytest.importorskip("transformers", reason="the Hugging Face front-end needs transformers (pip install '.[hf]')")
    import posattn_huggingface
    from huggingface_helpers import llama

    torch.manual_seed(0)
    model = posattn_huggingface.apply_position_method(llama(hidden_size=64).eval(), path_attention=True,
                                                      forget_gate=True).to(DEVICE)
    ids = torch.randint(0, 100, (2, 30), generator=torch.Generator().manual_seed(0)).to(DEVICE)
    with caplog.at_level(logging.INFO, logger="posattn"), torch.no_grad():
        fused = model(ids).logits
        assert "library kernel (flash-linear-attention's parallel_path_attn)" in caplog.text
        for layer in model.modules():
            if hasattr(layer, "library_term"):
                layer.kernel = "explicit"
        explicit = model(ids).logits
    assert largest_relative_error([fused], [explicit]) < 1e-3


def test_a_prompt_through_fla_then_decoding_steps_equal_the_full_pass(caplog):
    """A prompt's pass takes fla's kernel and caches its ``k_cache`` (the keys carried to the last token) and the
    convolution's last inputs; the decoding steps after it (the explicit path) give the full pass's outputs."""
    layer = path_layer(forget_gate=True).eval()
    x = torch.randn(2, 40, EMBED, device=DEVICE)
    cache = posattn.DecodingCache()
    with caplog.at_level(logging.INFO, logger="posattn"), torch.no_grad():
        layer.kernel = "auto"
        decoded = [layer(x[:, :30], cache=cache)] + [layer(x[:, t:t + 1], cache=cache) for t in range(30, 40)]
        assert "library kernel (flash-linear-attention's parallel_path_attn)" in caplog.text
        layer.kernel = "explicit"
        full = layer(x)
    assert largest_relative_error([torch.cat(decoded, dim=1)], [full]) < 1e-3
