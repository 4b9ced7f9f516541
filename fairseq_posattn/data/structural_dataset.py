"""A :class:`~fairseq.data.LanguagePairDataset` whose batches carry the source's structural side data.

fairseq's collater re-sorts a batch by source length and left-pads the source by default; the side
data (``(3, n + 1)`` per sentence: depth, tin, tout; see :mod:`fairseq_posattn.structure.side_data`)
is collated in the batch's own order and padding, as ``net_input["src_structure"]``
``(batch, 3, src_len)``, pads holding depth 0 and tin = tout = -1.
"""

from typing import Dict, List

import torch
from fairseq.data import BaseWrapperDataset, LanguagePairDataset
from torch.utils.data import Dataset

STRUCTURE_PAD = (0, -1, -1)


class StructuralLanguagePairDataset(BaseWrapperDataset):
    def __init__(self, dataset: LanguagePairDataset, structure: Dataset):
        super().__init__(dataset)
        self.structure = structure

    def __getitem__(self, index: int) -> Dict:
        item = self.dataset[index]
        item["structure"] = torch.as_tensor(self.structure[index]).long().view(3, -1)
        return item

    def collater(self, samples: List[Dict]) -> Dict:
        batch = self.dataset.collater(samples)
        if len(batch) == 0:
            return batch
        by_id = {sample["id"]: sample["structure"] for sample in samples}
        batch["net_input"]["src_structure"] = collate_structure(
            [by_id[i] for i in batch["id"].tolist()], batch["net_input"]["src_tokens"],
            self.dataset.left_pad_source)
        return batch


def collate_structure(structures: List[torch.Tensor], src_tokens: torch.Tensor, left_pad: bool) -> torch.Tensor:
    """``(batch, 3, src_len)`` side data, row r from ``structures[r]``, padded as the tokens are."""
    length = src_tokens.size(1)
    out = torch.tensor(STRUCTURE_PAD, device=src_tokens.device).view(1, 3, 1).repeat(len(structures), 1, length)
    for row, side in enumerate(structures):
        n = side.size(1)
        if left_pad:
            out[row, :, length - n:] = side
        else:
            out[row, :, :n] = side
    return out
