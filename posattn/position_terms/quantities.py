"""What ``posattn-inspect`` shows of a term: its learned quantities as named arrays, each in one of a few
generic layouts (a term's ``inspect(positions)`` returns them; a front-end's inspection draws them); and
what it shows of the side data a sentence carries for a method (:class:`SideDataTrace`, from the method's
``trace_side_data``)."""

from dataclasses import dataclass
from typing import Any, Dict, Sequence, Tuple

from torch import Tensor

#: layouts of a :class:`Quantity`, i.e. the shape of its ``values`` and how they are drawn
MATRIX = "matrix"  # heads x rows x columns (or heads x panels x rows x columns): heatmaps per head
CURVE = "curve"  # heads x points: one curve per head over a named axis (e.g. i - j)
BARS = "bars"  # heads: one scalar per head, shown with the other layers' heads of the side
TABLE = "table"  # rows x columns: one heatmap (e.g. bucket x dimension)
LAYOUTS = (MATRIX, CURVE, BARS, TABLE)


@dataclass(frozen=True)
class Quantity:
    """A learned quantity of a term, as ``posattn-inspect`` shows it (``values`` on the CPU).

    ``axes`` names the axes: (rows, columns) of a matrix or table, (points, values) of a curve.
    ``ticks`` labels them: (row labels, column labels) of a matrix or table (default: 0, 1, ...),
    (the points,) of a curve. ``panels`` names the second axis of a 4-d matrix (e.g. filter taps).
    ``signed`` values are drawn on a colour scale symmetric around 0.
    """

    name: str
    values: Tensor
    layout: str
    title: str
    axes: Tuple[str, str] = ("query position i", "key position j")
    ticks: Tuple[Sequence[Any], ...] = ()
    panels: Tuple[str, ...] = ()
    signed: bool = True

    def __post_init__(self) -> None:
        if self.layout not in LAYOUTS:
            raise ValueError(f"quantity {self.name!r} has layout {self.layout!r}, not one of {LAYOUTS}")


@dataclass(frozen=True)
class SideDataTrace:
    """What ``posattn-inspect`` shows of one sentence's side data for a method, as the method traces it.

    ``rows``: integers per token ``(length,)``, drawn as a strip under the tokens; ``matrices``: a title per
    ``(length, length)`` matrix over the token pairs, drawn side by side (signed colours); ``title``: the
    figure's; ``record``: the numbers written as JSON (plain lists), next to the tokens.
    """

    title: str
    rows: Dict[str, Tensor]
    matrices: Dict[str, Tensor]
    record: Dict[str, Any]
