"""``fairseq-eval-lm`` scores the whole split or stops: never a perplexity over part of it.

fairseq-eval-lm batches the split through the task's ``eval_lm_dataloader``, which drops every block
longer than the model's ``max_positions()`` with only a warning (``ignore_invalid_inputs=True``) and
then reports the perplexity of what is left: "Evaluated 0 tokens ... Perplexity: 1.00" when every
block is longer (``--tokens-per-sample`` above the training length), a perplexity over 81% of the
tokens with ``--sample-break-mode eos`` and long sentences. Our language models' ``build_model``
wraps that one method of the task they are built for (:func:`score_every_block`), so that such a
split stops the command before anything is scored, with the fix for this model: the
``--model-overrides`` that lets it read longer blocks, or the longest block it can read at all.

With ``--context-window C`` fairseq gives each block up to C earlier tokens, so the model reads the
block *and* its context; fairseq checks the blocks alone. A sliding window beyond the model's positions
(``--tokens-per-sample L --context-window L-1``, blocks of one token) then reaches the model untested:
an index error for learned position embeddings, an error at the first batch for the direct interactions.
The check counts the context too (:func:`model_input_lengths`).

The hub's ``score`` (:mod:`fairseq_posattn.hub`) makes the same check before it scores anything
(:func:`check_hub_lengths`): fairseq would raise its generic "invalid size" exception instead.
"""

import functools
from typing import Any, Callable, Optional

import numpy as np

from posattn.errors import UserError

#: the flag fairseq-eval-lm takes to raise a checkpoint's position limit
OVERRIDE = "--model-overrides \"{{'max_target_positions': {length}}}\""


class PartialEvaluationError(UserError, ValueError):
    """fairseq would score only part of the split."""


class BeyondPositionsError(UserError, ValueError):
    """The hub was asked to score sequences longer than the model's positions."""


def score_every_block(task: Any, fixed_limit: Optional[str]) -> None:
    """Make ``task.eval_lm_dataloader`` refuse a split with blocks beyond the model's positions.

    ``fixed_limit``: None where the model reads any length once its ``max_target_positions`` is raised
    (the refusal then names the override); otherwise what ties it to its positions (learned position
    embeddings, the direct absolute matrix...), named in the refusal instead."""
    original: Optional[Callable[..., Any]] = getattr(task, "eval_lm_dataloader", None)
    if original is None or getattr(original, "checks_coverage", False):
        return

    @functools.wraps(original)
    def eval_lm_dataloader(*args: Any, **kwargs: Any) -> Any:
        dataset = kwargs.get("dataset", args[0] if args else None)
        task_cfg = getattr(task, "args", None) or getattr(task, "cfg", None)
        check_coverage(getattr(dataset, "sizes", None), kwargs.get("max_positions"), fixed_limit,
                       context_window=kwargs.get("context_window") or 0,
                       break_mode=str(getattr(task_cfg, "sample_break_mode", "none")))
        return original(*args, **kwargs)

    eval_lm_dataloader.checks_coverage = True  # type: ignore[attr-defined]
    task.eval_lm_dataloader = eval_lm_dataloader


def model_input_lengths(sizes: Any, context_window: int = 0) -> np.ndarray:
    """What the model reads for each block of ``sizes`` (in order) under ``--context-window``: the block
    and the up to ``context_window`` tokens before it (fairseq's ``LMContextWindowDataset``)."""
    sizes = np.asarray(sizes, dtype=np.int64)
    if context_window <= 0 or len(sizes) == 0:
        return sizes
    before = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    return sizes + np.minimum(before, context_window)


def check_coverage(sizes: Any, max_positions: Any, fixed_limit: Optional[str], context_window: int = 0,
                   break_mode: str = "none") -> None:
    """Raise :class:`PartialEvaluationError` when some of the blocks' ``sizes`` (with their
    ``context_window`` earlier tokens) exceed ``max_positions``; ``break_mode`` is fairseq-eval-lm's
    ``--sample-break-mode``, whose blocks of whole sentences (``eos``, ``complete``) a long sentence exceeds
    whatever ``--tokens-per-sample`` says."""
    if sizes is None or not isinstance(max_positions, int) or len(sizes) == 0:
        return
    lengths = model_input_lengths(sizes, context_window)
    longer = int((lengths > max_positions).sum())
    if longer == 0:
        return
    longest = int(lengths.max())
    whole_sentences = ("" if break_mode == "none" else
                       " with --sample-break-mode none: blocks of whole sentences are as long as their sentences")
    if fixed_limit is None:
        fix = (f"this model reads longer blocks once told: add {OVERRIDE.format(length=longest)} "
               f"(or give --tokens-per-sample {max_positions}{whole_sentences})")
    else:
        fix = (f"its parameters are tied to its {max_positions} positions by {fixed_limit}, so it cannot read "
               f"longer blocks: evaluate "
               f"with --tokens-per-sample {max_positions} or less (--context-window adds earlier context "
               f"within that limit){whole_sentences}")
    if context_window > 0:
        what = (f"fairseq-eval-lm would give the model {longer} of {len(sizes)} blocks that, with their "
                f"--context-window {context_window} earlier tokens, are longer than its {max_positions} positions "
                f"(the longest reads {longest} tokens)")
    else:
        what = (f"fairseq-eval-lm would skip {longer} of {len(sizes)} blocks longer than the model's {max_positions} "
                f"positions (the longest has {longest} tokens) and report the perplexity of the rest")
    raise PartialEvaluationError(f"{what}; {fix}")


def check_hub_lengths(lengths: Any, max_positions: Any, fixed_limit: Optional[str], context_window: int = 0) -> None:
    """Raise :class:`BeyondPositionsError` (one line) when the hub would give the model sequences of
    ``lengths`` longer than its ``max_positions``: the keyword that lets it read them, or, for a model tied
    to its positions, what ties it."""
    lengths = np.asarray(lengths, dtype=np.int64)
    if not isinstance(max_positions, int) or len(lengths) == 0 or int(lengths.max()) <= max_positions:
        return
    longer, longest = int((lengths > max_positions).sum()), int(lengths.max())
    if fixed_limit is None:
        fix = (f"this model reads longer sequences once told: load it with from_pretrained(..., "
               f"max_target_positions={longest})")
    else:
        fix = (f"its parameters are tied to its {max_positions} positions by {fixed_limit}, so it cannot read "
               f"longer sequences: score at most {max_positions} tokens at a time (tokens_per_sample="
               f"{max_positions} or less)")
    what = "sequences" if context_window <= 0 else f"blocks (with up to {context_window} tokens of context)"
    raise BeyondPositionsError(
        f"the model would read {longer} of {len(lengths)} {what} longer than its {max_positions} positions "
        f"(the longest has {longest} tokens); {fix}")
