"""What training at scale relies on, for every variant in the translation model (encoder and decoder) and the
structural encoder, and for a bias, a transform and every method at once in the language model, tagger and
classifier (their own layers' wrapping):

- ``--checkpoint-activations`` gives the gradients of a plain backward pass (dropout 0, left- and
  right-padded batches): the recomputation in the backward pass sees the batch's position context;
- the model cast to bf16 and to fp16 (what ``--bf16`` / ``--fp16`` do to the model) runs forward
  and backward with finite results close to fp32, also with extreme learned values;
- a position-aware layer called without its batch's context fails loudly.

The LSTM language models have their own file (``test_lstm_lm_precision.py``). Run on a GPU with
``pytest --device cuda`` (``scripts/gpu_check.py`` does).
"""

import copy
import functools
from dataclasses import dataclass
from typing import Callable, Dict, List, Tuple

import pytest
import torch
from fairseq.data import Dictionary
from torch import Tensor, nn

from fairseq_posattn.modules.attention import PositionAwareMultiheadAttention
from posattn.position_terms.distance_aware import DistanceAwareScaling
from posattn.position_terms.structural import PARSE
from model_helpers import (
    SIDE_VARIANTS,
    TINY,
    TINY_LM,
    TinyTask,
    both_sides,
    build_model,
    randomized,
    reads_side_data,
    side_flags,
)

PAD = 1
NO_DROPOUT = ["--dropout", "0", "--attention-dropout", "0"]
STRUCTURAL_VARIANTS = {
    "structural-absolute": ["--encoder-structural-positions", "absolute"],
    "structural-relative": ["--encoder-structural-positions", "relative", "--encoder-structural-clip", "3"],
    "structural-both-nonlinear": ["--encoder-structural-positions", "both", "--encoder-structural-fusion",
                                  "nonlinear", "--encoder-relative-positions", "2", "--encoder-distance-aware"],
}
#: the encoder variants whose methods read no side data: the tagger's and the classifier's tasks collate none
WITHOUT_SIDE_DATA = [v for v in SIDE_VARIANTS["encoder"] if not reads_side_data("encoder", v)]
TINY_TAGGER = ["--word-embed-dim", "12", "--char-embed-dim", "4", "--char-cnn-filters", "4",
               "--encoder-layers", "2", "--encoder-attention-heads", "2", "--encoder-ffn-embed-dim", "16",
               "--max-source-positions", "24"]
TINY_CLASSIFIER = ["--task", "sentence_prediction", "--criterion", "sentence_prediction", "--num-classes", "3",
                   "--encoder-layers", "2", "--encoder-embed-dim", "16", "--encoder-ffn-embed-dim", "32",
                   "--encoder-attention-heads", "2", "--max-positions", "24", "--pooler-dropout", "0"]


class TinyTaggingTask(TinyTask):
    """What the tagger's ``build_model`` reads from ``--task pos_tagging``: three dictionaries."""

    def __init__(self):
        super().__init__()
        self.char_dictionary = Dictionary()
        for char in "abcdefgh":
            self.char_dictionary.add_symbol(char)
        self.target_dictionary = Dictionary()
        for tag in ("NOUN", "VERB", "DET", "ADJ"):
            self.target_dictionary.add_symbol(tag)


class TinyStructuralTask(TinyTask):
    collated_side_data = (PARSE.key,)


# ------------------------------------------------------------------------------------ batches
def padded(lengths: List[int], left_pad: bool, generator: torch.Generator, vocab: int = 20) -> Tensor:
    """Token ids (batch x max length) of random real tokens ending in EOS (2), padded with 1."""
    out = torch.full((len(lengths), max(lengths)), PAD, dtype=torch.long)
    for row, n in enumerate(lengths):
        sentence = torch.randint(4, vocab, (n,), generator=generator)
        sentence[-1] = 2
        if left_pad:
            out[row, out.size(1) - n:] = sentence
        else:
            out[row, :n] = sentence
    return out


def structure_of(tokens: Tensor) -> Tensor:
    """Side data of a chain parse (word k - 1 heads word k, word 0 is the root): depth, tin, tout
    per token; EOS and pads (0, -1, -1), as ``--task translation_structural`` collates it."""
    side = torch.tensor([0, -1, -1]).view(1, 3, 1).repeat(tokens.size(0), 1, tokens.size(1))
    for row in range(tokens.size(0)):
        words = tokens[row].ne(PAD).nonzero().flatten()[:-1]  # the EOS is on no path
        n = len(words)
        for k, column in enumerate(words.tolist()):
            side[row, :, column] = torch.tensor([k, k, 2 * n - 1 - k])
    return side


@dataclass
class Family:
    """How to build one model family from its flags and run it on a padded batch (its output
    log-probabilities, in fp32)."""

    build: Callable[[List[str]], nn.Module]
    run: Callable[[nn.Module, bool], Tensor]
    variants: Dict[str, List[str]]


def build_with(arch: str, tiny: List[str], task_factory: Callable[[], object]) -> Callable[[List[str]], nn.Module]:
    def build(flags: List[str]) -> nn.Module:
        model = build_model(arch, [*NO_DROPOUT, *flags], task_factory(), tiny)
        if hasattr(model, "register_classification_head"):
            model.register_classification_head("head", num_classes=3)
        return model
    return build


def log_probs(output: Tensor) -> Tensor:
    """Log-probabilities in fp32 at least (fp64 stays fp64)."""
    return torch.log_softmax(output.to(torch.promote_types(output.dtype, torch.float32)), dim=-1)


def weighted(log_probs: Tensor, seed: int = 7) -> Tensor:
    """A scalar loss that depends on every output value: a fixed random projection."""
    weights = torch.randn(log_probs.shape, generator=torch.Generator().manual_seed(seed))
    return (log_probs * weights.to(log_probs.device)).sum()


def translation_output(model: nn.Module, left_pad: bool) -> Tensor:
    generator = torch.Generator().manual_seed(3)
    device = next(model.parameters()).device
    src = padded([5, 9, 3], left_pad, generator).to(device)
    prev = padded([4, 7, 6], False, generator).to(device)
    net_input = dict(src_tokens=src, src_lengths=src.ne(PAD).sum(1), prev_output_tokens=prev)
    if getattr(model.encoder.position_options, "structural_positions", "none") != "none":
        net_input["src_structure"] = structure_of(src.cpu()).to(device)
    return log_probs(model(**net_input)[0])


def lm_output(model: nn.Module, left_pad: bool) -> Tensor:
    prev = padded([6, 11, 4], False, torch.Generator().manual_seed(4))
    return log_probs(model(prev.to(next(model.parameters()).device))[0])


def tagger_output(model: nn.Module, left_pad: bool) -> Tensor:
    generator = torch.Generator().manual_seed(5)
    device = next(model.parameters()).device
    words = padded([5, 8, 2], left_pad, generator)
    chars = torch.randint(4, 12, words.shape + (4,), generator=generator).masked_fill(words.eq(PAD)[..., None], PAD)
    return log_probs(model(words.to(device), words.ne(PAD).sum(1).to(device), chars.to(device)))


def classifier_output(model: nn.Module, left_pad: bool) -> Tensor:
    src = padded([5, 9, 3], left_pad, torch.Generator().manual_seed(6)).to(next(model.parameters()).device)
    return log_probs(model(src, classification_head_name="head")[0])


#: the variants the other families take: every method's terms at once, a bias and a transform (every variant runs in
#: the translation model, on each side that takes it; the other families check their own layers' wrapping)
REPRESENTATIVE = ("alibi", "rotary", "combined")


def representative(side: str) -> Dict[str, List[str]]:
    return {v: side_flags(side, v) for v in REPRESENTATIVE if v in SIDE_VARIANTS[side] and v in WITHOUT_SIDE_DATA}


FAMILIES = {
    "translation": Family(build_with("transformer_posattn", TINY, TinyTask), translation_output,
                          {v: both_sides(v) for v in SIDE_VARIANTS["decoder"]}),
    "structural": Family(build_with("transformer_posattn", TINY, TinyStructuralTask), translation_output,
                         STRUCTURAL_VARIANTS),
    "language-model": Family(build_with("transformer_lm_posattn", TINY_LM, TinyTask), lm_output,
                             {v: side_flags("decoder", v) for v in REPRESENTATIVE if v in SIDE_VARIANTS["decoder"]}),
    "tagger": Family(build_with("san_tagger", TINY_TAGGER, TinyTaggingTask), tagger_output,
                     {"san": [], **representative("encoder")}),
    "classifier": Family(build_with("transformer_posattn_classifier", TINY_CLASSIFIER, TinyTask),
                         classifier_output, representative("encoder")),
}
CASES = [(family, variant) for family, spec in FAMILIES.items() for variant in spec.variants]


@functools.lru_cache(maxsize=None)
def built(family: str, variant: str, extra: Tuple[str, ...] = ()) -> nn.Module:
    """One model per family, variant and extra flags (parsing fairseq's options is the slow part)."""
    spec = FAMILIES[family]
    torch.manual_seed(0)
    return randomized_if_posattn(spec.build([*spec.variants[variant], *extra]))


def build_pair(family: str, variant: str, extra: List[str], device: torch.device):
    """The same model twice: plain, and with ``extra`` flags, sharing every parameter value."""
    plain = copy.deepcopy(built(family, variant))
    other = copy.deepcopy(built(family, variant, tuple(extra)))
    other.load_state_dict(plain.state_dict())
    return plain.to(device), other.to(device)


def randomized_if_posattn(model: nn.Module) -> nn.Module:
    """Random position parameters (most start at zero or one) where the model has any."""
    if any(isinstance(m, PositionAwareMultiheadAttention) for m in model.modules()):
        randomized(model)
    return model


def output_and_gradients(model: nn.Module, run: Callable[[nn.Module, bool], Tensor],
                         left_pad: bool) -> Tuple[Tensor, Dict[str, Tensor]]:
    """The model's output in training mode and the gradients of a fixed loss of it."""
    model.train()
    model.zero_grad()
    output = run(model, left_pad)
    weighted(output).backward()
    grads = {name: p.grad.detach().clone() for name, p in model.named_parameters() if p.grad is not None}
    return output.detach(), grads


# ------------------------------------------------------------------------------------ checkpointing
def assert_checkpointed_gradients_equal_plain_ones(family: str, variant: str, flag: str, left_pad: bool,
                                                   device: torch.device) -> None:
    """With ``flag`` the layers are wrapped by fairseq's checkpoint wrapper and the gradients are the
    plain model's: the same arithmetic, summed in another order. In fp64, so that the order's rounding stays far
    below the tolerance: in fp32 a gradient summed over many cancelling terms (MTA's kernel: every batch, head and
    query-key pair) moves by a few 1e-6 of its largest entry with the order of the sums (the number of threads)."""
    plain, checkpointed = (model.double() for model in build_pair(family, variant, [flag], device))
    wrapped = [m for m in checkpointed.modules() if hasattr(m, "precheckpoint_forward")]
    assert wrapped, f"{flag} did not reach the layers"
    _, expected = output_and_gradients(plain, FAMILIES[family].run, left_pad)
    _, got = output_and_gradients(checkpointed, FAMILIES[family].run, left_pad)
    assert got.keys() == expected.keys()
    for name, grad in expected.items():
        scale = grad.abs().max().item()
        torch.testing.assert_close(got[name], grad, rtol=1e-10, atol=1e-12 * max(scale, 1.0), msg=name)


@pytest.mark.parametrize("left_pad", [True, False])
@pytest.mark.parametrize("family,variant", CASES)
def test_checkpointed_gradients_equal_plain_ones(family, variant, left_pad, device):
    assert_checkpointed_gradients_equal_plain_ones(family, variant, "--checkpoint-activations", left_pad, device)


#: one variant per family (its last: the combined terms where it has them) for fairseq's offloading
OFFLOAD_CASES = [(family, list(spec.variants)[-1]) for family, spec in FAMILIES.items()]


@pytest.mark.parametrize("family,variant", OFFLOAD_CASES)
def test_offloaded_checkpoint_gradients_equal_plain_ones(family, variant, device):
    """``--offload-activations`` alone (it sets ``--checkpoint-activations``; fairseq's wrapper then
    keeps each layer's inputs in CPU memory: a no-op move on a CPU, a real one on a GPU)."""
    assert_checkpointed_gradients_equal_plain_ones(family, variant, "--offload-activations", False, device)


# ------------------------------------------------------------------------------------ precision
#: largest relative error (norm of the difference / norm of fp32) of the outputs and of all gradients
#: as one vector; measured on CPU at most 0.0023 / 0.098 (bf16) and 0.0003 / 0.0085 (fp16)
OUTPUT_TOLERANCE = {torch.bfloat16: 0.02, torch.float16: 0.005}
GRADIENT_TOLERANCE = {torch.bfloat16: 0.2, torch.float16: 0.03}


def relative_error(got: Tensor, expected: Tensor) -> float:
    return ((got.float() - expected).norm() / expected.norm().clamp(min=1e-12)).item()


def assert_close_to_fp32(reference: nn.Module, half: nn.Module, run: Callable[[nn.Module, bool], Tensor],
                         dtype: torch.dtype, close: bool = True) -> None:
    """Forward and backward of ``half`` (a copy of ``reference`` cast to ``dtype``) are finite and,
    if ``close``, within the dtype's tolerance of fp32 (outputs, and all gradients as one vector)."""
    output, grads = output_and_gradients(half.to(dtype), run, left_pad=True)
    assert torch.isfinite(output).all()
    assert all(torch.isfinite(g).all() for g in grads.values()), [n for n, g in grads.items() if not g.isfinite().all()]
    if not close:
        return
    expected_output, expected_grads = output_and_gradients(reference, run, left_pad=True)
    assert relative_error(output, expected_output) <= OUTPUT_TOLERANCE[dtype]
    flat = torch.cat([grads[name].flatten().float() for name in expected_grads])
    assert relative_error(flat, torch.cat([g.flatten() for g in expected_grads.values()])) <= GRADIENT_TOLERANCE[dtype]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("family,variant", CASES)
def test_half_precision_is_finite_and_close_to_fp32(family, variant, dtype, device):
    reference, half = build_pair(family, variant, [], device)
    assert_close_to_fp32(reference, half, FAMILIES[family].run, dtype)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("v,w,close", [(-30.0, 3.0, True), (12.0, 0.01, True), (40.0, 3.0, False)])
def test_distance_aware_is_finite_with_extreme_learned_values(v, w, close, dtype, device):
    """exp(v) alone is inf in fp16 past v ~ 11 (fp32: ~88); DA's coefficients are computed in fp32
    log space, so attention stays finite while f is. With f up to e^40 the attention is an argmax
    that rounding may flip: finite only; with moderate f, close to fp32."""
    reference, half = build_pair("translation", "distance-aware", [], device)
    for model in (reference, half):
        for module in model.modules():
            if isinstance(module, DistanceAwareScaling):
                with torch.no_grad():
                    module.v.fill_(v)
                    module.w.fill_(w)
    assert_close_to_fp32(reference, half, translation_output, dtype, close)


# ------------------------------------------------------------------------------------ no context
def test_a_layer_called_without_its_context_fails_loudly():
    model = FAMILIES["translation"].build(both_sides("shaw"))
    layer = model.encoder.layers[0]
    x = torch.randn(5, 2, 16)
    with pytest.raises(TypeError, match="PositionContext"):
        layer(x, position_context=torch.zeros(2, 5, dtype=torch.bool))
    with pytest.raises(TypeError, match="PositionContext"):
        layer.self_attn(x, x, x, key_padding_mask=torch.zeros(2, 5, dtype=torch.bool))
