"""The report's pictures (matplotlib, imported only here; the tables are written without it)."""

from pathlib import Path
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

Curve = Tuple[Sequence[float], Sequence[float]]


def available() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _style(index: int) -> Dict[str, object]:
    """A distinct colour and line style per method: tab20's ten dark colours, then its ten light ones, then the
    same with another dash pattern."""
    plt = _pyplot()
    colour = 2 * (index % 10) + (index // 10) % 2
    return {"color": plt.get_cmap("tab20")(colour), "linestyle": ("-", "--", "-.", ":")[index // 20 % 4]}


def lines(path: Path, title: str, xlabel: str, ylabel: str, curves: Mapping[str, Curve], log_x: bool = False,
          log_y: bool = False, mark: Optional[float] = None, multiples: bool = False) -> Path:
    """One line per method (``curves``: label -> (x, y)); ``mark``: a vertical line (the training length);
    ``multiples``: x is a multiple of the training length, ticked at the values drawn."""
    plt = _pyplot()
    figure, axes = plt.subplots(figsize=(7.5, 4.2), dpi=100)
    for index, (label, (x, y)) in enumerate(curves.items()):
        axes.plot(x, y, marker="o", markersize=2.5, linewidth=1.2, label=label, **_style(index))
    if mark is not None:
        axes.axvline(mark, color="grey", linewidth=0.8)
    axes.set(title=title, xlabel=xlabel, ylabel=ylabel)
    if log_x:
        axes.set_xscale("log", base=2)
    if multiples:
        ticks = sorted({x for xs, _ in curves.values() for x in xs})
        axes.set_xticks(ticks, [f"{x:g}x" for x in ticks])
    if log_y:
        axes.set_yscale("log")
    axes.grid(alpha=0.3)
    axes.legend(fontsize=6, ncol=2, loc="center left", bbox_to_anchor=(1.01, 0.5))
    figure.tight_layout()
    figure.savefig(path)
    plt.close(figure)
    return path


def heat_maps(path: Path, title: str, maps: Mapping[str, List[List[Optional[float]]]], rows: Sequence[str],
              columns: Sequence[str]) -> Path:
    """A small heat map per method (``maps``: label -> rows x columns of values in [0, 1], None: refused)."""
    plt = _pyplot()
    count = len(maps)
    across = min(6, count)
    down = (count + across - 1) // across
    figure, grid = plt.subplots(down, across, figsize=(1.9 * across + 0.8, 1.8 * down + 0.6), dpi=100,
                                squeeze=False)
    image = None
    for axes, (label, values) in zip(grid.flat, maps.items()):
        shown = [[float("nan") if v is None else v for v in row] for row in values]
        image = axes.imshow(shown, vmin=0.0, vmax=1.0, cmap="viridis", aspect="auto")
        axes.set_title(label, fontsize=7)
        axes.set_xticks(range(len(columns)), columns, fontsize=6)
        axes.set_yticks(range(len(rows)), rows, fontsize=6)
    for axes in list(grid.flat)[count:]:
        axes.axis("off")
    if image is not None:
        figure.colorbar(image, ax=grid.ravel().tolist(), shrink=0.6)
    figure.suptitle(title, fontsize=9)
    figure.savefig(path)
    plt.close(figure)
    return path
