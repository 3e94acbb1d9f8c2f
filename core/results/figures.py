"""Each study's frontier as a picture: ``results/figures/STUDY.png`` and ``.svg``, drawn from its bundle by
:func:`paretolab.results.crossplot.draw_panels` (the one plotting path), shown in the study's section of its document.

A panel per metric pair: the study's first two objectives, then the pairs its pipeline's ``frontiers:`` names (the
engines' tokens/s at each concurrency against perplexity); every complete feasible trial a point, marked by its
method, and the frontier over all of them drawn in black (a picture to read: the verdicts are the document's). The
plotted points are written beside the pictures (``STUDY.json``): ``results render --check`` compares them, so a
picture cannot go stale while its pixels may differ between matplotlib versions.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

from paretolab.plugin_api.numbers import axis_scale, axis_title
from paretolab.results.frontier import pareto_indices

FIGURES = Path("results") / "figures"
MAX_PANELS = 6


def study_pairs(study: Any) -> list[tuple[tuple[str, str], tuple[str, str]]]:
    """((x, direction), (y, direction)) per panel: the first two objectives, then the pipeline's ``frontiers:`` pairs;
    each pair as a pipeline writes it, (quality, cost), drawn with the cost across and the quality up."""
    from paretolab.plugin_api.manager import registries

    objectives = [(str(m), str(d)) for m, d in study.user_attrs.get("objectives") or []]
    pairs = [(objectives[0][0], objectives[1][0])] if len(objectives) >= 2 else []
    pairs += [(str(p[0]), str(p[1])) for p in (study.user_attrs.get("pipeline") or {}).get("frontiers") or []
              if isinstance(p, (list, tuple)) and len(p) == 2]
    metrics = registries().metrics
    directions = {m: d for m, d in objectives}
    out, seen = [], set()
    for y, x in pairs:
        known = [directions.get(m) or (metrics.get(m).direction if m in metrics else None) for m in (x, y)]
        if None in known or frozenset((x, y)) in seen:
            continue
        seen.add(frozenset((x, y)))
        out.append(((x, str(known[0])), (y, str(known[1]))))
    return out[:MAX_PANELS]


def study_panels(name: str, source: Any) -> list[dict[str, Any]]:
    """The study's panels with their points (only panels with two points or more); [] for a study with nothing to draw."""
    from paretolab.results.read import trial_table

    study = source.study(name)
    pairs = study_pairs(study)
    if not pairs:
        return []
    _, rows = trial_table(name, source)
    panels = []
    for (x, dx), (y, dy) in pairs:
        points = []
        for r in rows:
            vx, vy = _value(r, x), _value(r, y)
            if r.get("feasible", True) and vx is not None and vy is not None:
                points.append({"trial": r["trial"], "label": r["method"], "x": _round(vx / axis_scale(x)), "y": _round(vy / axis_scale(y))})
        if len(points) < 2:
            continue
        front = set(pareto_indices([[p["x"], p["y"]] for p in points], [dx, dy], keep_ties=True))
        for i, p in enumerate(points):
            p["frontier"] = i in front
        panels.append({"x": x, "y": y, "x_direction": dx, "y_direction": dy, "points": points})
    return panels


def _value(row: dict[str, Any], metric: str) -> float | None:
    v = row.get(metric)
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) else None


def _round(value: float) -> float:
    return float(f"{value:.6g}")


def payload(name: str, source: Any, panels: list[dict[str, Any]]) -> dict[str, Any]:
    """What ``STUDY.json`` holds (and ``render --check`` compares)."""
    return {"study": name, "model": source.study(name).user_attrs.get("model"), "panels": panels}


def figure_markdown(name: str, panels: list[dict[str, Any]], document: str) -> str:
    """The picture's line in the study's section, its path relative to the document (as GitHub and the site resolve it)."""
    if not panels:
        return ""
    what = "; ".join(f"{p['y']} against {p['x']}" for p in panels)
    return f"![{name}: {what}, every trial by method, the frontier in black]({os.path.relpath(FIGURES / f'{name}.png', Path(document).parent)})"


def draw_study(data: dict[str, Any], base: Path) -> list[Path]:
    """``base``.json, .png and .svg for one study (``data``: :func:`payload`)."""
    from paretolab.data.outputs import write_atomic
    from paretolab.results.crossplot import draw_panels

    base.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(base.with_suffix(".json"), json.dumps(data, indent=1) + "\n")
    panels = [{"x_title": axis_title(p["x"], p["x_direction"]), "y_title": axis_title(p["y"], p["y_direction"]),
               "x_direction": p["x_direction"], "points": p["points"]} for p in data["panels"]]
    return [base.with_suffix(".json"), *draw_panels(panels, base, f"{data['study']} ({data['model']}): every trial, the frontier in black")]


def document_figures(root: Path, studies: list[str], source: Any, *, check: bool) -> tuple[list[str], list[str]]:
    """Draw each study's picture (with ``check``: compare its points instead); (stale files, files written)."""
    stale, written = [], []
    for name in studies:
        if name not in source.names():
            continue
        panels = study_panels(name, source)
        if not panels:
            continue
        base = root / FIGURES / name
        data = payload(name, source, panels)
        if check:
            path = base.with_suffix(".json")
            if not path.is_file() or json.loads(path.read_text(encoding="utf-8")) != data:
                stale.append(str((FIGURES / f"{name}.json").as_posix()))
            elif not base.with_suffix(".png").is_file() or not base.with_suffix(".svg").is_file():
                stale.append(str((FIGURES / f"{name}.png").as_posix()))
            continue
        written += [str(p.relative_to(root)) for p in draw_study(data, base)]
    return stale, written
