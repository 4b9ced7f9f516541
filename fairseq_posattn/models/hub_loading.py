"""``from_pretrained`` of every model family, through :mod:`fairseq_posattn.hub` (docs/hub.md)."""

from typing import Dict


class PosattnHubMixin:
    """Put first among a model's bases: its ``from_pretrained`` returns the interface of the checkpoint's
    family (fairseq's ``translate`` / ``sample`` / ``generate``; ``score`` / ``perplexity`` as
    fairseq-eval-lm scores; ``tag`` as posattn-tag tags; ``predict`` / ``probabilities`` of a sentence
    classifier). There are no published checkpoints, so
    ``hub_models`` is empty: the names fairseq's own architectures list would load fairseq's models."""

    @classmethod
    def hub_models(cls) -> Dict[str, str]:
        return {}

    @classmethod
    def from_pretrained(cls, model_name_or_path: str, checkpoint_file: str = "model.pt",
                        data_name_or_path: str = ".", **kwargs):
        from fairseq_posattn import hub  # the hub imports the tasks, which import the models

        return hub.from_pretrained(model_name_or_path, checkpoint_file, data_name_or_path,
                                   archive_map=cls.hub_models(), **kwargs)
