"""What every model family of the plugin shares: ``from_pretrained`` through :mod:`fairseq_posattn.hub`
(docs/hub.md), the check that a data directory is the checkpoint's own
(:mod:`fairseq_posattn.data.fingerprint`), the check of the heads' sizes, and the record of the options that make
the model's function (:mod:`fairseq_posattn.models.position_record`)."""

import functools
from typing import Any, Callable, Dict

from fairseq_posattn.data.fingerprint import check_data_fingerprint
from fairseq_posattn.models.position_record import record_model_options
from posattn.errors import UserError


class PosattnHubMixin:
    """Put first among a model's bases: its ``from_pretrained`` returns the interface of the checkpoint's
    family (fairseq's ``translate`` / ``sample`` / ``generate``; ``score`` / ``perplexity`` as
    fairseq-eval-lm scores; ``tag`` as posattn-tag tags; ``predict`` / ``probabilities`` of a sentence
    classifier). There are no published checkpoints, so
    ``hub_models`` is empty: the names fairseq's own architectures list would load fairseq's models.

    Every ``build_model`` a subclass defines first calls
    :func:`~fairseq_posattn.data.fingerprint.check_data_fingerprint` on its task: it records the task's
    dictionaries when a model is built for training and, when fairseq loads a checkpoint (it restores
    the checkpoint's task state before it builds the model), refuses a data directory whose
    dictionaries are not the ones the model was trained with. ``build_model`` is the one call of ours
    that every task makes, fairseq's own included, and so every tool that loads a checkpoint. The model it
    builds then records its options (:func:`~fairseq_posattn.models.position_record.record_model_options`),
    before any weights load into it: those of ``args``, or of ``model.built_from`` where ``build_model``
    built it from other ones.
    """

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "build_model" in vars(cls):
            cls.build_model = classmethod(_checked_and_recorded(vars(cls)["build_model"].__func__))

    @classmethod
    def hub_models(cls) -> Dict[str, str]:
        return {}

    @classmethod
    def from_pretrained(cls, model_name_or_path: str, checkpoint_file: str = "model.pt",
                        data_name_or_path: str = ".", **kwargs):
        from fairseq_posattn import hub  # the hub imports the tasks, which import the models

        return hub.from_pretrained(model_name_or_path, checkpoint_file, data_name_or_path,
                                   archive_map=cls.hub_models(), **kwargs)


class HeadSizeError(UserError, ValueError):
    """A side's width is not a multiple of its attention heads."""


def check_head_sizes(args: Any) -> None:
    """Refuse, in one line, a side whose ``--{side}-embed-dim`` its ``--{side}-attention-heads`` do not divide
    (fairseq's attention asserts it, with a traceback, once the model is half built)."""
    for side in ("encoder", "decoder"):
        width, heads = getattr(args, f"{side}_embed_dim", None), getattr(args, f"{side}_attention_heads", None)
        if isinstance(width, int) and isinstance(heads, int) and heads > 0 and width % heads:
            raise HeadSizeError(f"--{side}-embed-dim {width} is not a multiple of --{side}-attention-heads {heads}: "
                                f"each head takes an equal share of the width (e.g. --{side}-embed-dim "
                                f"{width - width % heads or heads})")


def _checked_and_recorded(build_model: Callable) -> Callable:
    """``build_model(cls, args, task)`` that checks (or records) the task's data fingerprint and the heads'
    sizes first, and records the options of the model it builds."""
    @functools.wraps(build_model)
    def checked(cls, args: Any, task: Any):
        check_data_fingerprint(task)
        check_head_sizes(args)
        model = build_model(cls, args, task)
        record_model_options(model, getattr(model, "built_from", args))
        return model
    return checked
