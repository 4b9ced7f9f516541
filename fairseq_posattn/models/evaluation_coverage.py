"""``fairseq-eval-lm`` scores the whole split or stops: never a perplexity over part of it.

fairseq-eval-lm batches the split through the task's ``eval_lm_dataloader``, which drops every block
longer than the model's ``max_positions()`` with only a warning (``ignore_invalid_inputs=True``) and
then reports the perplexity of what is left: "Evaluated 0 tokens ... Perplexity: 1.00" when every
block is longer (``--tokens-per-sample`` above the training length), a perplexity over 81% of the
tokens with ``--sample-break-mode eos`` and long sentences. Our language models' ``build_model``
wraps that one method of the task they are built for (:func:`score_every_block`), so that such a
split stops the command before anything is scored, with the fix for this model: the
``--model-overrides`` that lets it read longer blocks, or the longest block it can read at all.
"""

import functools
from typing import Any, Callable, Optional

from fairseq_posattn.user_errors import UserError

#: the flag fairseq-eval-lm takes to raise a checkpoint's position limit
OVERRIDE = "--model-overrides \"{{'max_target_positions': {length}}}\""


class PartialEvaluationError(UserError, ValueError):
    """fairseq would score only part of the split."""


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
        check_coverage(getattr(dataset, "sizes", None), kwargs.get("max_positions"), fixed_limit)
        return original(*args, **kwargs)

    eval_lm_dataloader.checks_coverage = True  # type: ignore[attr-defined]
    task.eval_lm_dataloader = eval_lm_dataloader


def check_coverage(sizes: Any, max_positions: Any, fixed_limit: Optional[str]) -> None:
    """Raise :class:`PartialEvaluationError` when some of the blocks' ``sizes`` exceed ``max_positions``."""
    if sizes is None or not isinstance(max_positions, int) or len(sizes) == 0:
        return
    longer = int((sizes > max_positions).sum())
    if longer == 0:
        return
    longest = int(sizes.max())
    if fixed_limit is None:
        fix = (f"this model reads longer blocks once told: add {OVERRIDE.format(length=longest)} "
               f"(or lower --tokens-per-sample to {max_positions})")
    else:
        fix = (f"{fixed_limit} learned for {max_positions} positions, so it cannot read longer blocks: evaluate "
               f"with --tokens-per-sample {max_positions} or less (--context-window adds earlier context "
               f"within that limit) and --sample-break-mode none or complete")
    raise PartialEvaluationError(
        f"fairseq-eval-lm would skip {longer} of {len(sizes)} blocks longer than the model's {max_positions} "
        f"positions (the longest has {longest} tokens) and report the perplexity of the rest; {fix}")
