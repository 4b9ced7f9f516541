"""Run a loaded model once on one sentence and collect what ``posattn-inspect`` draws.

- **Attention probabilities** per side (``encoder``, ``decoder`` self-attention, ``cross``), layer
  and head. fairseq's layers call their attention modules with ``need_weights=False``, so a forward
  hook on every attention module calls the module again, at once and on the very inputs and masks it
  was given (the position context of our kernel still bound), with ``need_head_weights=True``. Our
  kernel (:class:`~fairseq_posattn.modules.attention.PositionAwareMultiheadAttention`) is also asked
  to ``return_softmax_before_transform``: it returns the softmax S *before* the post-softmax
  transform next to the weights (:class:`~fairseq_posattn.modules.attention.AttentionWeights`).
- **Learned position quantities** of every position term of every self-attention layer, as the
  term returns them from ``inspect(positions)`` (:class:`~posattn.position_terms.
  registry.Quantity` records: named arrays with a generic layout), under the name of the term's
  registered method (a term that reads a side-wide module, e.g. T5's table, once per side); a
  post-softmax transform also shows the attention before and after it.
- **Side data** of the source that a position method reads (``BatchSideData``, collated by the task: the
  structural method's parse), as the method traces it (``trace_side_data``: rows per token and matrices over
  token pairs), under the kind the data names (``shown_as``).
- **Positional attentive LSTM LM** (Dagan 2019): ``mu_t``, ``sigma_t`` and the Gaussian attention
  weights of every step (see :class:`PositionalRecorder` for what it needs from the model).

Everything is for batch row 0 of a one-sentence sample, as tensors on the CPU.
"""

from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from inspect import signature
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

import torch
from fairseq.models import FairseqEncoderDecoderModel
from fairseq.modules import MultiheadAttention
from fairseq.sequence_generator import SequenceGenerator
from torch import Tensor, nn

from fairseq_posattn.models.attentive_lstm.positional_attention import PositionalAttention
from fairseq_posattn.modules.attention import PositionAwareMultiheadAttention
from posattn.position_terms.base import PostSoftmaxTransform
from posattn.position_terms.quantities import MATRIX, Quantity, SideDataTrace
from posattn.position_terms.registry import REGISTRY, PositionMethod, method_of

#: kinds that every model may have, whatever its position methods: (before them, after them)
GENERIC_KINDS = (("attention",), ("lstm",))
#: sides of the attention maps, in drawing order
SIDES = ("encoder", "decoder", "cross")
#: decoding limits for the model's own translation: max length = MAX_LEN_A * source + MAX_LEN_B
MAX_LEN_A, MAX_LEN_B = 1.5, 10

Sample = Dict[str, Any]


def shown_side_data() -> Dict[str, PositionMethod]:
    """The registered methods whose side data ``posattn-inspect`` shows, by kind (``shown_as``)."""
    return {method.side_data.shown_as: method for method in REGISTRY.values()
            if method.side_data is not None and method.side_data.shown_as}


def kinds() -> Tuple[str, ...]:
    """What can be drawn (and written as JSON), in drawing order: the attention maps, then each
    registered position method (what its terms' ``inspect`` returns), then the side data and LSTM traces."""
    before, after = GENERIC_KINDS
    return (*before, *REGISTRY, *shown_side_data(), *after)


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
class TermQuantities:
    """What the position terms of one method in one self-attention layer show: the
    :class:`Quantity` records of the terms' ``inspect``, under the method's name. ``positions`` is
    the number of positions asked for (a term built for fewer positions shows its t); ``layer`` is None for what
    the side's layers share (a side-wide table or set of parameters)."""

    side: str
    layer: Optional[int]
    method: str
    positions: int
    quantities: List[Quantity]

    def to_json(self) -> Dict[str, Any]:
        """The values by quantity name, how each is laid out, and the paper the method implements."""
        out: Dict[str, Any] = {"side": self.side, "layer": self.layer, "positions": self.positions,
                               "citation": REGISTRY[self.method].citation}
        out.update((q.name, q.values.tolist()) for q in self.quantities)
        out["presentation"] = {q.name: {"layout": q.layout, "title": q.title, "axes": list(q.axes),
                                        "ticks": [list(t) for t in q.ticks], "panels": list(q.panels)}
                               for q in self.quantities}
        return out


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
    terms: List[TermQuantities]
    side_data: Dict[str, SideDataTrace] = field(default_factory=dict)  # by kind
    lstm: Optional[PositionalTrace] = None

    def tokens(self, side: str) -> List[str]:
        return self.source_tokens if side == "encoder" else self.decoder_tokens

    def available_kinds(self) -> List[str]:
        has = {"attention": bool(self.attention), "lstm": self.lstm is not None}
        methods = {t.method for t in self.terms}
        return [kind for kind in kinds() if has.get(kind, kind in methods or kind in self.side_data)]

    def to_json(self, selected: Sequence[str]) -> Dict[str, Any]:
        """The numbers behind the plots of the ``selected`` kinds (plain lists, JSON-ready)."""
        out: Dict[str, Any] = {
            "source_tokens": self.source_tokens, "source_ids": self.source_ids,
            "decoder_tokens": self.decoder_tokens, "decoder_ids": self.decoder_ids,
            "decoder_input": self.decoder_input,
        }
        for kind in selected:
            if kind == "attention":
                out[kind] = [m.to_json() for m in self.attention]
            elif kind == "lstm":
                out[kind] = self.lstm.to_json()
            elif kind in self.side_data:
                out[kind] = {"tokens": self.source_tokens, **self.side_data[kind].record}
            else:
                out[kind] = [t.to_json() for t in self.terms if t.method == kind]
        return out


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
            hook = partial(self._record, side, layer)
            self._handles.append(module.register_forward_hook(hook, with_kwargs=True))
        return self

    def __exit__(self, *exc: Any) -> None:
        for handle in self._handles:
            handle.remove()

    def _record(self, side: str, layer: int, module: MultiheadAttention, args: Tuple, kwargs: Dict,
                output: Any) -> None:
        ours = isinstance(module, PositionAwareMultiheadAttention)
        call = dict(kwargs, need_weights=True, need_head_weights=True, incremental_state=None)
        if ours:
            call["return_softmax_before_transform"] = True
        with per_head_path(module):
            _, returned = module.forward(*args, **call)  # heads x batch x queries x keys
        weights, softmax = returned if ours else (returned, None)  # ours: AttentionWeights
        self.maps.append(AttentionMap(side, layer, "posattn" if ours else "fairseq", row_0(weights),
                                      row_0(softmax) if ours else None))

    def sorted_maps(self) -> List[AttentionMap]:
        return sorted(self.maps, key=lambda m: (SIDES.index(m.side), m.layer))


def row_0(weights: Tensor) -> Tensor:
    """Batch row 0 of heads x batch x queries x keys weights (heads x queries x keys), detached, fp32."""
    return weights[:, 0].detach().float()


class PositionalRecorder:
    """mu, sigma and the Gaussian weights of the positional attentive LSTM LM (a context manager).

    What it needs from the model (``fairseq_posattn.models.attentive_lstm``): the decoder's
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
def before_after(term: nn.Module, maps: Sequence[AttentionMap], side: str, layer: int,
                 tokens: List[str]) -> List[Quantity]:
    """For a post-softmax transform: the softmax S before it and the attention after it, per head
    (heads x 2 x queries x keys)."""
    if not isinstance(term, PostSoftmaxTransform):
        return []
    found = next(m for m in maps if (m.side, m.layer) == (side, layer))
    return [Quantity("before-after", torch.stack([found.softmax, found.probs], dim=1), MATRIX,
                     "attention before (S) and after the transform", axes=("query", "key"),
                     ticks=(tokens, tokens), panels=("before (S)", "after"), signed=False)]


def shown_key(term: nn.Module) -> Tuple[int, ...]:
    """What a term shows belongs to: the side-wide modules it reads (every layer's T5 term shows the
    side's one table), else the term itself."""
    return tuple(id(module) for module in term.side_modules()) or (id(term),)


def all_term_quantities(model: nn.Module, maps: Sequence[AttentionMap], tokens: Dict[str, List[str]],
                        positions: Optional[int]) -> List[TermQuantities]:
    """What the position terms of every self-attention layer show, one record per side, layer and
    method (a term that reads a side-wide module, once per side, with layer None); ``positions``
    defaults to the side's sentence length."""
    found: Dict[Tuple[str, int, str], TermQuantities] = {}
    seen = set()
    for side, layer, module in attention_modules(model):
        if not isinstance(module, PositionAwareMultiheadAttention):
            continue
        n = positions or len(tokens[side])
        for term in (t for t in module.all_terms() if shown_key(t) not in seen):
            seen.add(shown_key(term))
            quantities = term.inspect(n) + before_after(term, maps, side, layer, tokens[side])
            if quantities:
                method, shown_layer = method_of(term).name, None if term.side_modules() else layer
                record = found.setdefault((side, shown_layer, method), TermQuantities(side, shown_layer, method, n, []))
                record.quantities += quantities
    return list(found.values())


def side_data_traces(model: nn.Module, net_input: Dict[str, Tensor]) -> Dict[str, SideDataTrace]:
    """What the methods show of the source's side data in ``net_input`` (sentence 0), by kind: the data of
    every method that ``posattn-inspect`` shows and the task collated, whether or not the model reads it."""
    options = getattr(model.encoder, "position_options", None)
    traces = {}
    for kind, method in shown_side_data().items():
        collated = net_input.get(method.side_data.key)
        if collated is not None:
            rows = dict(zip(method.side_data.fields, collated[0].long().cpu()))
            traces[kind] = method.trace_side_data(options, rows)
    return traces


# ------------------------------------------------------------------------------------ main entry
def inspect_model(model: nn.Module, task: Any, sample: Sample, decoder_input: str,
                  positions: Optional[int] = None) -> Inspection:
    """Run ``model`` (eval mode, no gradients) once on a one-sentence ``sample`` and collect."""
    model.eval()
    net_input = sample["net_input"]
    with torch.no_grad(), AttentionRecorder(model) as recorder, PositionalRecorder(model) as lstm:
        model(**net_input)
    source_ids = net_input["src_tokens"][0].tolist() if is_encoder_decoder(model) else []
    decoder_ids = _decoder_ids(net_input).tolist()
    source_tokens = [task.source_dictionary[i] for i in source_ids]
    decoder_tokens = [task.target_dictionary[i] for i in decoder_ids]
    maps = recorder.sorted_maps()
    with torch.no_grad():
        terms = all_term_quantities(model, maps, {"encoder": source_tokens, "decoder": decoder_tokens}, positions)
    inspection = Inspection(source_tokens, source_ids, decoder_tokens, decoder_ids, decoder_input, maps, terms)
    if is_encoder_decoder(model):
        inspection.side_data = side_data_traces(model, net_input)
    if lstm.trace is not None:
        inspection.lstm = PositionalTrace(decoder_tokens, *lstm.trace)
    return inspection


def _decoder_ids(net_input: Dict[str, Tensor]) -> Tensor:
    """Row 0 of the decoder's input: ``prev_output_tokens``, or a language model's ``src_tokens``."""
    return net_input.get("prev_output_tokens", net_input["src_tokens"])[0]
