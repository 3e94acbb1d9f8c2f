"""Figures from the data path: the frontier (interactive plotly; its static twin is in ``static_plot``) and parallel coordinates.

``frontier_points`` computes everything a frontier plot shows as plain data; the two backends
(plotly here, matplotlib in ``static_plot``) only draw it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from paretolab.dashboard.data import NONE_METHOD
from paretolab.plugin_api.numbers import axis_scale, axis_title, metric_value, param_value, tick_labels
from paretolab.stats import interval

LOG_ABOVE = 100.0  # max/min of a metric's positive values beyond which its axis is logarithmic by default (two decades)
REFERENCE = "unmodified model"  # the label of the reference trials (method ``none`` in every stage) and of their dashed lines
INFEASIBLE_COLOUR = "#9a9a9a"  # infeasible trials: grey crosses, drawn but never on a frontier
WEBGL_ABOVE = 3000  # points; WebGL scatter beyond this, SVG below (WebGL needs a GPU or SwiftShader in the browser)
PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf")
SYMBOLS = ("circle", "square", "diamond", "triangle-up", "triangle-down", "pentagon", "hexagon", "star-triangle-up", "cross", "x")
MPL_MARKERS = {"circle": "o", "square": "s", "diamond": "D", "triangle-up": "^", "triangle-down": "v", "pentagon": "p",
               "hexagon": "h", "star-triangle-up": "2", "cross": "P", "x": "X"}  # the same shapes in matplotlib


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
    title: str = ""  # the plot's title, on the page and in the downloads

    def axis_titles(self) -> tuple[str, str]:
        """``ppl ↓``, ``size [MB] ↓``: each metric with its registered unit and better direction."""
        return axis_title(self.x, self.directions[0]), axis_title(self.y, self.directions[1])

    def scales(self) -> tuple[float, float]:
        """What each axis divides its metric by to draw it in the unit its title names (bytes are drawn in MB)."""
        return axis_scale(self.x), axis_scale(self.y)

    def method_points(self) -> pd.DataFrame:
        """The feasible trials drawn as their method's markers: the unmodified model's trials are its star instead."""
        feasible = self.points[self.points["feasible"]]
        return feasible[feasible["methods"] != NONE_METHOD] if not self.reference.empty else feasible

    def styles(self) -> dict[str, tuple[str, str]]:
        """Method label -> (colour, plotly symbol): one look per method, kept on and off the frontier, on screen and in files."""
        labels = sorted(self.points["methods"].unique())
        return {label: (PALETTE[i % len(PALETTE)], SYMBOLS[i % len(SYMBOLS)])
                for i, label in enumerate(labels)}

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
    source: Any = None,
    title: str = "",
) -> FrontierData:
    """Assemble the plot data from a complete-trial frame (infeasible trials included, to be drawn marked)
    and the frontier's trial numbers (computed over the feasible ones). ``source`` (the study's stores or a
    ``results.source`` Source) gives each frontier point its neighbours within noise, as ``paretolab frontier``
    says it (:func:`paretolab.results.read.frontier_noise`); without one the ``noise`` column is blank."""
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
    front = front.assign(noise=_within_noise(front, [x, y], source))
    keep = ["number", *wanted, "methods", "simulated", *(param_columns or []), "noise"]
    front_out = front[[c for c in keep if c in front.columns] + ["hover", "frontier"]].rename(columns=lambda c: c.removeprefix("param:"))
    return FrontierData(points, x, y, directions, z, front_out, fronts, reference, tuple(constraints), tuple(param_columns or ()), title)


def _within_noise(front: pd.DataFrame, metrics: list[str], source: Any) -> list[str]:
    """Per frontier point (sorted along the frontier): its neighbours within noise on a quality axis, by the one rule
    the CLI uses (paired on per-example scores where both runs have them)."""
    if source is None or front.empty:
        return [""] * len(front)
    from paretolab.results.read import frontier_noise

    rows = [{"trial": int(rec["number"]), "mlflow_run_id": rec.get("mlflow_run_id") or "", **{m: rec[m] for m in metrics}}
            for rec in front.to_dict("records")]
    return [n or "" for n in frontier_noise(rows, metrics, source)]


def error_bars(points: pd.DataFrame, metric: str, scale: float = 1.0) -> dict[str, Any] | None:
    """A plotly error-bar spec from each point's logged 95 % interval of ``metric`` (divided by the axis's ``scale``);
    None when no point has one."""
    needed = [c for c in _interval_columns(metric) if c != metric]
    if not needed or any(c not in points for c in needed):  # the columns ``interval`` reads are absent: no point has one
        return None
    spans = [interval(rec, metric) for rec in points[[metric, *needed]].to_dict("records")]
    if not any(spans):
        return None
    values = points[metric].to_numpy(dtype=float)
    high = np.array([s[1] if s else v for s, v in zip(spans, values)]) - values
    low = values - np.array([s[0] if s else v for s, v in zip(spans, values)])
    return {"type": "data", "symmetric": False, "array": high / scale, "arrayminus": low / scale, "thickness": 1, "width": 3}


def _interval_columns(metric: str) -> list[str]:
    """The columns :func:`paretolab.stats.interval` reads for ``metric``, asked of it rather than repeated here."""
    asked: list[str] = []

    class Probe(dict):
        def __getitem__(self, key: str) -> float:
            asked.append(key)
            return 1.0

    interval(Probe(), metric)
    return asked


def _texts(values: pd.Series, metric: str | None) -> np.ndarray:
    """Each value as the one formatter writes it (``metric_value`` for a metric, ``param_value`` for a parameter)."""
    write = (lambda v: metric_value(metric, v)) if metric else param_value
    return np.array(["" if v is None or v != v else write(v) for v in values], dtype=object)


def _hover_template(part: pd.DataFrame, data: FrontierData, label: str) -> tuple[str, np.ndarray]:
    """Hover for a trace of many points as a plotly template over ``customdata`` (trial number first, then the plotted
    values and the shown parameters that vary, each written by the one formatter). A parameter that is the same for
    every point of the trace is written into the template."""
    lines = [f"trial %{{customdata[0]}} · {label}"]
    columns: list[np.ndarray] = [part["number"].to_numpy(dtype=float)]
    for column in [data.x, data.y, *([data.z] if data.z else [])]:
        columns.append(_texts(part[column], column))
        lines.append(f"{column} = %{{customdata[{len(columns) - 1}]}}")
    for column in data.params:
        values = part[column]
        present = values[values.notna()]
        if present.empty:
            continue
        name = column.removeprefix("param:")
        if len(present) == len(values) and present.nunique() == 1:
            lines.append(f"{name} = {param_value(present.iloc[0])}")
        else:
            columns.append(_texts(values, None))
            lines.append(f"{name} = %{{customdata[{len(columns) - 1}]}}")
    simulated = part["simulated"].fillna("")
    if len(simulated) and (simulated != "").all() and simulated.nunique() == 1:
        lines.append(f"<i>cost simulated by: {simulated.iloc[0]}</i>")
    stacked = np.column_stack([c.astype(object) for c in columns])
    stacked[:, 0] = [int(n) for n in columns[0]]
    return "<br>".join(lines) + "<extra></extra>", stacked


def _hover(points: pd.DataFrame, metrics: list[str], params: list[str]) -> pd.Series:
    if points.empty:
        return pd.Series([], index=points.index, dtype=object)
    text = "trial " + points["number"].astype(str) + " · " + points["methods"].astype(str)
    for metric in metrics:
        text = text + f"<br>{metric} = " + pd.Series(_texts(points[metric], metric), index=points.index)
    for column in params:
        shown = pd.Series(_texts(points[column], None), index=points.index)
        text = text + np.where(shown != "", f"<br>{column.removeprefix('param:')} = " + shown, "")
    simulated = points["simulated"].fillna("")
    text = text + np.where(simulated != "", "<br><i>cost simulated by: " + simulated + "</i>", "")
    if "feasible" not in points or points["feasible"].all():
        return text
    because = points.get("infeasible_because", pd.Series("", index=points.index)).fillna("").astype(str)
    return text + np.where(~points["feasible"], "<br><b>infeasible</b>: " + because, "")


def decades(values: Any) -> list[float]:
    """The powers of ten spanning a log axis's positive values (one below the smallest to one above the largest)."""
    numbers = pd.to_numeric(pd.Series(values), errors="coerce").to_numpy(dtype=float)
    positive = numbers[np.isfinite(numbers) & (numbers > 0)]
    if not len(positive):
        return []
    low, high = int(np.floor(np.log10(positive.min()))), int(np.ceil(np.log10(positive.max())))
    return [10.0 ** k for k in range(low, high + 1)]


def step_shape(x_direction: str) -> str:
    """The staircase between frontier points sorted by x: the edge of the region they dominate."""
    return "hv" if x_direction == "minimize" else "vh"


def frontier_figure(data: FrontierData, *, log_x: bool | None = None, log_y: bool | None = None, z_as: str = "colour",
                    per_method: bool = False) -> go.Figure:
    """All complete trials, each method in its own colour and shape (kept on the frontier, where a dark outline marks
    the point), the frontier joined as a step line, every quality number with its 95 % interval as error bars, the
    unmodified model as a star with dashed lines and one label. Axis titles carry unit and direction (``size [MB] ↓``).
    An axis is logarithmic when asked, or by :func:`wants_log` when not (None)."""
    auto = data.log_axes()
    log_x, log_y = auto[0] if log_x is None else log_x, auto[1] if log_y is None else log_y
    sx, sy = data.scales()
    fig = go.Figure()
    scatter = go.Scattergl if len(data.points) > WEBGL_ABOVE else go.Scatter
    styles = data.styles()
    z_values = data.points[data.z] if data.z else None
    for label, group in data.method_points().groupby("methods", sort=True):
        colour, symbol = styles[label]
        simulated = group["simulated"].fillna("").to_numpy() != ""
        # measured and simulated cost as two traces with one scalar symbol each: a per-point symbol array
        # is validated point by point by plotly (0.6 s for 10k points)
        for part, shape, legend in ((group[~simulated], symbol, True), (group[simulated], f"{symbol}-open", not (~simulated).any())):
            if part.empty:
                continue
            on_front = part["frontier"].to_numpy()
            marker: dict[str, Any] = {"symbol": shape, "size": np.where(on_front, 12, 8), "opacity": 0.85, "color": colour,
                                      "line": {"color": np.where(on_front, "#111111", colour).tolist(), "width": np.where(on_front, 2, 0.5)}}
            if data.z and z_as == "size":
                marker["size"] = _sizes(part[data.z], z_values)
            elif data.z:
                marker.update(color=part[data.z].to_numpy(), coloraxis="coloraxis")
            template, custom = _hover_template(part, data, str(label))
            bars = {f"error_{axis}": {**b, "color": colour} if (b := error_bars(part, metric, scale)) else None
                    for axis, metric, scale in (("x", data.x, sx), ("y", data.y, sy))}
            fig.add_trace(scatter(
                x=part[data.x].to_numpy() / sx, y=part[data.y].to_numpy() / sy, mode="markers", name=label, legendgroup=label,
                showlegend=legend, marker=marker, customdata=custom, hovertemplate=template, **bars,
            ))
    _infeasible_trace(fig, data, scatter)
    line = {"shape": step_shape(data.directions[0])}
    if per_method:
        for label, front in data.per_method.items():
            fig.add_trace(go.Scatter(x=front[data.x] / sx, y=front[data.y] / sy, mode="lines", name=f"{label} frontier", legendgroup=label,
                                     line={**line, "color": styles.get(label, ("#444", ""))[0], "dash": "dot", "width": 1.5}, hoverinfo="skip"))
    front = data.front
    fig.add_trace(go.Scatter(
        x=front[data.x] / sx, y=front[data.y] / sy, mode="lines", name="Pareto frontier", line={**line, "color": "#111111", "width": 1.5},
        customdata=front["number"], hovertext=front["hover"], hoverinfo="skip",
    ))
    if not data.reference.empty:
        ref = data.reference
        fig.add_trace(go.Scatter(x=ref[data.x] / sx, y=ref[data.y] / sy, mode="markers", name=REFERENCE,
                                 marker={"symbol": "star", "size": 16, "color": "gold", "line": {"color": "black", "width": 1}},
                                 customdata=ref["number"], hovertext=ref["hover"], hoverinfo="text"))
    _reference_lines(fig, data, log_x, log_y)
    x_title, y_title = data.axis_titles()
    fig.update_layout(
        xaxis_title=x_title, yaxis_title=y_title, legend_title="method", height=560, margin={"l": 10, "r": 10, "t": 50 if data.title else 30, "b": 10},
        xaxis_type="log" if log_x else "linear", yaxis_type="log" if log_y else "linear", clickmode="event+select",
        xaxis_exponentformat="none", yaxis_exponentformat="none",
    )
    for axis, log, column, scale in (("xaxis", log_x, data.x, sx), ("yaxis", log_y, data.y, sy)):
        if log:  # decades labelled by the one formatter in one notation, as the PNG/SVG label them (10, 100, 1k, 10k, 100k, 1M)
            values = decades(data.points[column] / scale)
            fig.update_layout({axis: {"tickvals": values, "ticktext": tick_labels(values)}})
        elif np.nanmax(np.abs(pd.to_numeric(data.points[column], errors="coerce").to_numpy(dtype=float) / scale), initial=0) >= 1e6:
            fig.update_layout({axis: {"tickformat": "~s"}})  # an axis reaching a million: 200k, 1M, 1.5G, as tick_labels writes them
    if data.title:
        fig.update_layout(title={"text": data.title, "x": 0.01, "xanchor": "left"})
    if data.z and z_as != "size":
        fig.update_layout(coloraxis={"colorscale": "Viridis", "colorbar": {"title": axis_title(data.z)}})
    return fig


def _reference_lines(fig: go.Figure, data: FrontierData, log_x: bool, log_y: bool) -> None:
    """The unmodified model's x and y as dashed lines across the plot and one label beside its star: what every trial
    is compared to (its values are in the star's hover and the table). Shapes take data values on a log axis;
    annotations take the value's log10 there."""
    point = data.reference_point()
    if point is None:
        return
    sx, sy = data.scales()
    rx, ry = point[0] / sx, point[1] / sy
    dashed = {"dash": "dash", "color": "#555555", "width": 1}
    fig.add_shape(type="line", name=f"{REFERENCE}: {data.x}", xref="x", yref="paper", x0=rx, x1=rx, y0=0, y1=1, line=dashed, layer="below")
    fig.add_shape(type="line", name=f"{REFERENCE}: {data.y}", xref="paper", yref="y", x0=0, x1=1, y0=ry, y1=ry, line=dashed, layer="below")
    if (log_x and rx <= 0) or (log_y and ry <= 0):
        return
    fig.add_annotation(x=np.log10(rx) if log_x else rx, y=np.log10(ry) if log_y else ry, xref="x", yref="y", text=REFERENCE,
                       showarrow=False, xanchor="left", yanchor="bottom", xshift=10, yshift=4,
                       font={"size": 11, "color": "#555555"}, bgcolor="rgba(255,255,255,0.7)")


def _infeasible_trace(fig: go.Figure, data: FrontierData, scatter: Any) -> None:
    """Trials that break a constraint: drawn, as grey crosses, so a reader sees what the bounds cost; never on the frontier."""
    bad = data.infeasible
    if bad.empty:
        return
    sx, sy = data.scales()
    fig.add_trace(scatter(
        x=bad[data.x].to_numpy() / sx, y=bad[data.y].to_numpy() / sy, mode="markers", name=data.infeasible_label(), legendgroup="infeasible",
        marker={"symbol": "x", "size": 9, "color": INFEASIBLE_COLOUR, "opacity": 0.9},
        customdata=bad["number"].to_numpy(), hovertext=bad["hover"].to_numpy(), hoverinfo="text",
    ))


def _sizes(values: pd.Series, all_values: pd.Series | None) -> np.ndarray:
    lo, hi = (float(all_values.min()), float(all_values.max())) if all_values is not None else (0.0, 1.0)
    span = hi - lo or 1.0
    return 6 + 16 * (values.to_numpy(dtype=float) - lo) / span


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
