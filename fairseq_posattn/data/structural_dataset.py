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
        src_tokens = batch["net_input"]["src_tokens"]
        structure = src_tokens.new_empty((src_tokens.size(0), 3, src_tokens.size(1)))
        structure[:] = torch.tensor(STRUCTURE_PAD).view(1, 3, 1)
        by_id = {sample["id"]: sample["structure"] for sample in samples}
        for row, sample_id in enumerate(batch["id"].tolist()):
            side = by_id[sample_id]
            n = side.size(1)
            if self.dataset.left_pad_source:
                structure[row, :, src_tokens.size(1) - n:] = side
            else:
                structure[row, :, :n] = side
        batch["net_input"]["src_structure"] = structure
        return batch
