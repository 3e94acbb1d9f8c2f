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
    import io

    from paretolab.data.outputs import write_atomic

    base.parent.mkdir(parents=True, exist_ok=True)
    data = base.with_suffix(".json")
    write_atomic(data, json.dumps({"model": model, "x": "size_mb", "y": "ppl", "points": points}, indent=1) + "\n")  # whole or not at all
    if not points:
        return [data]
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams["svg.hashsalt"] = "paretolab"
    fig, ax = plt.subplots(figsize=(9, 6), dpi=110)
    methods = sorted({p["method"] for p in points})
    markers = "osD^v<>pPX*h"
    colours = plt.get_cmap("tab20").colors
    for i, method in enumerate(methods):
        mine = [p for p in points if p["method"] == method]
        ax.scatter([p["size_mb"] for p in mine], [p["ppl"] for p in mine], s=36, marker=markers[i % len(markers)],
                   color=colours[i % len(colours)], label=method, edgecolors="black", linewidths=0.4, zorder=3)
    front = sorted((p for p in points if p["frontier"]), key=lambda p: p["size_mb"])
    ax.step([p["size_mb"] for p in front], [p["ppl"] for p in front], where="post", color="black", linewidth=1, zorder=2,
            label="frontier (all studies)")
    ax.set_yscale("log")
    from matplotlib.ticker import FuncFormatter, NullFormatter

    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.yaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel("size [MB] ↓ (stored bytes, as each method accounts them)")
    ax.set_ylabel("perplexity ↓ (WikiText-2, log scale)")
    ax.set_title(f"{model}: every compression study's trials, one frontier")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, ncol=2, loc="upper right", frameon=True)
    fig.tight_layout()
    png, svg = base.with_suffix(".png"), base.with_suffix(".svg")
    for path, metadata in ((png, {"Software": None}), (svg, {"Date": None, "Creator": None})):
        drawn = io.BytesIO()
        fig.savefig(drawn, format=path.suffix[1:], metadata=metadata)
        write_atomic(path, drawn.getvalue())
    plt.close(fig)
    return [data, png, svg]
