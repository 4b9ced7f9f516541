"""``--criterion pos_tagging``: cross-entropy over every word's tag, with the accuracies of Dufter et
al. (2020, section 3): over all words, out-of-vocabulary words and ambiguous words.

The logged ``accuracy``, ``oov_accuracy`` and ``ambiguous_accuracy`` are percentages of the words
of the whole validation set (counts are summed before dividing), each word's prediction being its most
probable tag of the data, as posattn-tag and the hub predict it
(:meth:`~fairseq_posattn.tasks.pos_tagging.PosTaggingTask.predict_tags`); ``loss`` is in base 2 per word, as
fairseq's cross-entropy criterion reports it.
"""

import math
from typing import Dict, List

import torch
import torch.nn.functional as F
from fairseq import metrics, utils
from fairseq.criterions import FairseqCriterion, register_criterion

from fairseq_posattn.data.tagged_corpus import AMBIGUOUS_FLAG, OOV_FLAG

COUNTS = {  # logged count -> (words counted, correct ones): summed over batches, then divided
    "accuracy": ("n_words", "n_correct"),
    "oov_accuracy": ("n_oov", "n_correct_oov"),
    "ambiguous_accuracy": ("n_ambiguous", "n_correct_ambiguous"),
}


def tagging_counts(predicted: torch.Tensor, target: torch.Tensor, flags: torch.Tensor,
                   padding_idx: int) -> Dict[str, torch.Tensor]:
    """Words, OOV words and ambiguous words, and how many of each are tagged right.

    Each count is a 0-dim tensor on the batch's device: reading it on the host would wait for the
    device at every step; fairseq sums the logging outputs as they are and
    :meth:`PosTaggingCriterion.reduce_metrics` reads the sums once.
    """
    real = target.ne(padding_idx)
    correct = predicted.eq(target) & real
    oov = (flags & OOV_FLAG).bool() & real
    ambiguous = (flags & AMBIGUOUS_FLAG).bool() & real
    return {
        "n_words": real.sum(), "n_correct": correct.sum(),
        "n_oov": oov.sum(), "n_correct_oov": (correct & oov).sum(),
        "n_ambiguous": ambiguous.sum(), "n_correct_ambiguous": (correct & ambiguous).sum(),
    }


@register_criterion("pos_tagging")
class PosTaggingCriterion(FairseqCriterion):
    def __init__(self, task):
        super().__init__(task)
        self.padding_idx = task.target_dictionary.pad()

    def forward(self, model, sample, reduce: bool = True):
        logits = model(**sample["net_input"])
        target = sample["target"]
        lprobs = F.log_softmax(logits, dim=-1, dtype=torch.float32)
        loss = F.nll_loss(lprobs.view(-1, lprobs.size(-1)), target.view(-1),
                          ignore_index=self.padding_idx, reduction="sum" if reduce else "none")
        counts = tagging_counts(self.task.predict_tags(logits), target, sample["flags"], self.padding_idx)
        logging_output = {"loss": loss.data, "ntokens": sample["ntokens"],
                          "nsentences": sample["nsentences"], "sample_size": sample["ntokens"], **counts}
        return loss, sample["ntokens"], logging_output

    @staticmethod
    def reduce_metrics(logging_outputs: List[Dict]) -> None:
        def total(key: str) -> float:
            return utils.item(sum(log.get(key, 0) for log in logging_outputs))

        sample_size = total("sample_size")
        metrics.log_scalar("loss", total("loss") / max(sample_size, 1) / math.log(2), sample_size, round=3)
        for name, (count, correct) in COUNTS.items():
            n = total(count)
            if n > 0:
                metrics.log_scalar(name, 100.0 * total(correct) / n, n, round=2)

    @staticmethod
    def logging_outputs_can_be_summed() -> bool:
        return True
