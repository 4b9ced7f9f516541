"""Pictures of an :class:`~fairseq_posattn.inspect.capture.Inspection` (matplotlib, Agg: headless).

Files written into the output directory, by kind (``{side}`` is ``encoder``, ``decoder`` or, for
attention maps, ``cross``; ``{l}`` the 0-based layer):

- ``attention``: ``{side}-layer{l}-attention.png``, a grid of heads, BPE pieces on both axes;
- a registered position method (its registered name): what its terms' ``inspect`` returns, drawn by layout
  (:mod:`posattn.position_terms.quantities`): ``{side}-layer{l}-{method}-{quantity}.png`` for a
  matrix (a heatmap per head: a position-position matrix, a scaling's coefficients, a transform's filters, the
  attention before and after a post-softmax transform), a curve (a line per head over ``i - j``) or a table
  (e.g. key and value embeddings per clipped distance), and ``{side}-{method}-per-head.png`` for the per-head
  scalars of every layer of the side, sorted (as Wu et al. 2021 Figures 6-7 show theirs); a term shared by the
  layers is drawn at its first layer;
- the side data of the source that a method shows (its ``BatchSideData.shown_as``, e.g. ``structure``):
  ``{kind}.png``, the method's trace of it (rows of integers per token over the sentence, and matrices over
  the token pairs, e.g. a parse's tree depths and relative tree positions beside the sequential ones);
- ``lstm``: ``lstm-positional-attention.png`` (mu and sigma per step, the Gaussian attention over
  the sentence).

Long sentences: panels grow with the sentence up to a cap, and an axis labels every k-th token so
that at most ``MAX_TICKS`` labels show.
"""

import math
import os
import textwrap
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.axes import Axes  # noqa: E402
from matplotlib.axis import Axis  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from fairseq_posattn.inspect.capture import AttentionMap, Inspection, TermQuantities  # noqa: E402
from posattn.position_terms.quantities import BARS, CURVE, MATRIX, TABLE, Quantity  # noqa: E402
from posattn.position_terms.registry import REGISTRY  # noqa: E402

FONT_SIZE = 8
MAX_TICKS = 40
MAX_COLUMNS = 4
PANEL_INCHES = (2.6, 7.0)
INCHES_PER_CELL = 0.15
ANNOTATE_CELLS = 32  # write the values into the cells of matrices up to this size
ANNOTATE_SMALL = 8  # the same, for learned quantities (filters, short sentences)
DPI = 100
CHARACTERS_PER_INCH = 12  # of a figure title: longer titles wrap
ATTENTION_CMAP = "viridis"
SIGNED_CMAP = "RdBu_r"
SIDE_TITLES = {"encoder": "encoder self-attention", "decoder": "decoder self-attention",
               "cross": "cross-attention"}


@dataclass
class Panel:
    """One heatmap: ``matrix`` (rows x columns) with its tick labels."""

    matrix: np.ndarray
    title: str
    rows: Sequence[str]
    columns: Sequence[str]


# ------------------------------------------------------------------------------------ helpers
def positions(n: int, start: int = 0) -> List[str]:
    return [str(i) for i in range(start, start + n)]


def panel_inches(cells: int) -> float:
    low, high = PANEL_INCHES
    return min(high, max(low, 1.0 + INCHES_PER_CELL * cells))


def label_axis(axis: Axis, labels: Sequence[str], rotation: int = 0) -> None:
    """Tick labels at every k-th cell, k such that at most ``MAX_TICKS`` show."""
    step = max(1, math.ceil(len(labels) / MAX_TICKS))
    ticks = list(range(0, len(labels), step))
    axis.set_ticks(ticks)
    axis.set_ticklabels([labels[i] for i in ticks], fontsize=FONT_SIZE, rotation=rotation)


def value_range(matrices: Sequence[np.ndarray], signed: bool) -> Tuple[float, float]:
    """Colour limits shared by ``matrices``: ``[-m, m]`` when ``signed``, else ``[min(0, lo), hi]``."""
    values = np.concatenate([m.ravel() for m in matrices])
    values = values[np.isfinite(values)]
    if signed:
        bound = max(float(np.abs(values).max(initial=0.0)), 1e-12)
        return -bound, bound
    high = max(float(values.max(initial=0.0)), 1e-12)
    return min(0.0, float(values.min(initial=0.0))), high


def draw_matrix(ax: Axes, panel: Panel, cmap: str, limits: Tuple[float, float], annotate: bool):
    """One heatmap on ``ax``; returns the image (for a colour bar)."""
    image = ax.imshow(panel.matrix, cmap=cmap, vmin=limits[0], vmax=limits[1], aspect="auto",
                      interpolation="nearest")
    ax.set_title(panel.title, fontsize=FONT_SIZE + 1)
    label_axis(ax.xaxis, panel.columns, rotation=90)
    label_axis(ax.yaxis, panel.rows)
    if annotate and max(panel.matrix.shape) <= ANNOTATE_CELLS:
        for (i, j), value in np.ndenumerate(panel.matrix):
            red, green, blue, _ = image.cmap(image.norm(value))
            dark = 0.299 * red + 0.587 * green + 0.114 * blue < 0.5
            ax.text(j, i, f"{value:.2g}", ha="center", va="center", fontsize=FONT_SIZE - 2,
                    color="white" if dark else "black")
    return image


def heatmap_grid(panels: Sequence[Panel], title: str, path: str, cmap: str = ATTENTION_CMAP,
                 signed: bool = False, annotate: bool = False, columns: Optional[int] = None,
                 row_scales: bool = False, xlabel: str = "", ylabel: str = "") -> None:
    """Panels in a grid, one colour scale (or one per grid row). ``columns`` defaults to a square
    grid of at most ``MAX_COLUMNS`` columns."""
    ncols = min(len(panels), columns or min(MAX_COLUMNS, math.ceil(math.sqrt(len(panels)))))
    nrows = math.ceil(len(panels) / ncols)
    size = panel_inches(max(max(p.matrix.shape) for p in panels))
    fig, axes = plt.subplots(nrows, ncols, figsize=(ncols * size + 1.2, nrows * size + 0.8),
                             squeeze=False, constrained_layout=True)
    for row in range(nrows):
        chunk = panels[row * ncols:(row + 1) * ncols]
        scaled = chunk if row_scales else panels
        limits = value_range([p.matrix for p in scaled], signed)
        for ax, panel in zip(axes[row], chunk):
            image = draw_matrix(ax, panel, cmap, limits, annotate)
        for ax in axes[row][len(chunk):]:
            ax.axis("off")
        if row_scales or row == nrows - 1:
            fig.colorbar(image, ax=axes[row] if row_scales else axes, shrink=0.8)
    for ax in axes[-1]:
        ax.set_xlabel(xlabel, fontsize=FONT_SIZE)
    for ax in axes[:, 0]:
        ax.set_ylabel(ylabel, fontsize=FONT_SIZE)
    fig.suptitle(textwrap.fill(title, int(CHARACTERS_PER_INCH * fig.get_figwidth())), fontsize=FONT_SIZE + 2)
    save(fig, path)


def sorted_bars(series: Dict[str, Tuple[List[str], np.ndarray]], title: str, path: str) -> None:
    """One bar chart per series, bars sorted from largest to smallest (Wu et al. 2021, Fig. 6-7) by the first
    series: every series of the same heads keeps that order, so that a head's bars line up panel under panel."""
    width = min(16.0, max(5.0, 0.3 * max(len(v) for _, v in series.values()) + 1.5))
    fig, axes = plt.subplots(len(series), 1, figsize=(width, 3.0 * len(series)), squeeze=False,
                             constrained_layout=True)
    orders = bar_orders(series)
    for ax, (name, (labels, values)) in zip(axes[:, 0], series.items()):
        order = orders[name]
        ax.bar(range(len(values)), values[order], color=np.where(values[order] >= 0, "tab:blue", "tab:red"))
        ax.set_xticks(range(len(values)))
        ax.set_xticklabels([labels[i] for i in order], rotation=90, fontsize=FONT_SIZE)
        ax.axhline(0.0, color="black", linewidth=0.6)
        ax.set_title(name, fontsize=FONT_SIZE + 1)
        ax.tick_params(axis="y", labelsize=FONT_SIZE)
    fig.suptitle(title, fontsize=FONT_SIZE + 2)
    save(fig, path)


def bar_orders(series: Dict[str, Tuple[List[str], np.ndarray]]) -> Dict[str, np.ndarray]:
    """Each series' bar order: the first series' values from largest to smallest, for every series of the same
    heads (its labels); a series of other heads by its own values."""
    first_labels, first_values = next(iter(series.values()))
    first_order = np.argsort(-first_values, kind="stable")
    return {name: first_order if labels == first_labels else np.argsort(-values, kind="stable")
            for name, (labels, values) in series.items()}


def save(fig: Figure, path: str) -> None:
    fig.savefig(path, dpi=DPI)
    plt.close(fig)


# ------------------------------------------------------------------------------------ kinds
def draw_attention(inspection: Inspection, out: str) -> List[str]:
    paths = []
    for m in inspection.attention:
        rows, columns = attention_labels(inspection, m)
        panels = [Panel(m.probs[h].numpy(), f"head {h}", rows, columns) for h in range(m.probs.size(0))]
        path = os.path.join(out, f"{m.side}-layer{m.layer}-attention.png")
        heatmap_grid(panels, f"{SIDE_TITLES[m.side]}, layer {m.layer}", path, xlabel="key", ylabel="query")
        paths.append(path)
    return paths


def attention_labels(inspection: Inspection, m: AttentionMap) -> Tuple[List[str], List[str]]:
    """Query and key tokens: decoder input tokens on a decoder query axis, source tokens elsewhere."""
    queries = inspection.tokens("encoder" if m.side == "encoder" else "decoder")
    keys = inspection.tokens("decoder" if m.side == "decoder" else "encoder")
    return queries, keys


def draw_method(inspection: Inspection, method: str, out: str) -> List[str]:
    """What the terms of a registered method show: a file per quantity and layer, and one per side
    for the per-head scalars (every layer's heads together)."""
    entries = [t for t in inspection.terms if t.method == method]
    citation = REGISTRY[method].citation
    cited = f"{method} ({citation})" if citation else method
    paths = []
    for t in entries:
        where, named = (f"{t.side} layer {t.layer}", f"{t.side}-layer{t.layer}") if t.layer is not None else (
            f"{t.side}, every layer", t.side)
        for q in t.quantities:
            if q.layout != BARS:
                path = os.path.join(out, f"{named}-{method}-{q.name}.png")
                LAYOUT_DRAWERS[q.layout](q, f"{cited}, {where}: {q.title}", path)
                paths.append(path)
    for side, series in per_head_series(entries).items():
        path = os.path.join(out, f"{side}-{method}-per-head.png")
        first = next(iter(series))
        sorted_bars(series, f"{cited}, {side}: per head, sorted by {first}", path)
        paths.append(path)
    return paths


def per_head_series(entries: Sequence[TermQuantities]) -> Dict[str, Dict[str, Tuple[List[str], np.ndarray]]]:
    """Per side, each per-head quantity of every layer as one series labelled ``L{layer}H{head}`` (``H{head}``: one
    the side's layers share)."""
    sides: Dict[str, Dict[str, Tuple[List[str], List[float]]]] = {}
    for t in entries:
        layer = "" if t.layer is None else f"L{t.layer}"
        for q in (q for q in t.quantities if q.layout == BARS):
            labels, values = sides.setdefault(t.side, {}).setdefault(q.title, ([], []))
            labels += [f"{layer}H{h}" for h in range(q.values.numel())]
            values += q.values.float().tolist()
    return {side: {name: (labels, np.array(values)) for name, (labels, values) in series.items()}
            for side, series in sides.items()}


def tick_labels(q: Quantity, axis: int, size: int) -> List[str]:
    """Labels of the ``axis``-th axis of ``q`` (its ``ticks``, else 0 .. size - 1)."""
    return [str(tick) for tick in q.ticks[axis]] if len(q.ticks) > axis else positions(size)


def colours(q: Quantity) -> Dict[str, Any]:
    return {"cmap": SIGNED_CMAP if q.signed else ATTENTION_CMAP, "signed": q.signed}


def draw_matrix_quantity(q: Quantity, title: str, path: str) -> None:
    """Heads x rows x columns: a heatmap per head on one colour scale. Heads x panels x rows x
    columns: a grid row per panel (each on its own colour scale), a column per head."""
    values = q.values.float().numpy()
    rows, columns = (tick_labels(q, axis, size) for axis, size in enumerate(values.shape[-2:]))
    small = max(values.shape[-2:]) <= ANNOTATE_SMALL
    axes = {"ylabel": q.axes[0], "xlabel": q.axes[1]}
    if values.ndim == 3:
        panels = [Panel(m, f"head {h}", rows, columns) for h, m in enumerate(values)]
        heatmap_grid(panels, title, path, annotate=small, **colours(q), **axes)
        return
    heads = values.shape[0]
    panels = [Panel(values[h, p], f"head {h}, {name}", rows, columns)
              for p, name in enumerate(q.panels) for h in range(heads)]
    heatmap_grid(panels, title, path, annotate=small, columns=heads, row_scales=True, **colours(q), **axes)


def draw_curve(q: Quantity, title: str, path: str) -> None:
    """Heads x points: one curve per head over ``ticks[0]``."""
    points, values = list(q.ticks[0]), q.values.float().numpy()
    fig, ax = plt.subplots(figsize=(min(12.0, max(5.0, 0.12 * len(points) + 3.0)), 3.8),
                           constrained_layout=True)
    for h, row in enumerate(values):
        ax.plot(points, row, marker="o", markersize=2.5, linewidth=1.0, label=f"head {h}")
    ax.axhline(0.0, color="black", linewidth=0.6)
    if min(points) <= 0 <= max(points):
        ax.axvline(0.0, color="grey", linewidth=0.6, linestyle=":")
    ax.set_xlabel(q.axes[0], fontsize=FONT_SIZE)
    ax.set_ylabel(q.axes[1], fontsize=FONT_SIZE)
    ax.tick_params(labelsize=FONT_SIZE)
    if len(values) > 1:
        ax.legend(fontsize=FONT_SIZE, ncol=min(4, len(values)))
    ax.set_title(title, fontsize=FONT_SIZE + 2)
    save(fig, path)


def draw_table(q: Quantity, title: str, path: str) -> None:
    """Rows x columns: one heatmap."""
    values = q.values.float().numpy()
    rows, columns = (tick_labels(q, axis, size) for axis, size in enumerate(values.shape))
    heatmap_grid([Panel(values, q.name, rows, columns)], title, path, ylabel=q.axes[0], xlabel=q.axes[1],
                 annotate=max(values.shape) <= ANNOTATE_SMALL, **colours(q))


LAYOUT_DRAWERS: Dict[str, Callable[[Quantity, str, str], None]] = {
    MATRIX: draw_matrix_quantity,
    CURVE: draw_curve,
    TABLE: draw_table,
}


def draw_side_data(inspection: Inspection, kind: str, out: str) -> List[str]:
    """``{kind}.png``: a method's trace of the source's side data, its rows of integers under the tokens and its
    matrices over the token pairs side by side."""
    trace = inspection.side_data[kind]
    tokens = inspection.source_tokens
    size = panel_inches(len(tokens))
    columns = max(1, len(trace.matrices))
    fig = plt.figure(figsize=(columns * size + 2.0, size + 2.2), constrained_layout=True)
    grid = fig.add_gridspec(2, columns, height_ratios=[1, 5])
    position_strip(fig.add_subplot(grid[0, :]), tokens, {name: row.numpy() for name, row in trace.rows.items()})
    for column, (title, matrix) in enumerate(trace.matrices.items()):
        panel = Panel(matrix.numpy(), title, tokens, tokens)
        ax = fig.add_subplot(grid[1, column])
        image = draw_matrix(ax, panel, SIGNED_CMAP, value_range([panel.matrix], signed=True), annotate=True)
        fig.colorbar(image, ax=ax, shrink=0.8)
    fig.suptitle(trace.title, fontsize=FONT_SIZE + 2)
    path = os.path.join(out, f"{kind}.png")
    save(fig, path)
    return [path]


def position_strip(ax: Axes, tokens: Sequence[str], rows: Dict[str, np.ndarray]) -> None:
    """One row of integers per name under the tokens, each row coloured on its own scale."""
    values = np.stack(list(rows.values()))
    shade = values / np.maximum(values.max(axis=1, keepdims=True), 1)
    ax.imshow(shade, cmap="Greens", vmin=0, vmax=1.6, aspect="auto", interpolation="nearest")
    label_axis(ax.xaxis, tokens, rotation=90)
    label_axis(ax.yaxis, list(rows))
    if len(tokens) <= 2 * ANNOTATE_CELLS:
        for (i, j), value in np.ndenumerate(values):
            ax.text(j, i, str(int(value)), ha="center", va="center", fontsize=FONT_SIZE - 1)
    ax.set_title("absolute positions", fontsize=FONT_SIZE + 1)


def draw_lstm(inspection: Inspection, out: str) -> List[str]:
    trace = inspection.lstm
    tokens, n = trace.tokens, len(trace.tokens)
    centre = trace.mu.numpy() * trace.normalizer - 1  # 0-based memory column of mu (state i at i / N)
    spread = trace.sigma.numpy() * trace.normalizer
    steps = np.arange(n)
    size = panel_inches(n)
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(size + 2.0, 2.6 + size), constrained_layout=True,
                                      gridspec_kw={"height_ratios": [1, 3]})
    top.plot(steps, centre, marker="o", markersize=3, label="mu (memory position)")
    top.fill_between(steps, centre - spread, centre + spread, alpha=0.25, label="mu +- sigma")
    top.plot(steps, steps - 1, color="grey", linestyle=":", label="last visible state")
    top.set_xlim(-0.5, n - 0.5)
    label_axis(top.xaxis, tokens, rotation=90)
    top.tick_params(axis="y", labelsize=FONT_SIZE)
    top.legend(fontsize=FONT_SIZE - 1)
    top.set_title(f"mu and sigma per step (positions in tokens, N = {trace.normalizer:g})", fontsize=FONT_SIZE + 1)
    weights = trace.weights.numpy()
    image = draw_matrix(bottom, Panel(weights, "Gaussian attention over the earlier states", tokens, tokens),
                        ATTENTION_CMAP, value_range([weights], False), annotate=False)
    bottom.errorbar(centre, steps, xerr=spread, fmt="o", color="white", markersize=2.5, linewidth=0.8)
    bottom.set_xlim(-0.5, n - 0.5)
    bottom.set_ylim(n - 0.5, -0.5)
    bottom.set_xlabel("memory state (after reading this token)", fontsize=FONT_SIZE)
    bottom.set_ylabel("step (input token)", fontsize=FONT_SIZE)
    fig.colorbar(image, ax=bottom, shrink=0.8)
    path = os.path.join(out, "lstm-positional-attention.png")
    save(fig, path)
    return [path]


GENERIC_DRAWERS: Dict[str, Callable[[Inspection, str], List[str]]] = {
    "attention": draw_attention,
    "lstm": draw_lstm,
}


def draw(inspection: Inspection, kinds: Sequence[str], out: str) -> List[str]:
    """Write the PNGs of ``kinds`` into ``out`` (created if needed); return their paths."""
    os.makedirs(out, exist_ok=True)
    paths: List[str] = []
    for kind in kinds:
        drawer = GENERIC_DRAWERS.get(kind)
        if drawer is not None:
            paths += drawer(inspection, out)
        elif kind in inspection.side_data:
            paths += draw_side_data(inspection, kind, out)
        else:
            paths += draw_method(inspection, kind, out)
    return paths
