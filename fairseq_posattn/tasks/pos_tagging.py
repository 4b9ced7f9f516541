"""``--task pos_tagging``: part-of-speech tagging of CoNLL-U treebanks (Dufter et al. 2020, section 3).

Data directories come from ``posattn-prepare-tagging`` (see
:mod:`fairseq_posattn.data.tagging_binarize`). Train and validate with ``--criterion pos_tagging``,
which logs accuracy over all words, OOV words and ambiguous words; pick the best checkpoint with
``--best-checkpoint-metric accuracy --maximize-best-checkpoint-metric``.
"""

import logging
import re
from dataclasses import dataclass, field
from typing import Dict, List, Sequence

import torch
from fairseq.data import Dictionary
from fairseq.dataclass import FairseqDataclass
from fairseq.tasks import FairseqTask, register_task

from fairseq_posattn.data.tagged_corpus import piece_slices
from fairseq_posattn.data.tagging_dataset import (
    TaggingDataset,
    TaggingSettings,
    TaggingVocabulary,
    collate_tagging,
)

logger = logging.getLogger(__name__)

#: the fillers ``Dictionary.finalize(padding_factor=...)`` appends (``madeupword0000``, ...)
FILLER = re.compile(r"madeupword\d{4}")


def not_tags(tags: Dictionary) -> torch.Tensor:
    """``(len(tags),)`` bool: True at the symbols of the tag dictionary that are no tag of the data (its
    special symbols ``<s>``, ``<pad>``, ``</s>``, ``<unk>`` and any fairseq filler)."""
    return torch.tensor([i < tags.nspecial or bool(FILLER.fullmatch(symbol))
                         for i, symbol in enumerate(tags.symbols)])


@dataclass
class PosTaggingConfig(FairseqDataclass):
    data: str = field(default="", metadata={"help": "data directory made by posattn-prepare-tagging"})


@register_task("pos_tagging", dataclass=PosTaggingConfig)
class PosTaggingTask(FairseqTask):
    """Tag every word of a sentence; words, characters, tags and OOV/ambiguous flags per split."""

    def __init__(self, cfg: PosTaggingConfig, vocabulary: TaggingVocabulary, settings: TaggingSettings):
        super().__init__(cfg)
        self.vocabulary = vocabulary
        self.settings = settings
        self._not_tags: Dict[torch.device, torch.Tensor] = {}

    @classmethod
    def setup_task(cls, cfg: PosTaggingConfig, **kwargs) -> "PosTaggingTask":
        if not cfg.data:
            raise ValueError("pos_tagging needs the data directory made by posattn-prepare-tagging as "
                             "its first argument")
        settings = TaggingSettings.load(cfg.data)
        vocabulary = TaggingVocabulary.load(cfg.data)
        logger.info("[words] dictionary: %d types, [chars]: %d, [tags] (%s): %d", len(vocabulary.words),
                    len(vocabulary.chars), settings.tag_column.upper(), len(vocabulary.tags))
        return cls(cfg, vocabulary, settings)

    def load_dataset(self, split: str, epoch: int = 1, combine: bool = False, **kwargs) -> None:
        self.datasets[split] = TaggingDataset.load(
            self.cfg.data, split, self.vocabulary, self.settings.max_chars, shuffle=split == "train")
        logger.info("%s: %d sentence pieces", split, len(self.datasets[split]))

    def build_criterion(self, cfg):
        name = getattr(cfg, "_name", None)
        if name not in ("pos_tagging", None):
            raise ValueError(f"--task pos_tagging trains with --criterion pos_tagging (got --criterion "
                             f"{name}): it reports accuracy over all, OOV and ambiguous words")
        return super().build_criterion(cfg)

    def max_positions(self) -> int:
        return self.settings.max_length

    def predict_tags(self, logits: torch.Tensor) -> torch.Tensor:
        """The most probable *tag* of every word of ``(..., tags)`` logits: the argmax over the tags of the
        data, never a special symbol (which an undertrained model may score highest). Every prediction
        path takes it: the criterion's accuracies, :meth:`tag_sentences` (posattn-tag, the hub)."""
        mask = self._not_tags.get(logits.device)
        if mask is None:
            mask = self._not_tags[logits.device] = not_tags(self.vocabulary.tags).to(logits.device)
        return logits.masked_fill(mask, float("-inf")).argmax(dim=-1)

    @torch.no_grad()
    def tag_sentences(self, model: torch.nn.Module, sentences: Sequence[Sequence[str]],
                      batch_size: int = 64) -> List[List[str]]:
        """The predicted tag of every word of ``sentences``; sentences longer than the prepared
        ``max_length`` are tagged in consecutive pieces, as in training."""
        pieces = [(index, words[piece]) for index, words in enumerate(sentences)
                  for piece in piece_slices(len(words), self.settings.max_length)]
        items = []
        for k, (_, words) in enumerate(pieces):
            word_ids, chars = self.vocabulary.encode_words(words, self.settings.max_chars)
            items.append({"id": k, "words": word_ids, "chars": chars.view(len(words), -1)})
        tags: List[List[str]] = [[] for _ in sentences]
        device = next(model.parameters()).device
        model.eval()
        for start in range(0, len(items), batch_size):
            batch = collate_tagging(items[start:start + batch_size], self.vocabulary, self.settings.max_chars)
            net_input = {key: value.to(device) for key, value in batch["net_input"].items()}
            predicted = self.predict_tags(model(**net_input)).cpu()
            for row, length in enumerate(batch["net_input"]["src_lengths"].tolist()):
                sentence = pieces[start + row][0]
                tags[sentence] += [self.vocabulary.tags[t] for t in predicted[row, :length].tolist()]
        return tags

    def dictionary_files(self) -> Dict[str, Dictionary]:
        """The dictionaries by file name in the data directory (:mod:`fairseq_posattn.data.fingerprint`)."""
        return self.vocabulary.files()

    @property
    def source_dictionary(self):
        return self.vocabulary.words

    @property
    def target_dictionary(self):
        return self.vocabulary.tags

    @property
    def char_dictionary(self):
        return self.vocabulary.chars
