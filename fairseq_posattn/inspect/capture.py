"""Run a loaded model once on one sentence and collect what ``posattn-inspect`` draws.

- **Attention probabilities** per side (``encoder``, ``decoder`` self-attention, ``cross``), layer
  and head. fairseq's layers call their attention modules with ``need_weights=False``, so a forward
  hook on every attention module calls the module again, at once and on the very inputs and masks it
  was given (the position context of our kernel still bound), with ``need_head_weights=True``. For
  our kernel (:class:`~fairseq_posattn.modules.attention.PositionAwareMultiheadAttention`) that call
  also leaves the softmax S *before* the post-softmax transform in ``last_softmax``.
- **Learned position parameters** of every self-attention layer with position terms: ``A^p`` and
  ``a^r`` (cropped to the positions shown), the temperatures, DA's ``w``, ``v`` and re-scaled
  coefficient matrix, the convolution filters, Shaw's (and the structural) key/value tables.
- **Structural positions** of the source (``--task translation_structural``): token depths and
  the relative structural matrix next to the sequential one.
- **Positional attentive LSTM LM** (Dagan 2019): ``mu_t``, ``sigma_t`` and the Gaussian attention
  weights of every step (see :class:`PositionalRecorder` for what it needs from the model).

Everything is for batch row 0 of a one-sentence sample, as tensors on the CPU.
"""

from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from inspect import signature
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

import torch
from fairseq.models import FairseqEncoderDecoderModel
from fairseq.modules import MultiheadAttention
from fairseq.sequence_generator import SequenceGenerator
from torch import Tensor, nn

from fairseq_posattn.models.attentive_lstm_lm import PositionalAttention
from fairseq_posattn.models.position_options import side_defaults
from fairseq_posattn.modules.attention import PositionAwareMultiheadAttention
from fairseq_posattn.modules.position_context import PositionContext, structural_relative
from fairseq_posattn.modules.position_terms.convolution import ConvolvedAttention1d, ConvolvedAttention2d
from fairseq_posattn.modules.position_terms.direct import DirectAbsolutePositionBias, DirectRelativePositionBias
from fairseq_posattn.modules.position_terms.structural import StructuralRelativeEmbeddings

#: what can be drawn (and written as JSON), in drawing order
KINDS = ("attention", "direct", "temperature", "distance-aware", "conv", "relative-embeddings",
         "structure", "lstm")
#: sides of the attention maps, in drawing order
SIDES = ("encoder", "decoder", "cross")
#: decoding limits for the model's own translation: max length = MAX_LEN_A * source + MAX_LEN_B
MAX_LEN_A, MAX_LEN_B = 1.5, 10

Sample = Dict[str, Any]


# ------------------------------------------------------------------------------------ records
@dataclass
class AttentionMap:
    """One attention module's probabilities for the sentence.

    ``probs`` (heads x queries x keys) are what multiplies V: after any post-softmax transform.
    ``softmax`` is S before that transform (our kernel only; None for fairseq's modules).
    """

    side: str
    layer: int
    kernel: str  # "posattn" (our kernel) or "fairseq"
    probs: Tensor
    softmax: Optional[Tensor] = None

    def to_json(self) -> Dict[str, Any]:
        return {"side": self.side, "layer": self.layer, "kernel": self.kernel, "probs": self.probs.tolist()}


@dataclass
class RelativeTable:
    """Shaw-style key/value embeddings; row ``b`` is the bucket of ``j - i = b - clip``
    (sequential) or of the relative structural position ``b - clip`` (structural)."""

    name: str  # "sequential" or "structural"
    clip: int
    key: Tensor
    value: Tensor

    def to_json(self) -> Dict[str, Any]:
        return {"table": self.name, "clip": self.clip, "key": self.key.tolist(), "value": self.value.tolist()}


@dataclass
class LayerTerms:
    """The learned position parameters of one self-attention layer, cropped to ``positions``.

    Shapes (H heads, n positions, k kernel width, d head size): ``direct_absolute`` H x n x n
    (``A^p[:n, :n]``); ``direct_relative`` H x (2n - 1) over ``i - j = -(n - 1) .. n - 1``;
    ``temperature`` 3 x H (gamma_q, gamma_k, gamma_v); ``da_w``, ``da_v`` H; ``da_coefficients``
    H x n x n (``Rhat``); ``conv_weight`` H x k x k (2d) or H x n x n x k (1d: output column, input
    column, tap); ``conv_bias`` H (2d) or H x n (1d).
    """

    side: str
    layer: int
    positions: int
    direct_absolute: Optional[Tensor] = None
    direct_relative: Optional[Tensor] = None
    temperature: Optional[Tensor] = None
    da_w: Optional[Tensor] = None
    da_v: Optional[Tensor] = None
    da_coefficients: Optional[Tensor] = None
    conv: Optional[str] = None
    conv_weight: Optional[Tensor] = None
    conv_bias: Optional[Tensor] = None
    relative_tables: List[RelativeTable] = field(default_factory=list)

    def distances(self) -> List[int]:
        """``i - j`` of the entries of ``direct_relative``."""
        return list(range(-(self.positions - 1), self.positions))


@dataclass
class StructureTrace:
    """Source tokens' tree depths, and relative positions: sequential ``i - j`` and structural
    (clipped to ``clip``, as the model sees them)."""

    tokens: List[str]
    depth: Tensor
    sequential: Tensor
    structural: Tensor
    clip: int

    def to_json(self) -> Dict[str, Any]:
        return {"tokens": self.tokens, "depth": self.depth.tolist(), "clip": self.clip,
                "sequential_relative": self.sequential.tolist(),
                "structural_relative": self.structural.tolist()}


@dataclass
class PositionalTrace:
    """Dagan's positional attention over one sentence (T steps of the LM's input ``tokens``).

    ``mu`` and ``sigma`` (T) are in normalised positions (memory state i sits at ``i / normalizer``,
    i = 1..T); ``weights`` (T x T) is row t's Gaussian attention over the states before it.
    """

    tokens: List[str]
    mu: Tensor
    sigma: Tensor
    weights: Tensor
    normalizer: float

    def to_json(self) -> Dict[str, Any]:
        return {"tokens": self.tokens, "normalizer": self.normalizer, "mu": self.mu.tolist(),
                "sigma": self.sigma.tolist(), "weights": self.weights.tolist()}


@dataclass
class Inspection:
    """Everything captured from one pass: tokens, attention maps, parameters, traces."""

    source_tokens: List[str]
    source_ids: List[int]
    decoder_tokens: List[str]
    decoder_ids: List[int]
    decoder_input: str  # where the decoder input came from: given, reference, translation; LM: input
    attention: List[AttentionMap]
    terms: List[LayerTerms]
    structure: Optional[StructureTrace] = None
    lstm: Optional[PositionalTrace] = None

    def tokens(self, side: str) -> List[str]:
        return self.source_tokens if side == "encoder" else self.decoder_tokens

    def available_kinds(self) -> List[str]:
        has = {
            "attention": bool(self.attention),
            "direct": any(t.direct_absolute is not None or t.direct_relative is not None for t in self.terms),
            "temperature": any(t.temperature is not None for t in self.terms),
            "distance-aware": any(t.da_w is not None for t in self.terms),
            "conv": any(t.conv is not None for t in self.terms),
            "relative-embeddings": any(t.relative_tables for t in self.terms),
            "structure": self.structure is not None,
            "lstm": self.lstm is not None,
        }
        return [kind for kind in KINDS if has[kind]]

    def conv_maps(self, terms: LayerTerms) -> AttentionMap:
        """The attention map (S before and probabilities after the convolution) of a conv layer."""
        return next(m for m in self.attention if (m.side, m.layer) == (terms.side, terms.layer))

    def to_json(self, kinds: Sequence[str]) -> Dict[str, Any]:
        """The numbers behind the plots of ``kinds`` (plain lists, JSON-ready)."""
        out: Dict[str, Any] = {
            "source_tokens": self.source_tokens, "source_ids": self.source_ids,
            "decoder_tokens": self.decoder_tokens, "decoder_ids": self.decoder_ids,
            "decoder_input": self.decoder_input,
        }
        for kind in kinds:
            out[kind] = JSON_WRITERS[kind](self)
        return out


def _direct_json(inspection: Inspection) -> List[Dict[str, Any]]:
    return [{"side": t.side, "layer": t.layer, "positions": t.positions,
             "absolute": _listed(t.direct_absolute), "relative_distances": t.distances(),
             "relative": _listed(t.direct_relative)}
            for t in inspection.terms if t.direct_absolute is not None or t.direct_relative is not None]


def _temperature_json(inspection: Inspection) -> List[Dict[str, Any]]:
    return [{"side": t.side, "layer": t.layer, "gamma_q": t.temperature[0].tolist(),
             "gamma_k": t.temperature[1].tolist(), "gamma_v": t.temperature[2].tolist()}
            for t in inspection.terms if t.temperature is not None]


def _distance_aware_json(inspection: Inspection) -> List[Dict[str, Any]]:
    return [{"side": t.side, "layer": t.layer, "w": t.da_w.tolist(), "v": t.da_v.tolist(),
             "coefficients": t.da_coefficients.tolist()}
            for t in inspection.terms if t.da_w is not None]


def _conv_json(inspection: Inspection) -> List[Dict[str, Any]]:
    entries = []
    for t in (t for t in inspection.terms if t.conv is not None):
        maps = inspection.conv_maps(t)
        entries.append({"side": t.side, "layer": t.layer, "kind": t.conv, "positions": t.positions,
                        "weight": t.conv_weight.tolist(), "bias": t.conv_bias.tolist(),
                        "before": maps.softmax.tolist(), "after": maps.probs.tolist()})
    return entries


def _relative_json(inspection: Inspection) -> List[Dict[str, Any]]:
    return [dict(table.to_json(), side=t.side, layer=t.layer)
            for t in inspection.terms for table in t.relative_tables]


def _listed(tensor: Optional[Tensor]) -> Optional[list]:
    return None if tensor is None else tensor.tolist()


JSON_WRITERS: Dict[str, Callable[[Inspection], Any]] = {
    "attention": lambda i: [m.to_json() for m in i.attention],
    "direct": _direct_json,
    "temperature": _temperature_json,
    "distance-aware": _distance_aware_json,
    "conv": _conv_json,
    "relative-embeddings": _relative_json,
    "structure": lambda i: i.structure.to_json(),
    "lstm": lambda i: i.lstm.to_json(),
}


# ------------------------------------------------------------------------------------ inputs
def is_encoder_decoder(model: nn.Module) -> bool:
    return isinstance(model, FairseqEncoderDecoderModel)


def sentence_sample(task: Any, sentence: str) -> Sample:
    """A one-sentence sample of already BPE'd text, built as fairseq-interactive builds it (a
    structural task parses it with its parser)."""
    tokens, lengths = task.get_interactive_tokens_and_lengths([sentence], lambda line: line)
    dataset = task.build_dataset_for_inference(tokens, lengths)
    return dataset.collater([dataset[0]])


def dataset_sample(task: Any, subset: str, index: int) -> Sample:
    """Sentence ``index`` (fairseq-generate's id) of split ``subset``, with its reference target."""
    task.load_dataset(subset)
    dataset = task.dataset(subset)
    if not 0 <= index < len(dataset):
        raise IndexError(f"--index {index} is outside split {subset!r}, which has {len(dataset)} sentences")
    return dataset.collater([dataset[index]])


def add_decoder_input(model: nn.Module, task: Any, sample: Sample, target: Optional[str],
                      beam: int) -> str:
    """Give an encoder-decoder sample its teacher-forced decoder input; return where it came from.

    ``target`` (BPE'd text) wins; else the sample's reference (``--index``); else the model's own
    beam-search translation. A language model's decoder input is its input (``"input"``).
    """
    net_input = sample["net_input"]
    if not is_encoder_decoder(model):
        return "input"
    if target is not None:
        tokens = task.target_dictionary.encode_line(target, add_if_not_exist=False).long()
        origin = "given"
    elif "prev_output_tokens" in net_input:
        return "reference"
    else:
        tokens, origin = translate(model, task, sample, beam), "translation"
    eos = torch.tensor([task.target_dictionary.eos()])
    net_input["prev_output_tokens"] = torch.cat([eos, tokens[:-1]]).unsqueeze(0)
    return origin


def translate(model: nn.Module, task: Any, sample: Sample, beam: int) -> Tensor:
    """The best hypothesis (ending with EOS) of a beam search."""
    generator = SequenceGenerator([model], task.target_dictionary, beam_size=beam,
                                  max_len_a=MAX_LEN_A, max_len_b=MAX_LEN_B)
    with torch.no_grad():
        return task.inference_step(generator, [model], sample)[0][0]["tokens"]


# ------------------------------------------------------------------------------------ recording
def attention_modules(model: nn.Module) -> Iterator[Tuple[str, int, MultiheadAttention]]:
    """``(side, layer, module)`` of every transformer attention module of the model."""
    encoder = getattr(model, "encoder", None)
    for index, layer in enumerate(getattr(encoder, "layers", [])):
        yield "encoder", index, layer.self_attn
    for index, layer in enumerate(getattr(model.decoder, "layers", [])):
        yield "decoder", index, layer.self_attn
        if getattr(layer, "encoder_attn", None) is not None:
            yield "cross", index, layer.encoder_attn


@contextmanager
def per_head_path(module: MultiheadAttention) -> Iterator[None]:
    """fairseq's own module answers ``need_head_weights`` with head-averaged weights on its PyTorch
    fast path (self-attention without incremental state). ``skip_embed_dim_check`` is the one switch
    that sends it down its explicit path, which computes the same attention per head."""
    saved = module.skip_embed_dim_check
    if not isinstance(module, PositionAwareMultiheadAttention):
        module.skip_embed_dim_check = True
    try:
        yield
    finally:
        module.skip_embed_dim_check = saved


class AttentionRecorder:
    """Per-head probabilities of every attention module during one forward pass (a context manager)."""

    def __init__(self, model: nn.Module):
        self.model = model
        self.maps: List[AttentionMap] = []
        self._handles: List[Any] = []

    def __enter__(self) -> "AttentionRecorder":
        for side, layer, module in attention_modules(self.model):
            if isinstance(module, PositionAwareMultiheadAttention):
                module.keep_attention_maps = True
            hook = partial(self._record, side, layer)
            self._handles.append(module.register_forward_hook(hook, with_kwargs=True))
        return self

    def __exit__(self, *exc: Any) -> None:
        for handle in self._handles:
            handle.remove()
        for _, _, module in attention_modules(self.model):
            if isinstance(module, PositionAwareMultiheadAttention):
                module.keep_attention_maps = False
                module.last_softmax = None

    def _record(self, side: str, layer: int, module: MultiheadAttention, args: Tuple, kwargs: Dict,
                output: Any) -> None:
        call = dict(kwargs, need_weights=True, need_head_weights=True, incremental_state=None)
        with per_head_path(module):
            _, weights = module.forward(*args, **call)  # heads x batch x queries x keys
        ours = isinstance(module, PositionAwareMultiheadAttention)
        softmax = module.last_softmax[0] if ours else None
        self.maps.append(AttentionMap(side, layer, "posattn" if ours else "fairseq",
                                      weights[:, 0].detach().float(), softmax))

    def sorted_maps(self) -> List[AttentionMap]:
        return sorted(self.maps, key=lambda m: (SIDES.index(m.side), m.layer))


class PositionalRecorder:
    """mu, sigma and the Gaussian weights of the positional attentive LSTM LM (a context manager).

    What it needs from the model (``fairseq_posattn.models.attentive_lstm_lm``): the decoder's
    ``attention`` is a :class:`PositionalAttention` whose ``forward(h, memory, offset, normalizer,
    prev_mu, generator_state)`` returns ``(context, weights, mu, generator_state)`` and whose
    ``generate(h, state)`` returns ``(mu_weights, sigma, state)``. A forward hook takes ``weights``
    and ``mu`` from the output and calls ``generate`` again on the same ``h`` for ``sigma``.
    """

    def __init__(self, model: nn.Module):
        self.attention = getattr(model.decoder, "attention", None)
        self.trace: Optional[Tuple[Tensor, Tensor, Tensor, float]] = None
        self._handle: Any = None

    def __enter__(self) -> "PositionalRecorder":
        if isinstance(self.attention, PositionalAttention):
            self._handle = self.attention.register_forward_hook(self._record, with_kwargs=True)
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._handle is not None:
            self._handle.remove()

    def _record(self, module: PositionalAttention, args: Tuple, kwargs: Dict, output: Tuple) -> None:
        bound = signature(module.forward).bind(*args, **kwargs).arguments
        _, sigma, _ = module.generate(bound["h"], bound.get("generator_state"))
        _, weights, mu, _ = output
        self.trace = (mu[0].detach(), sigma[0].detach(), weights[0].detach(), float(bound["normalizer"][0, 0]))


# ------------------------------------------------------------------------------------ parameters
def layer_terms(side: str, layer: int, module: PositionAwareMultiheadAttention, positions: int) -> LayerTerms:
    """The position parameters of one of our attention modules, cropped to ``positions`` (at most
    the t of its terms)."""
    terms = [*module.additive_terms, module.post_softmax_term]
    n = min([positions] + [t.max_positions for t in terms if hasattr(t, "max_positions")])
    found = LayerTerms(side, layer, n)
    for term in module.additive_terms:
        if isinstance(term, DirectAbsolutePositionBias):
            found.direct_absolute = term.weight[:, :n, :n].detach()
        elif isinstance(term, DirectRelativePositionBias):
            zero = term.max_positions - 1  # a^r index of i - j = 0
            found.direct_relative = term.weight[:, zero - (n - 1) : zero + n].detach()
    if module.temperature is not None:
        found.temperature = module.temperature.gamma.detach()
    if module.scaling_term is not None:
        da = module.scaling_term
        found.da_w, found.da_v = da.w.detach(), da.v.detach()
        unpadded = PositionContext.from_padding(torch.zeros(1, n, dtype=torch.bool, device=da.w.device), True)
        found.da_coefficients = da.coefficients(unpadded, n, n).detach()
    _add_conv(found, module.post_softmax_term, n)
    for term in module.key_value_terms:
        name = "structural" if isinstance(term, StructuralRelativeEmbeddings) else "sequential"
        found.relative_tables.append(RelativeTable(name, term.clip, term.key_table.detach(),
                                                   term.value_table.detach()))
    return found


def _add_conv(found: LayerTerms, term: Optional[nn.Module], n: int) -> None:
    if isinstance(term, ConvolvedAttention2d):
        found.conv, found.conv_weight, found.conv_bias = "2d", term.conv.weight[:, 0].detach(), term.conv.bias.detach()
    elif isinstance(term, ConvolvedAttention1d):
        heads, t = term.num_heads, term.max_positions
        weight = term.conv.weight.view(heads, t, t, term.kernel_size)[:, :n, :n]
        found.conv, found.conv_weight = "1d", weight.detach()
        found.conv_bias = term.conv.bias.view(heads, t)[:, :n].detach()


def all_layer_terms(model: nn.Module, lengths: Dict[str, int], positions: Optional[int]) -> List[LayerTerms]:
    """:func:`layer_terms` of every self-attention layer with position terms; ``positions``
    defaults to the side's sentence length."""
    return [layer_terms(side, layer, module, positions or lengths[side])
            for side, layer, module in attention_modules(model)
            if isinstance(module, PositionAwareMultiheadAttention)]


def structure_trace(model: nn.Module, net_input: Dict[str, Tensor], tokens: List[str]) -> Optional[StructureTrace]:
    """Depths and relative positions of the source, from the task's side data (None without)."""
    side = net_input.get("src_structure")
    if side is None:
        return None
    depth, tin, tout = side[0].long()
    options = getattr(model.encoder, "position_options", None)
    clip = getattr(options, "structural_clip", side_defaults("encoder")["structural_clip"])
    structural = structural_relative(depth[None], tin[None], tout[None], clip)[0]
    index = torch.arange(len(depth))
    return StructureTrace(tokens, depth, index[:, None] - index[None, :], structural, clip)


# ------------------------------------------------------------------------------------ main entry
def inspect_model(model: nn.Module, task: Any, sample: Sample, decoder_input: str,
                  positions: Optional[int] = None) -> Inspection:
    """Run ``model`` (eval mode, no gradients) once on a one-sentence ``sample`` and collect."""
    model.eval()
    net_input = sample["net_input"]
    with torch.no_grad(), AttentionRecorder(model) as recorder, PositionalRecorder(model) as lstm:
        model(**net_input)
        lengths = {"encoder": net_input["src_tokens"].size(1), "decoder": _decoder_ids(net_input).numel()}
        terms = all_layer_terms(model, lengths, positions)
    source_ids = net_input["src_tokens"][0].tolist() if is_encoder_decoder(model) else []
    decoder_ids = _decoder_ids(net_input).tolist()
    source_tokens = [task.source_dictionary[i] for i in source_ids]
    decoder_tokens = [task.target_dictionary[i] for i in decoder_ids]
    inspection = Inspection(source_tokens, source_ids, decoder_tokens, decoder_ids, decoder_input,
                            recorder.sorted_maps(), terms)
    if is_encoder_decoder(model):
        inspection.structure = structure_trace(model, net_input, source_tokens)
    if lstm.trace is not None:
        inspection.lstm = PositionalTrace(decoder_tokens, *lstm.trace)
    return inspection


def _decoder_ids(net_input: Dict[str, Tensor]) -> Tensor:
    """Row 0 of the decoder's input: ``prev_output_tokens``, or a language model's ``src_tokens``."""
    return net_input.get("prev_output_tokens", net_input["src_tokens"])[0]
