"""The frontier as a file (PNG, SVG) drawn with matplotlib, the twin of the page's plotly figure (``plots``).

matplotlib rather than plotly+kaleido: kaleido drives a Chrome it downloads or finds at run time, one browser process
per export, which is slow on two cores and fragile offline; matplotlib renders PNG and SVG in-process with no browser.
"""

from __future__ import annotations

import io
from typing import Any

import numpy as np

from paretolab.dashboard.plots import INFEASIBLE_COLOUR, MPL_MARKERS, REFERENCE, WEBGL_ABOVE, FrontierData, decades, error_bars
from paretolab.results.crossplot import tick_formatter


def frontier_image(data: FrontierData, fmt: str, *, log_x: bool | None = None, log_y: bool | None = None) -> bytes:
    """The frontier plot as PNG or SVG bytes (matplotlib, no browser); axes as in :func:`frontier_figure`."""
    out = io.BytesIO()
    static_figure(data, log_x=log_x, log_y=log_y).savefig(out, format=fmt)
    return out.getvalue()


def static_figure(data: FrontierData, *, log_x: bool | None = None, log_y: bool | None = None) -> Any:
    """The matplotlib Figure behind :func:`frontier_image`, drawn as the page draws it: the same title, axis titles
    (unit and direction, tick labels without an offset), colours and shapes per method, outlined frontier points,
    error bars in each method's colour, the unmodified model's dashed lines (SVG ids ``unmodified-model-x``/``-y``)
    and its one label; a legend entry only for what is drawn."""
    auto = data.log_axes()
    log_x, log_y = auto[0] if log_x is None else log_x, auto[1] if log_y is None else log_y
    import matplotlib

    matplotlib.use("Agg", force=False)
    from matplotlib.figure import Figure
    from matplotlib.ticker import FixedLocator, FuncFormatter

    sx, sy = data.scales()
    fig = Figure(figsize=(8, 5.5), dpi=120)
    ax = fig.subplots()
    styles = data.styles()
    for label, group in data.method_points().groupby("methods", sort=True):
        colour, symbol = styles[label]
        marker = MPL_MARKERS.get(symbol, "o")
        simulated = group["simulated"].fillna("") != ""
        big = len(group) > WEBGL_ABOVE
        for part, hollow in ((group[~simulated], False), (group[simulated], True)):
            if part.empty:
                continue
            # as on the page: a frontier point is bigger, outlined dark when filled; a hollow (simulated) one keeps its colour
            edges = colour if hollow else np.where(part["frontier"], "#111111", colour)
            ax.scatter(part[data.x] / sx, part[data.y] / sy, s=np.where(part["frontier"], 60, 22), marker=marker,
                       facecolors="none" if hollow else colour, edgecolors=edges, linewidths=np.where(part["frontier"], 1.8, 0.8),
                       alpha=0.85, label=label if not hollow or not (~simulated).any() else None, rasterized=big, zorder=3)
            bars = {k: b for k, b in (("xerr", error_bars(part, data.x, sx)), ("yerr", error_bars(part, data.y, sy))) if b}
            if bars:
                ax.errorbar(part[data.x] / sx, part[data.y] / sy, fmt="none", ecolor=colour, elinewidth=0.8, capsize=2, zorder=2,
                            **{k: [b["arrayminus"], b["array"]] for k, b in bars.items()})
    bad = data.infeasible
    if not bad.empty:
        ax.scatter(bad[data.x] / sx, bad[data.y] / sy, marker="x", s=24, color=INFEASIBLE_COLOUR, label=data.infeasible_label())
    front = data.points[data.points["frontier"]].sort_values([data.x, data.y])
    if not front.empty:
        where = "post" if data.directions[0] == "minimize" else "pre"
        ax.step(front[data.x] / sx, front[data.y] / sy, where=where, color="#111111", linewidth=1.5, label="Pareto frontier", zorder=1)
    if not data.reference.empty:
        ax.scatter(data.reference[data.x] / sx, data.reference[data.y] / sy, marker="*", s=200, color="gold", edgecolors="black",
                   label=REFERENCE, zorder=5)
    point = data.reference_point()
    if point is not None:
        rx, ry = point[0] / sx, point[1] / sy
        dashed = {"linestyle": "--", "color": "0.35", "linewidth": 1, "zorder": 1}
        ax.axvline(rx, gid="unmodified-model-x", **dashed)
        ax.axhline(ry, gid="unmodified-model-y", **dashed)
        ax.annotate(REFERENCE, (rx, ry), xytext=(8, 3), textcoords="offset points", ha="left", va="bottom", fontsize=8, color="0.35")
    x_title, y_title = data.axis_titles()
    ax.set_xlabel(x_title)
    ax.set_ylabel(y_title)
    if data.title:
        ax.set_title(data.title, fontsize=11, loc="left")
    ax.set_xscale("log" if log_x else "linear")
    ax.set_yscale("log" if log_y else "linear")
    plain = tick_formatter()  # the one formatter, one notation per axis: no 1e8 offset, no float noise, 100k beside 1M
    for axis, log, column, scale in ((ax.xaxis, log_x, data.x, sx), (ax.yaxis, log_y, data.y, sy)):
        axis.set_major_formatter(plain)
        if log:  # the decades the page labels (plots.decades), with the same text
            axis.set_major_locator(FixedLocator(decades(data.points[column] / scale)))
            axis.set_minor_formatter(FuncFormatter(lambda v, _: ""))
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig
