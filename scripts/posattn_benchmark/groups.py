"""Row groups: one batch shape each (Multi30k-like translation, translation at 512 tokens, language
model sentences and blocks, plain-PyTorch attention layers on blocks, the Hugging Face Llama on language-model
sentences), with what the workers measured for it."""

import argparse
import importlib.util
from dataclasses import dataclass, field
from typing import Any, Dict, FrozenSet, List, Optional, Sequence, Set

from posattn_benchmark.batches import BatchShape
from posattn_benchmark.variants import HUGGINGFACE, LANGUAGE_MODELING, PYTORCH, REFERENCES, TRANSLATION, Variant

LONG_LENGTH = 512
#: the language model's greedy decoding group: sequences per batch and tokens from BOS, decoded step by step
GREEDY_BATCH, GREEDY_LENGTH = 8, 48


@dataclass
class Group:
    """A row group: one batch shape and max positions, and what its workers measured."""

    title: str
    shape: BatchShape
    max_positions: int
    task: str = TRANSLATION
    #: whether the decoding variants decode here (a language model's prompt length does not matter
    #: to its decoding speed: only its sentences group decodes)
    decodes: bool = True
    #: whether train steps are timed and memory measured here (not in a decoding-only group)
    trains: bool = True
    #: decoding: fairseq's beam search (SequenceGenerator), or greedy steps of the model's decoder from BOS
    #: (``model.decoder(tokens, incremental_state=...)`` per token, as a sampling loop runs it)
    greedy: bool = False
    #: tokens each hypothesis decodes (None: --decode-length)
    decode_length: Optional[int] = None
    memory: Dict[str, List[Dict[str, Any]]] = field(default_factory=dict)
    #: step times of the primary malloc setting, and with glibc's default malloc (``--malloc both``)
    timing: Dict[str, List[float]] = field(default_factory=dict)
    timing_default_malloc: Dict[str, List[float]] = field(default_factory=dict)
    decoding: Dict[str, List[float]] = field(default_factory=dict)
    decode_sentences: List[int] = field(default_factory=list)
    decode_shapes: List[List[int]] = field(default_factory=list)
    failures: Dict[str, str] = field(default_factory=dict)
    digests: Set[str] = field(default_factory=set)
    #: why the group was not run (the Hugging Face group without transformers), or None
    skipped: Optional[str] = None
    #: the Hugging Face front-end's refusal of each row it does not take, by variant name
    refused: Dict[str, str] = field(default_factory=dict)
    #: the Hugging Face group's machine, versions and model sizes, as its worker saw them
    about: Dict[str, Any] = field(default_factory=dict)
    #: the names of the only variants measured here (None: every variant of the task; a plain-PyTorch group past
    #: ``--pytorch-methods-up-to`` measures the layer without a method alone)
    only: Optional[FrozenSet[str]] = None

    @property
    def reference(self) -> Variant:
        """The model the group's variants are compared with: vanilla fairseq's, or transformers' Llama."""
        return REFERENCES[self.task]

    @property
    def measures_memory(self) -> bool:
        """Whether each model's peak memory is measured (in a process of its own) before the timing: the fairseq
        groups that train; the Hugging Face group times only."""
        return self.trains and self.task != HUGGINGFACE

    def applicable(self, variants: Sequence[Variant]) -> List[Variant]:
        """The ``variants`` built for this group's task (and among :attr:`only`)."""
        return [variant for variant in variants
                if variant.task == self.task and (self.only is None or variant.name in self.only)]

    def decoders(self, variants: Sequence[Variant]) -> List[Variant]:
        """The decoding ``variants`` that decode in this group."""
        return self.applicable(variants) if self.decodes else []


def huggingface_unavailable() -> Optional[str]:
    """Why the Hugging Face group cannot run here (transformers is not installed), or None; imports nothing."""
    if importlib.util.find_spec("transformers") is None:
        return "transformers is not installed (the extra hf: pip install '.[hf]')"
    return None


def build_groups(cli: argparse.Namespace) -> List[Group]:
    """The Multi30k-like group (unless ``--skip-short``), and the ``--long``, ``--lm``, ``--pytorch`` and
    ``--huggingface`` groups when asked for."""
    groups = []
    if not cli.skip_short:
        groups.append(Group(f"Multi30k-like, lengths {cli.min_len}-{cli.max_len}",
                            BatchShape(cli.min_len, cli.max_len, cli.max_tokens), cli.max_positions))
    if cli.long:
        groups.append(Group(f"sequence length {LONG_LENGTH}",
                            BatchShape(LONG_LENGTH, LONG_LENGTH, cli.long_batch_size * LONG_LENGTH),
                            LONG_LENGTH))
    if cli.lm and not cli.lm_blocks_only:
        groups.append(Group(f"language model, sentences of {cli.min_len}-{cli.max_len}",
                            BatchShape(cli.min_len, cli.max_len, cli.max_tokens), cli.max_positions,
                            task=LANGUAGE_MODELING))
        groups.append(Group(f"language model, greedy decoding of {GREEDY_LENGTH} tokens from BOS "
                            f"({GREEDY_BATCH} sequences, {LONG_LENGTH} positions)",
                            BatchShape(2, 2, 2 * GREEDY_BATCH), LONG_LENGTH, task=LANGUAGE_MODELING,
                            trains=False, greedy=True, decode_length=GREEDY_LENGTH))
    if cli.lm:
        for length in cli.lm_block_lengths:
            blocks = cli.lm_batch_size if cli.lm_block_tokens is None else max(1, cli.lm_block_tokens // length)
            groups.append(Group(f"language model, blocks of {length}" + (f" (batch of {blocks})" if
                                                                      len(cli.lm_block_lengths) > 1 else ""),
                                BatchShape(length, length, blocks * length), length,
                                task=LANGUAGE_MODELING, decodes=False))
    for length in cli.pytorch_lengths if cli.pytorch else ():
        methods = length <= cli.pytorch_methods_up_to
        groups.append(Group(f"plain PyTorch, blocks of {length}" + ("" if methods else ", no method"),
                            BatchShape(length, length, max(1, cli.pytorch_tokens // length) * length), length,
                            task=PYTORCH, decodes=False, only=None if methods else frozenset({"pt-no-method"})))
    if cli.huggingface:
        # every prompt with its generated tokens within the positions the methods take
        groups.append(Group(f"Hugging Face Llama, sentences of {cli.min_len}-{cli.max_len}",
                            BatchShape(cli.min_len, cli.max_len, cli.max_tokens),
                            max(cli.max_positions, cli.max_len + cli.decode_length), task=HUGGINGFACE,
                            skipped=huggingface_unavailable()))
    return groups
