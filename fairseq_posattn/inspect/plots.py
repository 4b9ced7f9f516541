"""Pictures of an :class:`~fairseq_posattn.inspect.capture.Inspection` (matplotlib, Agg: headless).

Files written into the output directory, by kind (``{side}`` is ``encoder``, ``decoder`` or, for
attention maps, ``cross``; ``{l}`` the 0-based layer):

- ``attention``: ``{side}-layer{l}-attention.png``, a grid of heads, BPE pieces on both axes;
- ``direct``: ``{side}-layer{l}-direct-absolute.png`` (``A^p`` per head) and
  ``{side}-layer{l}-direct-relative.png`` (``a^r`` per head over ``i - j``);
- ``temperature``: ``{side}-temperature.png`` (gamma_q, gamma_k, gamma_v per layer and head);
- ``distance-aware``: ``{side}-distance-aware-w-v.png`` (w and v of every head, sorted, as Wu et al.
  2021 Figures 6-7) and ``{side}-layer{l}-distance-aware-coefficients.png`` (the re-scaled
  coefficient matrix ``Rhat`` per head);
- ``conv``: ``{side}-layer{l}-conv-filters.png`` and ``{side}-layer{l}-conv-before-after.png``
  (S before and the attention after the convolution, per head);
- ``relative-embeddings``: ``{side}-layer{l}-{sequential,structural}-relative-embeddings.png``
  (the key and value tables over the clipped distance);
- ``structure``: ``structure.png`` (sequential positions and tree depths per token, the sequential
  and the structural relative position matrices, as Wang et al. 2019 Figure 1);
- ``lstm``: ``lstm-positional-attention.png`` (mu and sigma per step, the Gaussian attention over
  the sentence).

Long sentences: panels grow with the sentence up to a cap, and an axis labels every k-th token so
that at most ``MAX_TICKS`` labels show.
"""

import math
import os
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.axes import Axes  # noqa: E402
from matplotlib.axis import Axis  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from fairseq_posattn.inspect.capture import AttentionMap, Inspection, LayerTerms, RelativeTable  # noqa: E402

FONT_SIZE = 8
MAX_TICKS = 40
MAX_COLUMNS = 4
PANEL_INCHES = (2.6, 7.0)
INCHES_PER_CELL = 0.15
ANNOTATE_CELLS = 32  # write the values into the cells of matrices up to this size
DPI = 100
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
    fig.suptitle(title, fontsize=FONT_SIZE + 2)
    save(fig, path)


def sorted_bars(series: Dict[str, Tuple[List[str], np.ndarray]], title: str, path: str) -> None:
    """One bar chart per series, bars sorted from largest to smallest (Wu et al. 2021, Fig. 6-7)."""
    width = min(16.0, max(5.0, 0.3 * max(len(v) for _, v in series.values()) + 1.5))
    fig, axes = plt.subplots(len(series), 1, figsize=(width, 3.0 * len(series)), squeeze=False,
                             constrained_layout=True)
    for ax, (name, (labels, values)) in zip(axes[:, 0], series.items()):
        order = np.argsort(-values, kind="stable")
        ax.bar(range(len(values)), values[order], color=np.where(values[order] >= 0, "tab:blue", "tab:red"))
        ax.set_xticks(range(len(values)))
        ax.set_xticklabels([labels[i] for i in order], rotation=90, fontsize=FONT_SIZE)
        ax.axhline(0.0, color="black", linewidth=0.6)
        ax.set_title(name, fontsize=FONT_SIZE + 1)
        ax.tick_params(axis="y", labelsize=FONT_SIZE)
    fig.suptitle(title, fontsize=FONT_SIZE + 2)
    save(fig, path)


def grouped_bars(labels: List[str], groups: Dict[str, np.ndarray], title: str, path: str) -> None:
    width = 0.8 / len(groups)
    fig, ax = plt.subplots(figsize=(min(16.0, max(4.0, 0.45 * len(labels) + 1.5)), 3.6),
                           constrained_layout=True)
    for k, (name, values) in enumerate(groups.items()):
        ax.bar(np.arange(len(labels)) + (k - (len(groups) - 1) / 2) * width, values, width, label=name)
    ax.set_xticks(range(len(labels)))
    ax.set_xticklabels(labels, rotation=90, fontsize=FONT_SIZE)
    ax.tick_params(axis="y", labelsize=FONT_SIZE)
    ax.legend(fontsize=FONT_SIZE, ncol=len(groups), loc="lower center", bbox_to_anchor=(0.5, 1.0))
    fig.suptitle(title, fontsize=FONT_SIZE + 2)
    save(fig, path)


def save(fig: Figure, path: str) -> None:
    fig.savefig(path, dpi=DPI)
    plt.close(fig)


def head_labels(terms: Sequence[LayerTerms], heads: int) -> List[str]:
    return [f"L{t.layer}H{h}" for t in terms for h in range(heads)]


def by_side(terms: Sequence[LayerTerms], present: Callable[[LayerTerms], bool]) -> Dict[str, List[LayerTerms]]:
    sides: Dict[str, List[LayerTerms]] = {}
    for t in terms:
        if present(t):
            sides.setdefault(t.side, []).append(t)
    return sides


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


def draw_direct(inspection: Inspection, out: str) -> List[str]:
    paths = []
    for t in inspection.terms:
        prefix = os.path.join(out, f"{t.side}-layer{t.layer}-direct")
        if t.direct_absolute is not None:
            labels = positions(t.positions)
            panels = [Panel(a.numpy(), f"head {h}", labels, labels) for h, a in enumerate(t.direct_absolute)]
            heatmap_grid(panels, f"{t.side} layer {t.layer}: learned A^p (first {t.positions} positions)",
                         f"{prefix}-absolute.png", cmap=SIGNED_CMAP, signed=True,
                         xlabel="key position j", ylabel="query position i")
            paths.append(f"{prefix}-absolute.png")
        if t.direct_relative is not None:
            relative_curves(t, f"{prefix}-relative.png")
            paths.append(f"{prefix}-relative.png")
    return paths


def relative_curves(t: LayerTerms, path: str) -> None:
    """``a^r`` of every head over ``i - j``."""
    distances = t.distances()
    fig, ax = plt.subplots(figsize=(min(12.0, max(5.0, 0.12 * len(distances) + 3.0)), 3.8),
                           constrained_layout=True)
    for h, values in enumerate(t.direct_relative.numpy()):
        ax.plot(distances, values, marker="o", markersize=2.5, linewidth=1.0, label=f"head {h}")
    ax.axhline(0.0, color="black", linewidth=0.6)
    ax.axvline(0.0, color="grey", linewidth=0.6, linestyle=":")
    ax.set_xlabel("i - j (query position minus key position)", fontsize=FONT_SIZE)
    ax.set_ylabel("a^r", fontsize=FONT_SIZE)
    ax.tick_params(labelsize=FONT_SIZE)
    ax.legend(fontsize=FONT_SIZE, ncol=min(4, len(t.direct_relative)))
    ax.set_title(f"{t.side} layer {t.layer}: learned a^r", fontsize=FONT_SIZE + 2)
    save(fig, path)


def draw_temperature(inspection: Inspection, out: str) -> List[str]:
    paths = []
    for side, terms in by_side(inspection.terms, lambda t: t.temperature is not None).items():
        gammas = np.concatenate([t.temperature.numpy() for t in terms], axis=1)  # 3 x (layers * heads)
        path = os.path.join(out, f"{side}-temperature.png")
        grouped_bars(head_labels(terms, terms[0].temperature.size(1)),
                     dict(zip(("gamma_q", "gamma_k", "gamma_v"), gammas)),
                     f"{side}: learned temperatures per layer and head", path)
        paths.append(path)
    return paths


def draw_distance_aware(inspection: Inspection, out: str) -> List[str]:
    paths = []
    for side, terms in by_side(inspection.terms, lambda t: t.da_w is not None).items():
        labels = head_labels(terms, terms[0].da_w.numel())
        series = {"w": (labels, np.concatenate([t.da_w.numpy() for t in terms])),
                  "v": (labels, np.concatenate([t.da_v.numpy() for t in terms]))}
        path = os.path.join(out, f"{side}-distance-aware-w-v.png")
        sorted_bars(series, f"{side}: distance-aware w and v of every head, sorted", path)
        paths.append(path)
        for t in terms:
            labels = positions(t.positions)
            panels = [Panel(c.numpy(), f"head {h}", labels, labels) for h, c in enumerate(t.da_coefficients)]
            path = os.path.join(out, f"{side}-layer{t.layer}-distance-aware-coefficients.png")
            heatmap_grid(panels, f"{side} layer {t.layer}: re-scaled coefficients f(w|i-j|; v)", path,
                         cmap="magma", xlabel="key position j", ylabel="query position i")
            paths.append(path)
    return paths


def draw_conv(inspection: Inspection, out: str) -> List[str]:
    paths = []
    for t in (t for t in inspection.terms if t.conv is not None):
        prefix = os.path.join(out, f"{t.side}-layer{t.layer}-conv")
        conv_filters(t, f"{prefix}-filters.png")
        maps = inspection.conv_maps(t)
        rows, columns = attention_labels(inspection, maps)
        heads = maps.probs.size(0)
        panels = [Panel(m[h].numpy(), f"head {h}, {when}", rows, columns)
                  for when, m in (("before (S)", maps.softmax), ("after", maps.probs)) for h in range(heads)]
        heatmap_grid(panels, f"{t.side} layer {t.layer}: attention before and after the {t.conv} convolution",
                     f"{prefix}-before-after.png", columns=heads, row_scales=True, xlabel="key", ylabel="query")
        paths += [f"{prefix}-filters.png", f"{prefix}-before-after.png"]
    return paths


def conv_filters(t: LayerTerms, path: str) -> None:
    weight, bias = t.conv_weight.numpy(), t.conv_bias.numpy()
    if t.conv == "2d":
        taps = positions(weight.shape[-1])
        panels = [Panel(w, f"head {h} (bias {b:.3g})", taps, taps) for h, (w, b) in enumerate(zip(weight, bias))]
        heatmap_grid(panels, f"{t.side} layer {t.layer}: 2d attention filters", path, cmap=SIGNED_CMAP,
                     signed=True, annotate=True, xlabel="key tap", ylabel="query tap")
        return
    labels = positions(t.positions)
    kernel = weight.shape[-1]
    panels = [Panel(weight[h, :, :, tap], f"head {h}, query tap {tap}", labels, labels)
              for h in range(weight.shape[0]) for tap in range(kernel)]
    heatmap_grid(panels, f"{t.side} layer {t.layer}: 1d attention filters (first {t.positions} columns)",
                 path, cmap=SIGNED_CMAP, signed=True, columns=kernel,
                 xlabel="input key column", ylabel="output key column")


def draw_relative_embeddings(inspection: Inspection, out: str) -> List[str]:
    paths = []
    for t in inspection.terms:
        for table in t.relative_tables:
            path = os.path.join(out, f"{t.side}-layer{t.layer}-{table.name}-relative-embeddings.png")
            relative_tables(t, table, path)
            paths.append(path)
    return paths


def relative_tables(t: LayerTerms, table: RelativeTable, path: str) -> None:
    buckets = positions(2 * table.clip + 1, start=-table.clip)
    dims = positions(table.key.size(1))
    panels = [Panel(table.key.numpy(), "key a^K", buckets, dims),
              Panel(table.value.numpy(), "value a^V", buckets, dims)]
    distance = "j - i" if table.name == "sequential" else "relative structural position"
    heatmap_grid(panels, f"{t.side} layer {t.layer}: {table.name} relative position embeddings "
                 f"(clip {table.clip})", path, cmap=SIGNED_CMAP, signed=True, xlabel="dimension",
                 ylabel=distance)


def draw_structure(inspection: Inspection, out: str) -> List[str]:
    trace = inspection.structure
    tokens = trace.tokens
    size = panel_inches(len(tokens))
    fig = plt.figure(figsize=(2 * size + 2.0, size + 2.2), constrained_layout=True)
    grid = fig.add_gridspec(2, 2, height_ratios=[1, 5])
    position_strip(fig.add_subplot(grid[0, :]), tokens,
                   {"sequential": np.arange(len(tokens)), "tree depth": trace.depth.numpy()})
    matrices = [Panel(trace.sequential.numpy(), "sequential relative positions i - j", tokens, tokens),
                Panel(trace.structural.numpy(), f"structural relative positions (clip {trace.clip})",
                      tokens, tokens)]
    for column, panel in enumerate(matrices):
        ax = fig.add_subplot(grid[1, column])
        image = draw_matrix(ax, panel, SIGNED_CMAP, value_range([panel.matrix], signed=True), annotate=True)
        fig.colorbar(image, ax=ax, shrink=0.8)
    fig.suptitle("source positions: sequential vs structural (dependency tree)", fontsize=FONT_SIZE + 2)
    path = os.path.join(out, "structure.png")
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


DRAWERS: Dict[str, Callable[[Inspection, str], List[str]]] = {
    "attention": draw_attention,
    "direct": draw_direct,
    "temperature": draw_temperature,
    "distance-aware": draw_distance_aware,
    "conv": draw_conv,
    "relative-embeddings": draw_relative_embeddings,
    "structure": draw_structure,
    "lstm": draw_lstm,
}


def draw(inspection: Inspection, kinds: Sequence[str], out: str) -> List[str]:
    """Write the PNGs of ``kinds`` into ``out`` (created if needed); return their paths."""
    os.makedirs(out, exist_ok=True)
    paths: List[str] = []
    for kind in kinds:
        paths += DRAWERS[kind](inspection, out)
    return paths
