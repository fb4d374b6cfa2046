"""Plot helpers the report's figure modules share: a grid of panels, log axes with plain tick numbers, an empty
panel's note. Matplotlib runs on the Agg backend (no display: the report renders PNGs)."""

from __future__ import annotations

import math

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter  # noqa: E402


def panel_grid(n: int, width: float = 5.2, height: float = 4.2, max_cols: int = 3, min_width: float = 8.0):
    cols = max(1, min(n, max_cols))
    rows = max(1, math.ceil(n / cols))
    fig, axes = plt.subplots(rows, cols, figsize=(max(width * cols, min_width), height * rows + 0.9),
                             squeeze=False,
                             layout="constrained")
    flat = list(axes.ravel())
    for ax in flat[n:]:
        fig.delaxes(ax)
    return fig, flat[:n]


def plain_log(ax, axis: str = "xy"):
    """Log axes with plain tick numbers (50, 100, 200 rather than 5 x 10^1) and no minor tick labels."""
    fmt = FuncFormatter(lambda v, _pos: f"{v:,.6g}")
    for a in axis:
        ax_ = ax.xaxis if a == "x" else ax.yaxis
        lo, hi = (ax.get_xlim() if a == "x" else ax.get_ylim())
        decades = math.log10(hi / lo) if lo > 0 and hi > lo else 9
        ax_.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0) if decades < 2.5 else (1.0,)))
        ax_.set_major_formatter(fmt)
        ax_.set_minor_formatter(NullFormatter())


def empty_panel(ax, text: str, xlabel: str, ylabel: str):
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, fontsize=9, color="grey")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_xticks([])
    ax.set_yticks([])


def num(v) -> float:
    """A meta entry's value as a float (NaN when missing or not a number)."""
    try:
        return float(v)
    except (TypeError, ValueError):
        return float("nan")
