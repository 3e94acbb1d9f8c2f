"""Figures from the data path: the frontier (interactive plotly, static matplotlib) and parallel coordinates.

``frontier_points`` computes everything a frontier plot shows as plain data; the two backends
only draw it. Static images use matplotlib rather than plotly+kaleido: kaleido drives a
Chrome it downloads or finds at run time, one browser process per export, which is slow on two
cores and fragile offline; matplotlib renders PNG and SVG in-process with no browser.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from paretolab.dashboard.data import NONE_METHOD
from paretolab.results.noise import QUALITY, mark_indistinguishable
from paretolab.stats import interval

LOG_ABOVE = 100.0  # max/min of a metric's positive values beyond which its axis is logarithmic by default (two decades)
REFERENCE = "unmodified model"  # the label of the reference trials (method ``none`` in every stage) and of their dashed lines
INFEASIBLE_COLOUR = "#9a9a9a"  # infeasible trials: grey crosses, drawn but never on a frontier
WEBGL_ABOVE = 3000  # points; WebGL scatter beyond this, SVG below (WebGL needs a GPU or SwiftShader in the browser)
PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf")


@dataclass
class FrontierData:
    """What a frontier plot shows, as data: points, the frontier(s) and the reference."""

    points: pd.DataFrame  # complete trials with x, y (and z) values, `frontier` and `feasible` flags
    x: str
    y: str
    directions: tuple[str, str]
    z: str | None
    front: pd.DataFrame  # the frontier points, sorted by x
    per_method: dict[str, pd.DataFrame]  # method label -> its own frontier, sorted by x
    reference: pd.DataFrame  # trials of the unmodified model (methods == 'none')
    constraints: tuple[str, ...] = ()  # the study's bounds in words; the frontier is over the trials meeting them
    params: tuple[str, ...] = ()  # the ``param:<name>`` columns shown on hover

    @property
    def infeasible(self) -> pd.DataFrame:
        """The trials that break a constraint, with their ``hover`` text (which bound, by how much)."""
        bad = self.points[~self.points["feasible"]]
        return bad.assign(hover=_hover(bad, self.shown, list(self.params)))

    @property
    def shown(self) -> list[str]:
        return [self.x, self.y, *([self.z] if self.z else [])]

    def reference_point(self) -> tuple[float, float] | None:
        """The unmodified model's (x, y): its earliest trial, as a relative constraint takes it; None without one."""
        if self.reference.empty:
            return None
        first = self.reference.sort_values("number").iloc[0]
        return float(first[self.x]), float(first[self.y])

    def log_axes(self) -> tuple[bool, bool]:
        """The automatic choice of log scale for (x, y): :func:`wants_log` of each axis's values."""
        return wants_log(self.points[self.x]), wants_log(self.points[self.y])

    def infeasible_label(self) -> str:
        return f"infeasible: breaks {' or '.join(self.constraints)}" if self.constraints else "infeasible"

    def csv(self) -> str:
        """The frontier as CSV: trial, the plotted metrics, methods, simulated, params."""
        return self.front.drop(columns=["hover", "frontier"], errors="ignore").to_csv(index=False)


def wants_log(values: Any) -> bool:
    """Whether an axis reads better logarithmic: its positive values span more than two decades (max/min > 100).

    The one rule behind the page's default "log x"/"log y" and the PNG/SVG downloads. ppl from 15 to
    21 million on a linear axis puts every useful point into one pixel column.
    """
    numbers = pd.to_numeric(pd.Series(values), errors="coerce").to_numpy(dtype=float)
    positive = numbers[np.isfinite(numbers) & (numbers > 0)]
    return bool(len(positive)) and float(positive.max()) / float(positive.min()) > LOG_ABOVE


def frontier_points(
    frame: pd.DataFrame,
    front_numbers: np.ndarray,
    *,
    x: str,
    y: str,
    directions: tuple[str, str],
    z: str | None = None,
    per_method: np.ndarray | None = None,
    param_columns: list[str] | None = None,
    constraints: tuple[str, ...] = (),
) -> FrontierData:
    """Assemble the plot data from a complete-trial frame (infeasible trials included, to be drawn marked)
    and the frontier's trial numbers (computed over the feasible ones)."""
    wanted = [x, y] + ([z] if z else [])
    points = frame.dropna(subset=[c for c in wanted if c in frame.columns]).copy()
    points["frontier"] = points["number"].isin(front_numbers)
    points["feasible"] = points["feasible"].astype(bool) if "feasible" in points else True
    front = points[points["frontier"]].sort_values([x, y])
    front = front.assign(hover=_hover(front, wanted, param_columns or []))  # hover text for the few; the many get a template
    fronts: dict[str, pd.DataFrame] = {}
    if per_method is not None:
        own = points[points["number"].isin(per_method)].sort_values([x, y])
        fronts = {str(label): group for label, group in own.groupby("methods", sort=True)}
    reference = points[points["methods"] == NONE_METHOD]
    reference = reference.assign(hover=_hover(reference, wanted, param_columns or []))
    front = front.assign(noise=_within_noise(front, [x, y]))
    keep = ["number", *wanted, "methods", "simulated", *(param_columns or []), "noise"]
    front_out = front[[c for c in keep if c in front.columns] + ["hover", "frontier"]].rename(columns=lambda c: c.removeprefix("param:"))
    return FrontierData(points, x, y, directions, z, front_out, fronts, reference, tuple(constraints), tuple(param_columns or ()))


def _within_noise(front: pd.DataFrame, metrics: list[str]) -> list[str]:
    """Per frontier point (sorted along the frontier): the neighbours within noise on a quality axis, from the logged intervals."""
    quality = [m for m in metrics if m in QUALITY]
    if not quality or front.empty:
        return [""] * len(front)
    rows = [{**rec, "trial": int(rec["number"])} for rec in front.to_dict("records")]
    mark_indistinguishable(rows, quality, lambda run_id: None)  # the dashboard has the logged intervals, not the per-example scores
    return [r["noise"] for r in rows]


def error_bars(points: pd.DataFrame, metric: str) -> dict[str, Any] | None:
    """A plotly error-bar spec from each point's logged 95 % interval of ``metric``; None when no point has one."""
    needed = [c for c in _interval_columns(metric) if c != metric]
    if not needed or any(c not in points for c in needed):  # the columns ``interval`` reads are absent: no point has one
        return None
    spans = [interval(rec, metric) for rec in points[[metric, *needed]].to_dict("records")]
    if not any(spans):
        return None
    values = points[metric].to_numpy(dtype=float)
    high = np.array([s[1] if s else v for s, v in zip(spans, values)]) - values
    low = values - np.array([s[0] if s else v for s, v in zip(spans, values)])
    return {"type": "data", "symmetric": False, "array": high, "arrayminus": low, "thickness": 1, "width": 3}


def _interval_columns(metric: str) -> list[str]:
    """The columns :func:`paretolab.stats.interval` reads for ``metric``, asked of it rather than repeated here."""
    asked: list[str] = []

    class Probe(dict):
        def __getitem__(self, key: str) -> float:
            asked.append(key)
            return 1.0

    interval(Probe(), metric)
    return asked


def _hover_template(part: pd.DataFrame, data: FrontierData, label: str) -> tuple[str, np.ndarray]:
    """Hover for a trace of many points as a plotly template over ``customdata`` (trial number first, then the
    shown parameters that vary), formatted by the browser: no string is built per point here. A parameter
    that is the same for every point of the trace is written into the template."""
    lines = [f"trial %{{customdata[0]}} · {label}", f"{data.x} = %{{x:.5g}}", f"{data.y} = %{{y:.5g}}"]
    columns: list[np.ndarray] = [part["number"].to_numpy(dtype=float)]
    for column in ([data.z] if data.z else []) + list(data.params):
        values = part[column]
        present = values[values.notna()]
        if present.empty:
            continue
        name = column.removeprefix("param:")
        numeric = pd.api.types.infer_dtype(present, skipna=True) in ("floating", "integer", "mixed-integer-float")
        if column != data.z and len(present) == len(values) and present.nunique() == 1:
            value = present.iloc[0]
            lines.append(f"{name} = {value:.4g}" if isinstance(value, float) else f"{name} = {value}")
        elif numeric:
            columns.append(pd.to_numeric(values, errors="coerce").to_numpy(dtype=float))
            lines.append(f"{name} = %{{customdata[{len(columns) - 1}]:{'.5g' if column == data.z else '.4g'}}}")
        else:
            columns.append(values.astype(str).to_numpy(dtype=object))
            lines.append(f"{name} = %{{customdata[{len(columns) - 1}]}}")
    simulated = part["simulated"].fillna("")
    if len(simulated) and (simulated != "").all() and simulated.nunique() == 1:
        lines.append(f"<i>cost simulated by: {simulated.iloc[0]}</i>")
    stacked = np.column_stack(columns) if all(c.dtype != object for c in columns) else np.column_stack([c.astype(object) for c in columns])
    return "<br>".join(lines) + "<extra></extra>", stacked


def _hover(points: pd.DataFrame, metrics: list[str], params: list[str]) -> pd.Series:
    if points.empty:
        return pd.Series([], index=points.index, dtype=object)
    text = "trial " + points["number"].astype(str) + " · " + points["methods"].astype(str)
    for metric in metrics:
        text = text + f"<br>{metric} = " + points[metric].map(lambda v: f"{v:.5g}")
    for column in params:
        values = points[column]
        shown = values.map(lambda v: "" if v is None or v != v else f"<br>{column.removeprefix('param:')} = {v:.4g}" if isinstance(v, float) else f"<br>{column.removeprefix('param:')} = {v}")
        text = text + shown
    simulated = points["simulated"].fillna("")
    text = text + np.where(simulated != "", "<br><i>cost simulated by: " + simulated + "</i>", "")
    if "feasible" not in points or points["feasible"].all():
        return text
    because = points.get("infeasible_because", pd.Series("", index=points.index)).fillna("").astype(str)
    return text + np.where(~points["feasible"], "<br><b>infeasible</b>: " + because, "")


def step_shape(x_direction: str) -> str:
    """The staircase between frontier points sorted by x: the edge of the region they dominate."""
    return "hv" if x_direction == "minimize" else "vh"


def frontier_figure(data: FrontierData, *, log_x: bool | None = None, log_y: bool | None = None, z_as: str = "colour",
                    per_method: bool = False) -> go.Figure:
    """All complete trials coloured by method, the frontier highlighted and joined as a step line, the unmodified
    model's values as dashed lines. An axis is logarithmic when asked, or by :func:`wants_log` when not (None)."""
    auto = data.log_axes()
    log_x, log_y = auto[0] if log_x is None else log_x, auto[1] if log_y is None else log_y
    fig = go.Figure()
    scatter = go.Scattergl if len(data.points) > WEBGL_ABOVE else go.Scatter
    labels = sorted(data.points["methods"].unique())
    colours = {label: PALETTE[i % len(PALETTE)] for i, label in enumerate(labels)}
    z_values = data.points[data.z] if data.z else None
    feasible = data.points[data.points["feasible"]]
    for label, group in feasible.groupby("methods", sort=True):
        simulated = group["simulated"].fillna("").to_numpy() != ""
        # measured and simulated cost as two traces with one scalar symbol each: a per-point symbol array
        # is validated point by point by plotly (0.6 s for 10k points)
        for part, symbol, legend in ((group[~simulated], "circle", True), (group[simulated], "circle-open", not (~simulated).any())):
            if part.empty:
                continue
            marker: dict[str, Any] = {"symbol": symbol, "size": 8, "opacity": 0.75, "color": colours[label]}
            if data.z and z_as == "size":
                marker["size"] = _sizes(part[data.z], z_values)
            elif data.z:
                marker.update(color=part[data.z].to_numpy(), coloraxis="coloraxis")
            template, custom = _hover_template(part, data, str(label))
            fig.add_trace(scatter(
                x=part[data.x].to_numpy(), y=part[data.y].to_numpy(), mode="markers", name=label, legendgroup=label, showlegend=legend,
                marker=marker, customdata=custom, hovertemplate=template,
                error_x=error_bars(part, data.x), error_y=error_bars(part, data.y),
            ))
    _infeasible_trace(fig, data, scatter)
    line = {"shape": step_shape(data.directions[0])}
    if per_method:
        for label, front in data.per_method.items():
            fig.add_trace(go.Scatter(x=front[data.x], y=front[data.y], mode="lines", name=f"{label} frontier", legendgroup=label,
                                     line={**line, "color": colours.get(label, "#444"), "dash": "dot", "width": 1.5}, hoverinfo="skip"))
    front = data.front
    fig.add_trace(go.Scatter(
        x=front[data.x], y=front[data.y], mode="lines+markers", name="Pareto frontier", line={**line, "color": "black", "width": 2},
        marker={"size": 12, "color": "rgba(0,0,0,0)", "line": {"color": "black", "width": 2}},
        customdata=front["number"], hovertext=front["hover"], hoverinfo="text",
    ))
    _noise_trace(fig, data)
    if not data.reference.empty:
        ref = data.reference
        fig.add_trace(go.Scatter(x=ref[data.x], y=ref[data.y], mode="markers+text", name=REFERENCE, text=["unmodified"] * len(ref),
                                 textposition="top center", marker={"symbol": "star", "size": 16, "color": "gold", "line": {"color": "black", "width": 1}},
                                 customdata=ref["number"], hovertext=ref["hover"], hoverinfo="text"))
    _reference_lines(fig, data, log_x, log_y)
    fig.update_layout(
        xaxis_title=data.x, yaxis_title=data.y, legend_title="method", height=560, margin={"l": 10, "r": 10, "t": 30, "b": 10},
        xaxis_type="log" if log_x else "linear", yaxis_type="log" if log_y else "linear", clickmode="event+select",
    )
    if data.z and z_as != "size":
        fig.update_layout(coloraxis={"colorscale": "Viridis", "colorbar": {"title": data.z}})
    return fig


def _reference_lines(fig: go.Figure, data: FrontierData, log_x: bool, log_y: bool) -> None:
    """The unmodified model's x and y as dashed lines across the plot, each labelled: what every trial is compared to.
    Shapes take data values on a log axis; annotations take the value's log10 there."""
    point = data.reference_point()
    if point is None:
        return
    rx, ry = point
    dashed = {"dash": "dash", "color": "#555555", "width": 1}
    fig.add_shape(type="line", name=f"{REFERENCE}: {data.x}", xref="x", yref="paper", x0=rx, x1=rx, y0=0, y1=1, line=dashed, layer="below")
    fig.add_shape(type="line", name=f"{REFERENCE}: {data.y}", xref="paper", yref="y", x0=0, x1=1, y0=ry, y1=ry, line=dashed, layer="below")
    font = {"size": 11, "color": "#555555"}
    if not (log_x and rx <= 0):
        fig.add_annotation(x=np.log10(rx) if log_x else rx, xref="x", y=1, yref="paper", text=f"{REFERENCE} ({data.x} {rx:.5g})",
                           showarrow=False, xanchor="left", yanchor="top", textangle=0, font=font)
    if not (log_y and ry <= 0):
        fig.add_annotation(x=1, xref="paper", y=np.log10(ry) if log_y else ry, yref="y", text=f"{REFERENCE} ({data.y} {ry:.5g})",
                           showarrow=False, xanchor="right", yanchor="bottom", font=font)


def _infeasible_trace(fig: go.Figure, data: FrontierData, scatter: Any) -> None:
    """Trials that break a constraint: drawn, as grey crosses, so a reader sees what the bounds cost; never on the frontier."""
    bad = data.infeasible
    if bad.empty:
        return
    fig.add_trace(scatter(
        x=bad[data.x].to_numpy(), y=bad[data.y].to_numpy(), mode="markers", name=data.infeasible_label(), legendgroup="infeasible",
        marker={"symbol": "x", "size": 9, "color": INFEASIBLE_COLOUR, "opacity": 0.9},
        customdata=bad["number"].to_numpy(), hovertext=bad["hover"].to_numpy(), hoverinfo="text",
    ))


def _noise_trace(fig: go.Figure, data: FrontierData) -> None:
    """Frontier points within noise of a neighbour, crossed: their order along the frontier is not established."""
    tied = data.front[data.front["noise"] != ""] if "noise" in data.front else data.front.iloc[:0]
    if tied.empty:
        return
    fig.add_trace(go.Scatter(
        x=tied[data.x], y=tied[data.y], mode="markers", name="within noise of a neighbour",
        marker={"symbol": "x-thin-open", "size": 14, "color": "crimson", "line": {"width": 2, "color": "crimson"}},
        customdata=tied["number"], hovertext=tied["noise"], hoverinfo="text",
    ))


def _sizes(values: pd.Series, all_values: pd.Series | None) -> np.ndarray:
    lo, hi = (float(all_values.min()), float(all_values.max())) if all_values is not None else (0.0, 1.0)
    span = hi - lo or 1.0
    return 6 + 16 * (values.to_numpy(dtype=float) - lo) / span


def frontier_image(data: FrontierData, fmt: str, *, log_x: bool | None = None, log_y: bool | None = None) -> bytes:
    """The frontier plot as PNG or SVG bytes (matplotlib, no browser); axes as in :func:`frontier_figure`."""
    out = io.BytesIO()
    static_figure(data, log_x=log_x, log_y=log_y).savefig(out, format=fmt)
    return out.getvalue()


def static_figure(data: FrontierData, *, log_x: bool | None = None, log_y: bool | None = None) -> Any:
    """The matplotlib Figure behind :func:`frontier_image`: log axes by :func:`wants_log` unless given,
    the unmodified model's values as labelled dashed lines (SVG ids ``unmodified-model-x``/``-y``)."""
    auto = data.log_axes()
    log_x, log_y = auto[0] if log_x is None else log_x, auto[1] if log_y is None else log_y
    import matplotlib

    matplotlib.use("Agg", force=False)
    from matplotlib.figure import Figure

    fig = Figure(figsize=(8, 5.5), dpi=120)
    ax = fig.subplots()
    labels = sorted(data.points["methods"].unique())
    feasible = data.points[data.points["feasible"]]
    for i, label in enumerate(labels):
        group = feasible[feasible["methods"] == label]
        if group.empty:
            continue
        simulated = group["simulated"].fillna("") != ""
        colour = PALETTE[i % len(PALETTE)]
        ax.scatter(group.loc[~simulated, data.x], group.loc[~simulated, data.y], s=18, color=colour, alpha=0.75, label=label, rasterized=len(group) > WEBGL_ABOVE)
        if simulated.any():
            ax.scatter(group.loc[simulated, data.x], group.loc[simulated, data.y], s=18, facecolors="none", edgecolors=colour,
                       label=f"{label} (cost simulated)", rasterized=len(group) > WEBGL_ABOVE)
    if not data.infeasible.empty:
        ax.scatter(data.infeasible[data.x], data.infeasible[data.y], marker="x", s=24, color=INFEASIBLE_COLOUR, label=data.infeasible_label())
    front = data.points[data.points["frontier"]].sort_values([data.x, data.y])
    where = "post" if data.directions[0] == "minimize" else "pre"
    ax.step(front[data.x], front[data.y], where=where, color="black", linewidth=1.5, label="Pareto frontier")
    ax.scatter(front[data.x], front[data.y], s=60, facecolors="none", edgecolors="black")
    bars = {axis: error_bars(front, metric) for axis, metric in (("xerr", data.x), ("yerr", data.y))}
    if any(bars.values()):
        ax.errorbar(front[data.x], front[data.y], fmt="none", ecolor="black", elinewidth=0.8, capsize=2,
                    **{k: [b["arrayminus"], b["array"]] for k, b in bars.items() if b})
    if not data.reference.empty:
        ax.scatter(data.reference[data.x], data.reference[data.y], marker="*", s=200, color="gold", edgecolors="black", label=REFERENCE, zorder=5)
    point = data.reference_point()
    if point is not None:
        dashed = {"linestyle": "--", "color": "0.35", "linewidth": 1, "zorder": 1}
        ax.axvline(point[0], gid="unmodified-model-x", **dashed)
        ax.axhline(point[1], gid="unmodified-model-y", **dashed)
        ax.annotate(f"{REFERENCE} ({data.x} {point[0]:.5g})", (point[0], 1), xycoords=("data", "axes fraction"), xytext=(3, -3),
                    textcoords="offset points", ha="left", va="top", fontsize=7, color="0.35")
        ax.annotate(f"{REFERENCE} ({data.y} {point[1]:.5g})", (1, point[1]), xycoords=("axes fraction", "data"), xytext=(-3, 3),
                    textcoords="offset points", ha="right", va="bottom", fontsize=7, color="0.35")
    ax.set_xlabel(data.x)
    ax.set_ylabel(data.y)
    ax.set_xscale("log" if log_x else "linear")
    ax.set_yscale("log" if log_y else "linear")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig


def parallel_coordinates(table: pd.DataFrame) -> go.Figure:
    """One line per trial across its numeric and categorical columns (categories as ticks)."""
    dims = []
    for column in table.columns:
        if column == "number":
            continue
        values = table[column]
        numeric = pd.to_numeric(values, errors="coerce")
        if numeric.notna().all():
            dims.append({"label": column, "values": numeric})
        elif values.notna().any():
            cats = sorted({str(v) for v in values})
            codes = values.map(lambda v, c=cats: c.index(str(v)))
            dims.append({"label": column, "values": codes, "tickvals": list(range(len(cats))), "ticktext": cats})
    colour = table["number"].astype(float)
    fig = go.Figure(go.Parcoords(line={"color": colour, "colorscale": "Turbo", "showscale": True, "colorbar": {"title": "trial"}}, dimensions=dims))
    fig.update_layout(height=460, margin={"l": 60, "r": 60, "t": 60, "b": 20})
    return fig
