"""Does a data directory belong to a checkpoint? The dictionaries' fingerprint, recorded in training and
compared on every load.

A model's embedding rows and output columns mean the symbols of the dictionaries it was trained with,
in their order. A data directory whose dictionaries hold the same number of symbols in another order
(``posattn-prepare-tagging`` of the same sentences in another order swaps tags of equal counts) loads
without complaint and reads and writes other symbols; one with other sizes fails deep inside PyTorch
(``size mismatch``). The fingerprint is each dictionary file's symbols, in order, by file name
relative to the data directory (``dict.tags.txt``, ``dict.en.txt``, ``label/dict.txt``, ...), and the
training data directory; :func:`check_data_fingerprint` records it when a model is built for training
and, when a checkpoint is loaded, refuses a data directory whose dictionaries differ. The symbols
themselves rather than a hash of them: the error can then name the first difference, and they are not
part of the logged config. (The structural side data has no format version to record: its three rows
are fixed, :mod:`fairseq_posattn.structure.side_data`, and its sizes are checked when a split loads.)

**Where it is kept: the task's state** (``task.state``, fairseq's :class:`StatefulContainer`), which
fairseq saves in every checkpoint (``task_state``) and restores, in
``checkpoint_utils.load_model_ensemble_and_task``, *before* it builds the model, for every tool that
loads a checkpoint: fairseq-generate, -interactive, -eval-lm, -validate, the hub (``from_pretrained``)
and posattn-tag. The model args would not do: fairseq rebuilds a hydra model's config from its
dataclass on load and drops every key the dataclass lacks (``merge_with_parent(remove_missing=True)``),
so ``transformer_lm_posattn`` checkpoints would lose it. **Where it is checked: every plug-in model's
``build_model``** (:class:`~fairseq_posattn.models.hub_loading.PosattnHubMixin` wraps it), the one
call of ours that every task, fairseq's included, makes with both the task and, when loading, the
checkpoint's state; it comes before the weights are loaded, so a size mismatch is reported here too.
Checkpoints from before the fingerprint (an empty ``task_state``) load as before, unchecked: at
``build_model`` a load cannot be told from a new training run.
"""

import os
from typing import Any, Dict, List, Optional

from fairseq import utils
from fairseq.data import Dictionary
from fairseq.tasks.language_modeling import LanguageModelingTask
from fairseq.tasks.sentence_prediction import SentencePredictionTask
from fairseq.tasks.translation import TranslationTask

from posattn.errors import UserError

#: key of the fingerprint in the task's state (and so in a checkpoint's ``task_state``)
STATE_KEY = "posattn_data_fingerprint"


class DataMismatchError(UserError, ValueError):
    """A data directory whose dictionaries are not those a checkpoint was trained with."""

    def __init__(self, detail: str, checkpoint: str = "the checkpoint"):
        super().__init__(f"{checkpoint} was trained with other dictionaries: {detail}")
        self.detail = detail

    def naming(self, checkpoint: str) -> "DataMismatchError":
        """The same error, naming the checkpoint file (the tools that know it)."""
        return DataMismatchError(self.detail, checkpoint)


def task_dictionaries(task: Any) -> Dict[str, Dictionary]:
    """The dictionaries a model of ``task`` depends on, by file name relative to the data directory;
    empty for a task of unknown layout (nothing is then recorded or checked)."""
    own = getattr(task, "dictionary_files", None)
    if own is not None:
        return own()
    if isinstance(task, TranslationTask):
        cfg = task.cfg
        return {f"dict.{cfg.source_lang}.txt": task.src_dict, f"dict.{cfg.target_lang}.txt": task.tgt_dict}
    if isinstance(task, LanguageModelingTask):
        return {"dict.txt": task.dictionary}
    if isinstance(task, SentencePredictionTask):
        found = {os.path.join("input0", "dict.txt"): task.source_dictionary}
        if task.label_dictionary is not None:
            found[os.path.join("label", "dict.txt")] = task.label_dictionary
        return found
    return {}


def data_dir(task: Any) -> str:
    """The task's data directory (the first of a ``:``-separated list), where its dictionaries lie."""
    cfg = getattr(task, "cfg", None) or getattr(task, "args", None)
    paths = utils.split_paths(getattr(cfg, "data", "") or "")
    return paths[0] if paths else ""


def fingerprint(task: Any) -> Optional[Dict[str, Any]]:
    """The training data directory and each dictionary's symbols in order; None without dictionaries."""
    dictionaries = task_dictionaries(task)
    if not dictionaries:
        return None
    return {"data": os.path.abspath(data_dir(task)),
            "dictionaries": {name: list(d.symbols) for name, d in dictionaries.items()}}


def check_data_fingerprint(task: Any) -> None:
    """Record ``task``'s fingerprint in its state if none is there (training, or a checkpoint without
    one); raise :class:`DataMismatchError` if the state holds a checkpoint's that differs."""
    state = getattr(task, "state", None)
    current = fingerprint(task) if state is not None else None
    if current is None:
        return
    recorded = state.state_dict.get(STATE_KEY)
    if recorded is None:
        state.merge_state_dict({STATE_KEY: current})
        return
    differences = [_difference(os.path.join(data_dir(task), name), symbols, os.path.join(recorded["data"], name),
                               recorded["dictionaries"][name])
                   for name, symbols in current["dictionaries"].items()
                   if recorded["dictionaries"].get(name, symbols) != symbols]
    if differences:
        raise DataMismatchError("; ".join(differences) + ". The model's weights stand for the training data's "
                                f"symbols: use the data dir the model was trained with ({recorded['data']}), or "
                                "one prepared from the same files in the same way")


def _difference(path: str, symbols: List[str], trained_path: str, trained: List[str]) -> str:
    """Where ``symbols`` (of ``path``) first differ from the ``trained`` ones (of ``trained_path``)."""
    if len(symbols) != len(trained):
        return f"{path} holds {len(symbols)} symbols, the training data's {trained_path} held {len(trained)}"
    index = next(i for i, (a, b) in enumerate(zip(symbols, trained)) if a != b)
    return (f"{path} has {symbols[index]!r} at index {index} where the training data's {trained_path} had "
            f"{trained[index]!r} ({len(symbols)} symbols in both)")
