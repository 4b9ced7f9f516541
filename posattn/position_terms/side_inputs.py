"""What a method reads from a batch beside its tokens, and what it adds to a side's input.

A method whose terms need per-token data that the tokens do not hold (a parse's tree depths, a segmentation,
document boundaries) declares it as a :class:`BatchSideData`: the ``net_input`` key under which a task collates
it, the names of its rows, the task that collates it, and how to make it up for an example batch. A front-end's
side (the fairseq plugin's ``PositionSide``) checks that the task collates it when the model is
built, unpacks it into the batch's context (``ctx.side_data``, one ``(batch, length)`` tensor per row name) and
refuses a batch without it or of another shape, in one line naming the method and the task; the method derives
what it needs from the rows with its own :class:`~posattn.position_context.Preparation`.

A method may also give the side's input a position embedding of its own (:class:`InputPositionEmbedding`),
which replaces the sequential one (e.g. a fusion of the sequential embedding with one of the side data).
"""

from dataclasses import dataclass
from typing import Callable, Dict, Optional, Tuple

import torch
from torch import Tensor, nn

from posattn.position_context import PositionContext
from posattn.errors import UserError


class SideDataError(UserError, ValueError):
    """A batch without the side data its model's position terms read, or with side data of another shape."""


@dataclass(frozen=True)
class BatchSideData:
    """Per-token data that a method reads from every batch, collated by a task (module docstring).

    Attributes:
        key: the ``net_input`` key of the collated tensor, ``(batch, len(fields), length)``, padded as the
            tokens are (the model's ``forward`` receives it as a keyword argument).
        fields: the names of its rows, in order; the context holds each as ``(batch, length)`` long.
        what: what it is, for errors ("each source sentence's dependency parse").
        task: the task that collates it ("--task translation_structural").
        example: ``padding_mask (batch, length) -> {field: (batch, length) long}``: data made up for a batch
            padded as ``padding_mask`` (the kernel self-check's, the tests' and the benchmark's batches).
        shown_as: the ``posattn-inspect`` kind (and file name) under which its method's trace of a sentence's
            data is drawn (``PositionMethod.trace_side_data``); "" where it is not shown.
    """

    key: str
    fields: Tuple[str, ...]
    what: str
    task: str
    example: Callable[[Tensor], Dict[str, Tensor]]
    shown_as: str = ""

    def unpack(self, collated: Optional[Tensor], tokens: Tensor, asked_by: str,
               batch: str = "batch") -> Dict[str, Tensor]:
        """The rows of ``collated`` by name, after checking it matches ``tokens`` ``(batch, length)``.
        ``asked_by`` names the option that needs it and ``batch`` the tokens ("source batch"), for the errors."""
        if collated is None:
            raise SideDataError(f"{asked_by} needs {self.what}: train, generate and translate with {self.task}")
        expected = (tokens.size(0), len(self.fields), tokens.size(1))
        if tuple(collated.shape) != expected:
            raise SideDataError(
                f"the batch's {self.key} has shape {tuple(collated.shape)}, which does not match the {batch} "
                f"{tuple(tokens.shape)} (expected {expected}): {asked_by} reads {self.what} of every token; "
                f"prepare the side data from the same text that fairseq-preprocess binarized")
        return dict(zip(self.fields, collated.long().unbind(dim=1)))

    def collate(self, padding_mask: Tensor) -> Tensor:
        """``(batch, len(fields), length)``: :attr:`example` data of a batch padded as ``padding_mask``, collated
        as a task collates it (the tests' and the benchmark's batches)."""
        rows = self.example(padding_mask)
        return torch.stack([rows[name] for name in self.fields], dim=1)


class InputPositionEmbedding(nn.Module):
    """The position embedding of a side's input, in place of its sequential one.

    ``forward(ctx, sequential)``: ``ctx`` the batch's context (its side data included), ``sequential`` the
    side's sequential position embedding ``(batch, length, dim)`` or None where the side has none; returns the
    ``(batch, length, dim)`` embedding added to the scaled token embeddings.
    """

    #: names this module was saved under on a side in older checkpoints (the side renames their keys on load)
    legacy_names: Tuple[str, ...] = ()

    def forward(self, ctx: PositionContext, sequential: Optional[Tensor]) -> Tensor:
        raise NotImplementedError
