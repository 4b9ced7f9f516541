"""The worker subprocess: builds the batches and the models of one :class:`WorkerSpec` and measures
them (peak memory of one model, round-robin train-step or beam-search times, the Hugging Face group's train
steps and generation, or a torch.profiler table); the parent (:mod:`posattn_benchmark.runner`) reads its result
line from stdout. transformers is imported only by a worker of the Hugging Face group.
"""

import functools
import json
import math
import resource
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from typing import Any, Dict, List, Optional, Tuple

from posattn_benchmark.batches import (
    BatchShape, add_side_data, add_structure, batches_digest, load_trees, make_batches, make_dictionary,
    make_lm_batches,
)
from posattn_benchmark.variants import HUGGINGFACE, LANGUAGE_MODELING, PYTORCH, TRANSLATION, Variant

RESULT_MARKER = "BENCHMARK_RESULT "
#: ``--precision``: the models' dtype
PRECISIONS = ("fp32", "bf16")
LABEL_SMOOTHING = 0.1
BEAM_SIZE = 5
#: operators per table of ``--profile``
PROFILE_ROWS = 15


@dataclass(frozen=True)
class LlamaSpec:
    """The Hugging Face group's Llama (``transformers.LlamaConfig``'s sizes) and its generation: batches of
    ``prompts`` sentences, ``rounds`` timed rounds, by the variants named in ``generated``."""

    sizes: Dict[str, int]
    prompts: int
    rounds: int
    generated: Tuple[str, ...] = ()


@dataclass(frozen=True)
class WorkerSpec:
    """What one worker subprocess measures (sent as JSON): ``memory`` of ``variants[0]`` alone,
    the round-robin ``timing`` (train steps) or ``decoding`` (beam search, hypotheses of
    ``decode_length`` tokens) of all ``variants`` (the first one is the reference), or a
    torch.profiler ``profile`` of each variant's train steps. ``task``: ``translation`` (source,
    target and structural side data) or ``language_modeling`` (blocks of ``shape.max_len`` tokens).
    ``conllu``: the trees of the structural side data. ``huggingface``: the Hugging Face group's train steps,
    then its generation, in one process (transformers' import costs seconds), its sizes in ``llama``.
    ``pytorch``: the plain-PyTorch group's layers (``embed_dim``, ``heads``, ``layers``), on blocks as a language
    model's."""

    mode: str
    task: str
    variants: Tuple[Variant, ...]
    size_flags: Tuple[str, ...]
    max_positions: int
    shape: BatchShape
    vocab_size: int
    warmup: int
    steps: int
    seed: int
    device: Optional[str]
    threads: Optional[int]
    conllu: str
    decode_length: int
    precision: str = "fp32"
    greedy: bool = False
    llama: Optional[LlamaSpec] = None
    pytorch: Optional[Dict[str, int]] = None

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> "WorkerSpec":
        raw = json.loads(text)
        raw["variants"] = tuple(
            Variant(v["name"], v["label"], tuple(v["flags"]), v["arch"]) for v in raw["variants"]
        )
        raw["size_flags"] = tuple(raw["size_flags"])
        raw["shape"] = BatchShape(**raw["shape"])
        if raw["llama"] is not None:
            raw["llama"] = LlamaSpec(**{**raw["llama"], "generated": tuple(raw["llama"]["generated"])})
        return cls(**raw)


#: the keys of ``net_input`` that every model of a task reads (the rest is side data)
TOKEN_INPUTS = ("src_tokens", "src_lengths", "prev_output_tokens")


def model_input(model: Any, net_input: Dict[str, Any]) -> Dict[str, Any]:
    """``net_input`` as ``model`` takes it: the side data that its encoder's position methods read, and no
    other (fairseq's own models take tokens only)."""
    side = getattr(getattr(model, "encoder", None), "position_side", None)
    reads = {data.key for _, data in side.side_data} if side is not None else set()
    return {key: value for key, value in net_input.items() if key in TOKEN_INPUTS or key in reads}


def peak_rss_mb() -> float:
    """The process's peak resident set size so far (``ru_maxrss``: KiB on Linux, bytes on macOS)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**20 if sys.platform == "darwin" else peak / 2**10


def model_sizes(model: Any) -> Dict[str, int]:
    """Embedding and FFN size, layers per side and heads of a built fairseq transformer (or LM)."""
    decoder = model.decoder
    encoder = getattr(model, "encoder", None)
    return {
        "embed": decoder.embed_tokens.embedding_dim, "ffn": decoder.layers[0].fc1.out_features,
        "encoder_layers": len(encoder.layers) if encoder is not None else 0,
        "decoder_layers": len(decoder.layers), "heads": decoder.layers[0].self_attn.num_heads,
    }


class Worker:
    """One subprocess's device, dictionary and batches, and the models it builds and trains."""

    def __init__(self, spec: WorkerSpec):
        import torch

        self.spec = spec
        if spec.threads is not None:
            torch.set_num_threads(spec.threads)
        self.device = torch.device(spec.device or ("cuda" if torch.cuda.is_available() else "cpu"))
        self.dictionary = make_dictionary(spec.vocab_size)
        #: the Hugging Face front-end's refusal of each variant it does not take, by name
        self.refused: Dict[str, str] = {}
        count = spec.warmup + spec.steps
        if spec.task in (LANGUAGE_MODELING, HUGGINGFACE, PYTORCH):
            batches = make_lm_batches(self.dictionary, spec.shape, count, spec.seed)
        else:
            batches = make_batches(self.dictionary, spec.shape, count, spec.seed)
            from posattn.position_terms.catalogue import all_side_data

            add_structure(batches, load_trees(spec.conllu), spec.seed)
            add_side_data(batches, all_side_data("encoder"), self.dictionary.pad())
        self.digest = batches_digest(batches)
        self.batch_shapes = [list(b["net_input"]["src_tokens"].shape) for b in batches]
        self.batches = [
            {"net_input": {k: v.to(self.device) for k, v in b["net_input"].items()},
             "target": b["target"].to(self.device)}
            for b in batches
        ]

    @property
    def on_cuda(self) -> bool:
        return self.device.type == "cuda"

    def synchronize(self) -> None:
        """Wait for the GPU's queued work (nothing to wait for on the CPU)."""
        import torch

        if self.on_cuda:
            torch.cuda.synchronize()

    @functools.cached_property
    def llama(self) -> Any:
        """The Hugging Face group's models (:class:`posattn_benchmark.huggingface.LlamaModels`, which imports
        transformers)."""
        from posattn_benchmark.huggingface import LlamaModels

        return LlamaModels(self.spec.llama.sizes, self.spec.vocab_size, self.spec.max_positions, self.dictionary)

    def build(self, variant: Variant) -> Tuple[Any, Any]:
        """Model and Adam optimizer of ``variant``: a fairseq model built as ``fairseq-train`` does (through
        :func:`build_fairseq_model`), the Hugging Face group's Llama, or the plain-PyTorch group's layers."""
        import torch

        torch.manual_seed(self.spec.seed)
        dtype = torch.bfloat16 if self.spec.precision == "bf16" else torch.float32
        if variant.task == HUGGINGFACE:
            model = self.llama.build(variant)
        elif variant.task == PYTORCH:
            from posattn_benchmark import pytorch

            model = pytorch.build(variant, self.spec.pytorch, self.spec.vocab_size, self.spec.max_positions)
        else:
            model = self.build_fairseq_model(variant)
        model = model.to(device=self.device, dtype=dtype).train()
        optimizer = torch.optim.Adam(model.parameters(), lr=5e-4, betas=(0.9, 0.98))
        return model, optimizer

    def try_build(self, variant: Variant) -> Optional[Tuple[Any, Any]]:
        """:meth:`build`, or None where the Hugging Face front-end refuses the variant's method (its message in
        :attr:`refused`)."""
        from posattn.errors import UserError

        try:
            return self.build(variant)
        except UserError as refusal:
            if variant.task != HUGGINGFACE:
                raise
            self.refused[variant.name] = str(refusal)
            return None

    def build_fairseq_model(self, variant: Variant) -> Any:
        """``variant``'s fairseq model (through :func:`fairseq_posattn.models.building.build_model`)."""
        from fairseq_posattn.models.building import DictionaryTask, build_model

        positions = str(self.spec.max_positions)
        if variant.task == LANGUAGE_MODELING:
            task_flags = ["--task", LANGUAGE_MODELING, "--tokens-per-sample", positions]
        else:
            task_flags = ["--task", TRANSLATION, "--max-source-positions", positions]
        argv = [*task_flags, "--arch", variant.arch, "--max-target-positions", positions,
                "--dropout", "0.1", *self.spec.size_flags, *variant.flags]
        # the side data the batches carry (a parse, ...), as the task that collates it would declare it
        collated = tuple(key for key in self.batches[0]["net_input"] if key not in TOKEN_INPUTS)
        task = DictionaryTask(self.dictionary, self.dictionary, collated_side_data=collated)
        return build_model(argv, task)

    def loss(self, variant: Variant, model: Any, batch: Dict[str, Any]) -> Any:
        """The forward pass and loss of a train step: fairseq's label-smoothed cross entropy (a language model's:
        plain cross entropy) per target token, the Hugging Face group's cross entropy, or the plain-PyTorch group's
        loss."""
        if variant.task == HUGGINGFACE:
            return self.llama.loss(model, batch)
        if variant.task == PYTORCH:
            from posattn_benchmark import pytorch

            return pytorch.loss(model, batch)
        from fairseq.criterions.label_smoothed_cross_entropy import label_smoothed_nll_loss

        pad = self.dictionary.pad()
        net_output = model(**model_input(model, batch["net_input"]))
        lprobs = model.get_normalized_probs(net_output, log_probs=True)
        target = batch["target"]
        epsilon = LABEL_SMOOTHING if variant.task == TRANSLATION else 0.0  # LM: cross entropy
        loss, _ = label_smoothed_nll_loss(lprobs.float().view(-1, lprobs.size(-1)), target.view(-1),
                                          epsilon, ignore_index=pad)
        return loss / target.ne(pad).sum()

    def step(self, variant: Variant, model: Any, optimizer: Any, batch: Dict[str, Any]) -> float:
        """One train step (forward, loss, backward, Adam; :meth:`loss`); its time in ms.

        Gradients are dropped after the update, so that idle models hold weights and Adam state only.
        """
        self.synchronize()
        start = time.perf_counter()
        loss = self.loss(variant, model, batch)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        self.synchronize()
        elapsed_ms = (time.perf_counter() - start) * 1000
        if not math.isfinite(loss.item()):
            raise FloatingPointError(f"loss is {loss.item()}")
        return elapsed_ms

    def memory(self) -> Dict[str, Any]:
        """Peak memory (MB above the state before the model is built) of ``variants[0]`` alone, over
        a step on the first batch (which allocates the Adam state) and one on the largest batch."""
        import fairseq
        import torch

        if self.on_cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            before = torch.cuda.memory_allocated() / 2**20
        else:
            before = peak_rss_mb()
        variant = self.spec.variants[0]
        model, optimizer = self.build(variant)
        largest = max(self.batches,
                      key=lambda batch: batch["net_input"]["src_tokens"].numel() + batch["target"].numel())
        for batch in (self.batches[0], largest):
            self.step(variant, model, optimizer, batch)
        peak = torch.cuda.max_memory_allocated() / 2**20 if self.on_cuda else peak_rss_mb()
        return {
            "peak_mb": peak - before,
            "params": sum(p.numel() for p in model.parameters()),
            "digest": self.digest,
            "batch_shapes": self.batch_shapes,
            "device": torch.cuda.get_device_name(self.device) if self.on_cuda else "cpu",
            "threads": torch.get_num_threads(),
            "torch": torch.__version__,
            "fairseq": fairseq.__version__,
            "sizes": self.spec.pytorch if variant.task == PYTORCH else model_sizes(model),
        }

    def timing(self) -> Dict[str, Any]:
        """Step times of every variant (that the Hugging Face front-end takes), run round-robin: one step each
        per batch, order rotated."""
        models = [(variant, *built) for variant in self.spec.variants if (built := self.try_build(variant))]
        step_ms: Dict[str, List[float]] = {variant.name: [] for variant, _, _ in models}
        for index, batch in enumerate(self.batches):
            shift = index % len(models)
            for variant, model, optimizer in models[shift:] + models[:shift]:
                elapsed_ms = self.step(variant, model, optimizer, batch)
                if index >= self.spec.warmup:
                    step_ms[variant.name].append(elapsed_ms)
        return {"step_ms": step_ms, "digest": self.digest, "refused": self.refused}

    def huggingface(self) -> Dict[str, Any]:
        """The Hugging Face group: the round-robin train steps (:meth:`timing`), then the greedy generation
        (:meth:`generation`, where any variant generates) of fresh models; the machine, versions and sizes under
        ``about``."""
        import fairseq
        import torch

        result = self.timing()
        generated = (self.generation() if self.spec.llama.generated
                     else {"decode_ms": {}, "sentences": [], "batch_shapes": []})
        reference = self.llama.build(self.spec.variants[0])
        about = {**self.llama.about(reference), "device": "cpu" if not self.on_cuda else
                 torch.cuda.get_device_name(self.device), "threads": torch.get_num_threads(),
                 "torch": torch.__version__, "fairseq": fairseq.__version__}
        return {**result, **generated, "about": about}

    def generation(self) -> Dict[str, Any]:
        """Greedy generation (``model.generate`` with the cache) of ``decode_length`` tokens by every variant
        of ``llama.generated`` that the front-end takes, in eval mode, on batches of ``llama.prompts`` sentences
        as left-padded prompts, round-robin with the order rotated; each one's times in ms."""
        shape = self.spec.shape.sentences(self.spec.llama.prompts)
        batches = make_lm_batches(self.dictionary, shape, self.spec.warmup + self.spec.llama.rounds, self.spec.seed)
        models = [(variant, built[0].eval()) for variant in self.spec.variants
                  if variant.name in self.spec.llama.generated and (built := self.try_build(variant))]
        generate_ms: Dict[str, List[float]] = {variant.name: [] for variant, _ in models}
        for index, batch in enumerate(batches):
            prompts, mask = self.llama.prompts(batch["net_input"]["src_tokens"].to(self.device),
                                               batch["net_input"]["src_lengths"])
            shift = index % len(models)
            for variant, model in models[shift:] + models[:shift]:
                self.synchronize()
                start = time.perf_counter()
                self.llama.generate(model, prompts, mask, self.spec.decode_length)
                self.synchronize()
                if index >= self.spec.warmup:
                    generate_ms[variant.name].append((time.perf_counter() - start) * 1000)
        return {"decode_ms": generate_ms, "sentences": [len(b["target"]) for b in batches[self.spec.warmup:]],
                "batch_shapes": [list(b["net_input"]["src_tokens"].shape) for b in batches]}

    def decode(self, variant: Variant, model: Any, generator: Any, batch: Dict[str, Any]) -> float:
        """Beam search on one batch, as ``fairseq-generate`` runs it; its time in ms."""
        self.synchronize()
        start = time.perf_counter()
        hypotheses = generator.generate([model], {"net_input": model_input(model, batch["net_input"])})
        self.synchronize()
        elapsed_ms = (time.perf_counter() - start) * 1000
        lengths = {h["tokens"].numel() for beam in hypotheses for h in beam}
        if lengths != {self.spec.decode_length + 1}:
            raise RuntimeError(f"{variant.name}: hypotheses of {sorted(lengths)} tokens, expected "
                               f"{self.spec.decode_length} and EOS")
        return elapsed_ms

    def decode_in_lockstep(self, models: List[Tuple[Variant, Any, Any]], batch: Dict[str, Any]) -> Dict[str, float]:
        """Greedy decoding of ``decode_length`` tokens from BOS for the batch's sentences by every model at
        once: one ``model.decoder(tokens, incremental_state=...)`` call per model and token, the models' calls
        of each step in a rotated order, so that a machine whose speed drifts slows every model alike. Each
        model's time in ms."""
        import torch

        start_tokens = torch.full((batch["net_input"]["src_tokens"].size(0), 1), self.dictionary.eos(),
                                  dtype=torch.long, device=self.device)
        tokens = {variant.name: start_tokens for variant, _, _ in models}
        states: Dict[str, Dict[str, Any]] = {variant.name: {} for variant, _, _ in models}
        elapsed = {variant.name: 0.0 for variant, _, _ in models}
        with torch.no_grad():
            for step in range(self.spec.decode_length):
                shift = step % len(models)
                for variant, model, _ in models[shift:] + models[:shift]:
                    self.synchronize()
                    start = time.perf_counter()
                    logits = model.decoder(tokens[variant.name], incremental_state=states[variant.name])[0]
                    tokens[variant.name] = torch.cat([tokens[variant.name], logits[:, -1].argmax(-1, keepdim=True)],
                                                     dim=1)
                    self.synchronize()
                    elapsed[variant.name] += time.perf_counter() - start
        return {name: seconds * 1000 for name, seconds in elapsed.items()}

    def decoding(self) -> Dict[str, Any]:
        """Decoding times of every variant in eval mode: beam search with every hypothesis forced to
        ``decode_length`` tokens (``min_len = max_len_b``), round-robin as in :meth:`timing`, or (``greedy``)
        the decoders stepped greedily from BOS in lockstep (:meth:`decode_in_lockstep`)."""
        from fairseq.sequence_generator import SequenceGenerator

        length = self.spec.decode_length
        models = []
        for variant in self.spec.variants:
            model = self.build(variant)[0].eval()
            generator = None if self.spec.greedy else SequenceGenerator(
                [model], self.dictionary, beam_size=BEAM_SIZE, max_len_a=0, max_len_b=length, min_len=length)
            models.append((variant, model, generator))
        decode_ms: Dict[str, List[float]] = {variant.name: [] for variant in self.spec.variants}
        for index, batch in enumerate(self.batches):
            if self.spec.greedy:
                times = self.decode_in_lockstep(models, batch)
            else:
                shift = index % len(models)
                times = {variant.name: self.decode(variant, model, generator, batch)
                         for variant, model, generator in models[shift:] + models[:shift]}
            if index >= self.spec.warmup:
                for name, elapsed_ms in times.items():
                    decode_ms[name].append(elapsed_ms)
        sentences = [len(b["net_input"]["src_tokens"]) for b in self.batches[self.spec.warmup:]]
        return {"decode_ms": decode_ms, "sentences": sentences, "batch_shapes": self.batch_shapes,
                "digest": self.digest}

    def profile(self) -> Dict[str, Any]:
        """Each variant in turn: warm-up steps, then the timed steps under torch.profiler; the
        operators with the most self time (CPU, or CUDA on a GPU) and the mean step time."""
        from torch.profiler import ProfilerActivity, profile

        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self.on_cuda else [])
        sort_by = "self_cuda_time_total" if self.on_cuda else "self_cpu_time_total"
        tables, step_ms = {}, {}
        for variant in self.spec.variants:
            built = self.try_build(variant)
            if built is None:
                continue
            model, optimizer = built
            for batch in self.batches[: self.spec.warmup]:
                self.step(variant, model, optimizer, batch)
            with profile(activities=activities) as profiler:
                times = [self.step(variant, model, optimizer, batch)
                         for batch in self.batches[self.spec.warmup:]]
            tables[variant.name] = profiler.key_averages().table(sort_by=sort_by, row_limit=PROFILE_ROWS)
            step_ms[variant.name] = statistics.mean(times)
            del model, optimizer
        return {"tables": tables, "step_ms": step_ms, "digest": self.digest, "refused": self.refused}


def worker_main(spec_json: str) -> None:
    spec = WorkerSpec.from_json(spec_json)
    worker = Worker(spec)
    modes = {"memory": worker.memory, "timing": worker.timing, "decoding": worker.decoding,
             "huggingface": worker.huggingface, "profile": worker.profile}
    result = modes[spec.mode]()
    print(RESULT_MARKER + json.dumps(result), flush=True)

