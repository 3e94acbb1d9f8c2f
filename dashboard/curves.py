"""Learning curves of a training study as data and as a figure: one line per trial, seeds grouped.

Trials are grouped by what differs between them apart from the seed: the methods the choice
stages picked (methods every trial ran, such as ``train``, are left out of the label) and the
parameters that vary across the study other than ``*.seed``. A group's seeds are aligned on
the first seed's x values (linear interpolation, no extrapolation) to draw their mean and a
band: min–max or ± one standard error across seeds. A pruned trial (stopped early by the study's pruner)
is drawn alone, faded and dotted up to where it stopped, and kept out of its group's mean, band and summary.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from paretolab.dashboard.data import NONE_METHOD
from paretolab.dashboard.plots import PALETTE
from paretolab.plugin_api.numbers import number, param_value

X_TITLES = {"tokens": "training tokens", "flops": "training FLOPs"}
BANDS = ("min–max", "± stderr", "one line per seed")


@dataclass
class TrialCurve:
    """One trial's curve points for the chosen axes."""

    number: int
    group: str
    seed: Any
    x: np.ndarray
    y: dict[str, np.ndarray]  # loss name -> values at x (NaN where unknown)
    pruned_at: int | None = None  # the step the pruner stopped the trial at; None for a trial that ran to the end

    @property
    def label(self) -> str:
        step = f"pruned at step {self.pruned_at}" if self.pruned_at is not None and self.pruned_at >= 0 else "pruned (step not recorded)"
        return f"{self.group} · trial {self.number} · {step}"


def variant_labels(methods: pd.Series) -> pd.Series:
    """Method labels without the methods every trial ran (``bhyt+train`` -> ``bhyt``, ``train`` -> ``none``)."""
    parts = [str(m).split("+") for m in methods]
    common = set.intersection(*(set(p) for p in parts)) if parts else set()
    labels = ["+".join(m for m in p if m not in common) or NONE_METHOD for p in parts]
    return pd.Series(labels if len(set(labels)) > 1 or not common else list(methods), index=methods.index)


def group_labels(frame: pd.DataFrame) -> pd.Series:
    """Each trial's group: its variant label and the non-seed parameters that vary across the study."""
    label = variant_labels(frame["methods"])
    varying = [c for c in frame.columns if c.startswith("param:") and not c.endswith((".seed", ".method"))
               and frame[c].astype(str).nunique(dropna=False) > 1]
    for column in varying:
        name = column.removeprefix("param:").split(".", 1)[-1]
        label = label + frame[column].map(lambda v, n=name: "" if v is None or v != v else f" · {n}={param_value(v)}")
    return label


def seed_of(row: pd.Series, curve: Any) -> Any:
    seeds = [row[c] for c in row.index if str(c).startswith("param:") and str(c).endswith(".seed") and row[c] is not None]
    return seeds[0] if seeds else curve.seed


def trial_curves(frame: pd.DataFrame, curves: dict[int, Any], x: str, losses: list[str]) -> list[TrialCurve]:
    """The trials of ``frame`` whose curve has ``x`` and the first loss, with their group and seed."""
    groups = group_labels(frame)
    out = []
    for (_, row), group in zip(frame.iterrows(), groups):
        curve = curves.get(int(row["number"]))
        if curve is None or not curve.has(x) or not curve.has(losses[0]):
            continue
        xs = [float(r[x]) for r in curve.rows if _finite(r.get(x))]
        ys = {loss: np.array([float(r.get(loss, np.nan)) for r in curve.rows if _finite(r.get(x))]) for loss in losses}
        out.append(TrialCurve(int(row["number"]), group, seed_of(row, curve), np.array(xs), ys, pruned_step(row)))
    return out


def pruned_step(row: pd.Series) -> int | None:
    """The step a pruned trial was stopped at (-1 when the driver did not record it); None for any other trial."""
    if row.get("state") != "PRUNED":
        return None
    step = row.get("pruned_at_step")
    return int(step) if isinstance(step, (int, float)) and step == step else -1


def completed(curves: list[TrialCurve]) -> list[TrialCurve]:
    """The curves of trials that ran to the end: the ones grouped into means, bands and summaries."""
    return [c for c in curves if c.pruned_at is None]


def aligned(members: list[TrialCurve], loss: str) -> tuple[np.ndarray, np.ndarray]:
    """(x, values): each seed's ``loss`` on the first seed's x values, NaN outside a seed's range."""
    x = members[0].x
    rows = []
    for m in members:
        known = np.isfinite(m.y[loss])
        xs, ys = m.x[known], m.y[loss][known]
        rows.append(np.interp(x, xs, ys, left=np.nan, right=np.nan) if len(xs) else np.full(len(x), np.nan))
    return x, np.vstack(rows)


def band(values: np.ndarray, kind: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(mean, low, high) across seeds (rows) at each x; stderr needs two seeds (else the band is the mean)."""
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # 'mean of empty slice' where no seed reached an x value
        mean = np.nanmean(values, axis=0)
        if kind == "min–max":
            return mean, np.nanmin(values, axis=0), np.nanmax(values, axis=0)
        count = np.sum(np.isfinite(values), axis=0)
        err = np.where(count >= 2, np.nanstd(values, axis=0, ddof=1) / np.sqrt(np.maximum(count, 1)), 0.0)
        return mean, mean - err, mean + err


def summary(members_by_group: dict[str, list[TrialCurve]]) -> pd.DataFrame:
    """Per group: seeds, trials and the final val_loss (mean, min, max) with where it ended."""
    rows = []
    for group, members in members_by_group.items():
        final = [m.y["val_loss"][np.isfinite(m.y["val_loss"])][-1] for m in members if "val_loss" in m.y and np.isfinite(m.y["val_loss"]).any()]
        rows.append({"group": group, "seeds": ", ".join(str(m.seed) for m in members), "trials": ", ".join(str(m.number) for m in members),
                     "final val_loss (mean)": float(np.mean(final)) if final else np.nan,
                     "min": float(np.min(final)) if final else np.nan, "max": float(np.max(final)) if final else np.nan,
                     "x at end (mean)": float(np.mean([m.x[-1] for m in members]))})
    return pd.DataFrame(rows)


def by_group(curves: list[TrialCurve]) -> dict[str, list[TrialCurve]]:
    out: dict[str, list[TrialCurve]] = {}
    for c in sorted(curves, key=lambda c: (c.group, str(c.seed), c.number)):
        out.setdefault(c.group, []).append(c)
    return out


def curves_figure(curves: list[TrialCurve], x: str, losses: list[str], kind: str, *, log_x: bool = False) -> go.Figure:
    """Mean line and band per group (``kind`` min–max or ± stderr), or one line per seed; a second loss dashed."""
    fig = go.Figure()
    groups = sorted({c.group for c in curves})
    colours = {group: PALETTE[i % len(PALETTE)] for i, group in enumerate(groups)}
    for group, members in by_group(completed(curves)).items():
        colour = colours[group]
        for j, loss in enumerate(losses):
            dash = "solid" if j == 0 else "dash"
            name = group if j == 0 else f"{group} · {loss}"
            if kind == "one line per seed":
                for m in members:
                    fig.add_trace(go.Scatter(x=m.x, y=m.y[loss], mode="lines+markers", name=f"{name} · seed {m.seed}", legendgroup=group,
                                             line={"color": colour, "dash": dash, "width": 1.5}, marker={"size": 4},
                                             customdata=[m.number] * len(m.x), text=_texts(m.x),
                                             hovertemplate=f"trial {m.number} · seed {m.seed}<br>{x} %{{text}}<br>{loss} %{{y:.4f}}<extra></extra>"))
                continue
            xs, values = aligned(members, loss)
            mean, low, high = band(values, kind)
            if j == 0 and len(members) > 1:
                fig.add_trace(go.Scatter(x=xs, y=high, mode="lines", line={"width": 0, "color": colour}, legendgroup=group, showlegend=False, hoverinfo="skip", name=f"{group} band"))
                fig.add_trace(go.Scatter(x=xs, y=low, mode="lines", line={"width": 0, "color": colour}, fill="tonexty", fillcolor=_alpha(colour, 0.2),
                                         legendgroup=group, showlegend=False, hoverinfo="skip", name=f"{group} band"))
            fig.add_trace(go.Scatter(x=xs, y=mean, mode="lines+markers", name=f"{name} ({len(members)} seed{'s' if len(members) != 1 else ''})",
                                     legendgroup=group, line={"color": colour, "dash": dash, "width": 2}, marker={"size": 4}, text=_texts(xs),
                                     hovertemplate=f"{group}: mean of {len(members)}<br>{x} %{{text}}<br>{loss} %{{y:.4f}}<extra></extra>"))
    for c in (c for c in curves if c.pruned_at is not None):  # each alone, faded and dotted, up to where it stopped
        for j, loss in enumerate(losses):
            fig.add_trace(go.Scatter(x=c.x, y=c.y[loss], mode="lines+markers", name=c.label + (f" · {loss}" if j else ""), legendgroup=c.group,
                                     opacity=0.5, line={"color": colours[c.group], "dash": "dot" if j == 0 else "dashdot", "width": 1.5},
                                     marker={"size": 4}, customdata=[c.number] * len(c.x), text=_texts(c.x),
                                     hovertemplate=f"{c.label}<br>{x} %{{text}}<br>{loss} %{{y:.4f}}<extra></extra>"))
    fig.update_layout(xaxis_title=X_TITLES.get(x, x), yaxis_title=losses[0] if len(losses) == 1 else "loss (train dashed)", legend_title="group",
                      height=520, margin={"l": 10, "r": 10, "t": 30, "b": 10}, xaxis_type="log" if log_x else "linear",
                      xaxis_exponentformat="SI")  # tokens, FLOPs: 500k, 1M, 2G (the formatter's suffixes), never 1e+6 or 1B
    return fig


def _texts(values: Any) -> list[str]:
    """The x of each point as the one formatter writes it (``1.024M`` tokens; d3's ``.4g`` wrote ``1.024e+6``)."""
    return [number(float(v)) for v in values]


def _alpha(hex_colour: str, alpha: float) -> str:
    r, g, b = (int(hex_colour[i:i + 2], 16) for i in (1, 3, 5))
    return f"rgba({r},{g},{b},{alpha})"


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and bool(np.isfinite(value))
