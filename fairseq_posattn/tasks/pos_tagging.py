"""``--task pos_tagging``: part-of-speech tagging of CoNLL-U treebanks (Dufter et al. 2020, section 3).

Data directories come from ``posattn-prepare-tagging`` (see
:mod:`fairseq_posattn.data.tagging_binarize`). Train and validate with ``--criterion pos_tagging``,
which logs accuracy over all words, OOV words and ambiguous words; pick the best checkpoint with
``--best-checkpoint-metric accuracy --maximize-best-checkpoint-metric``.
"""

import logging
from dataclasses import dataclass, field
from typing import List, Sequence

import torch
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
            predicted = model(**net_input).argmax(dim=-1).cpu()
            for row, length in enumerate(batch["net_input"]["src_lengths"].tolist()):
                sentence = pieces[start + row][0]
                tags[sentence] += [self.vocabulary.tags[t] for t in predicted[row, :length].tolist()]
        return tags

    @property
    def source_dictionary(self):
        return self.vocabulary.words

    @property
    def target_dictionary(self):
        return self.vocabulary.tags

    @property
    def char_dictionary(self):
        return self.vocabulary.chars
