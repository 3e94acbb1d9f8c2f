"""The cross-paper frontier: every compression study on one base model in one plot, drawn from the bundles.

Each complete trial of each study whose model is the base and whose objectives include ``ppl`` and ``size_bytes`` is a
point (method label, study); the frontier is drawn over all of them (a picture to read, not a verdict: verdicts are the
documents'). ``render --check`` compares the plotted points (the ``.json`` beside the figures), so a figure cannot go
stale while its pixels may differ between matplotlib versions.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from paretolab.results.frontier import pareto_indices

X, Y = "size_bytes", "ppl"


def cross_points(source: Any, studies: list[str], model: str) -> list[dict[str, Any]]:
    """The points: one per complete, feasible trial with both metrics, in study and trial order."""
    from paretolab.results.read import trial_table

    points = []
    for name in studies:
        if name not in source.names():
            continue
        study = source.study(name)
        objectives = {m for m, _ in study.user_attrs.get("objectives", [])}
        if study.user_attrs.get("model") != model or not {X, Y} <= objectives:
            continue
        _, rows = trial_table(name, source)
        for r in rows:
            if r.get("feasible", True) and isinstance(r.get(X), float) and isinstance(r.get(Y), float):
                points.append({"study": name, "trial": r["trial"], "method": r["method"], "size_mb": round(r[X] / 1e6, 3),
                               "ppl": float(f"{r[Y]:.6g}")})
    front = set(pareto_indices([[p["size_mb"], p["ppl"]] for p in points], ["minimize", "minimize"]))
    for i, p in enumerate(points):
        p["frontier"] = i in front
    return points


def write_cross_plot(points: list[dict[str, Any]], base: Path, model: str) -> list[Path]:
    """``base``.json (the points), .png and .svg (written with fixed metadata); the paths written."""
    from paretolab.data.outputs import write_atomic

    base.parent.mkdir(parents=True, exist_ok=True)
    data = base.with_suffix(".json")
    write_atomic(data, json.dumps({"model": model, "x": "size_mb", "y": "ppl", "points": points}, indent=1) + "\n")  # whole or not at all
    if not points:
        return [data]
    panel = {"x_title": "size [MB] ↓ (stored bytes, as each method accounts them)", "y_title": "perplexity ↓ (WikiText-2)",
             "x_direction": "minimize", "frontier_label": "frontier (all studies)",
             "points": [{"label": p["method"], "x": p["size_mb"], "y": p["ppl"], "frontier": p["frontier"]} for p in points]}
    return [data, *draw_panels([panel], base, f"{model}: every compression study's trials, one frontier", size=(9, 6))]


def tick_formatter() -> Any:
    """A matplotlib tick formatter writing an axis's ticks by ``numbers.tick_labels``: one notation per axis (``100k``
    beside ``1M``, never ``100000`` or ``1e+06``), no offset, no float noise."""
    from matplotlib.ticker import Formatter

    from paretolab.plugin_api.numbers import number, tick_labels

    class OneNotation(Formatter):
        def __call__(self, x: float, pos: Any = None) -> str:
            return number(float(x))

        def format_ticks(self, values: Any) -> list[str]:
            return tick_labels(values)

    return OneNotation()


MARKERS = "osD^v<>pPX*h"
LOG_SPAN = 50  # an axis whose positive values span more than this factor is drawn on a log scale


def draw_panels(panels: list[dict[str, Any]], base: Path, title: str, *, size: tuple[float, float] | None = None) -> list[Path]:
    """The one way a results figure is drawn: one frontier plot per panel, side by side, written as ``base``.png and
    ``base``.svg with fixed metadata (the same points give the same bytes with the same matplotlib).

    A panel: ``x_title``, ``y_title``, ``x_direction`` (how the frontier steps), optional ``frontier_label``, and
    ``points`` ({label, x, y, frontier}); each label keeps one marker and colour across the panels."""
    import io

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import NullFormatter

    from paretolab.data.outputs import write_atomic

    labels = sorted({p["label"] for panel in panels for p in panel["points"]})
    colours = plt.get_cmap("tab20").colors
    style = {label: (MARKERS[i % len(MARKERS)], colours[i % len(colours)]) for i, label in enumerate(labels)}
    columns = min(len(panels), 3)
    rows = -(-len(panels) // columns)
    written = []
    with plt.rc_context({"svg.hashsalt": "paretolab", "svg.fonttype": "none"}):
        fig, axes = plt.subplots(rows, columns, figsize=size or (5.2 * columns + 1.5, 4.2 * rows), dpi=100, squeeze=False)
        for ax, panel in zip(axes.flat, panels):
            for label in labels:
                mine = [p for p in panel["points"] if p["label"] == label]
                if mine:
                    marker, colour = style[label]
                    ax.scatter([p["x"] for p in mine], [p["y"] for p in mine], s=36, marker=marker, color=colour, label=label,
                               edgecolors="black", linewidths=0.4, zorder=3)
            front = sorted((p for p in panel["points"] if p["frontier"]), key=lambda p: (p["x"], p["y"]))
            ax.step([p["x"] for p in front], [p["y"] for p in front], where="post" if panel["x_direction"] == "minimize" else "pre",
                    color="black", linewidth=1, zorder=2, label=panel.get("frontier_label", "frontier"))
            for axis, values in ((ax.xaxis, [p["x"] for p in panel["points"]]), (ax.yaxis, [p["y"] for p in panel["points"]])):
                if values and min(values) > 0 and max(values) > LOG_SPAN * min(values):
                    (ax.set_xscale if axis is ax.xaxis else ax.set_yscale)("log")
                    axis.set_major_formatter(tick_formatter())
                    axis.set_minor_formatter(NullFormatter())
            ax.set_xlabel(panel["x_title"])
            ax.set_ylabel(panel["y_title"])
            ax.grid(True, which="both", alpha=0.3)
        for ax in list(axes.flat)[len(panels):]:
            ax.set_visible(False)
        axes.flat[0].legend(fontsize=7, ncol=2 if len(labels) > 8 else 1, loc="best", frameon=True)
        (axes.flat[0].set_title if len(panels) == 1 else fig.suptitle)(title)
        fig.tight_layout()
        for path, metadata in ((base.with_suffix(".png"), {"Software": None}), (base.with_suffix(".svg"), {"Date": None, "Creator": None})):
            drawn = io.BytesIO()
            fig.savefig(drawn, format=path.suffix[1:], metadata=metadata)
            write_atomic(path, drawn.getvalue())
            written.append(path)
        plt.close(fig)
    return written
