"""The Frontier page: two metrics (a third as colour or size), every trial, the non-dominated feasible ones joined
(trials that break the study's constraints are drawn as grey crosses, never on the frontier)."""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go
import streamlit as st
from streamlit.delta_generator import DeltaGenerator

from paretolab.dashboard.claims_panel import claims_panel, ring_compared, verdicts
from paretolab.dashboard.context import Context, file_part, label
from paretolab.dashboard.configurations import configuration_means, replicate_columns
from paretolab.dashboard.pick_panel import decide_panel, mark_decision
from paretolab.results.replicates import DEFAULT_REPLICATES
from paretolab.dashboard.data import feasible_rows, frontier_numbers
from paretolab.dashboard.tables import frontier_table
from paretolab.dashboard.plots import (
    FrontierData,
    frontier_figure,
    frontier_points,
)
from paretolab.dashboard.static_plot import frontier_image
from paretolab.dashboard.view_engines import gap_column
from paretolab.models import quality_note

NO_Z = "(none)"
MAX_TRIAL_BUTTONS = 24
MLFLOW_METRICS_UP_TO = 2000  # trials


def open_trial(number: int) -> None:
    """Button callback: switch to the Trial page on ``number``."""
    st.session_state["page"] = "Trial"
    st.session_state["trial"] = int(number)


def frontier_page(ctx: Context) -> None:
    assert ctx.study is not None
    table = ctx.table
    st.header(f"Frontier · {label(ctx.study.name)}")
    note = quality_note(ctx.study.model, ctx.study.pipeline)
    if note:
        st.warning(note)
    failed = int((table.frame["state"] == "FAIL").sum())
    done = table.complete()
    if done.empty:
        st.info(f"Study '{label(ctx.study.name)}' has no completed trials yet ({len(table.frame)} trial(s) in all, {failed} failed).")
        return
    objectives = [m for m, _ in table.objectives]
    # Every MLflow metric can be an axis; reading them is a second store read, so on by default only for smaller studies.
    use_runs = st.toggle("offer every MLflow metric", value=len(table.frame) <= MLFLOW_METRICS_UP_TO or len(objectives) < 2, key="fruns")
    frame = ctx.merged() if use_runs else table.frame
    choices = ctx.numeric_metrics(frame[frame["state"] == "COMPLETE"])
    if len(choices) < 2:
        st.info(f"Study '{label(ctx.study.name)}' reports only {choices[0] if choices else 'no metric'}; a frontier needs two metrics.")
        return
    c1, c2, c3, c4 = st.columns([3, 3, 3, 2])
    x = c1.selectbox("x", _keep("fx", choices), index=0, key="fx")
    y = c2.selectbox("y", _keep("fy", [m for m in choices if m != x]), index=0, key="fy")
    z = c3.selectbox("third metric", _keep("fz", [NO_Z, *[m for m in choices if m not in (x, y)]]), key="fz")
    z_as = c4.radio("third as", ["colour", "size"], key="fz_as", horizontal=True, disabled=z == NO_Z)
    t1, t2, t3 = st.columns(3)
    per_method = t3.toggle("one frontier per method", key="fper")

    directions = (ctx.direction(x), ctx.direction(y))
    z_metric = None if z == NO_Z else z
    # Plot data and figure are kept with the cached trial table: a repaint of an unchanged study rebuilds neither.
    key = ("frontier", x, y, z_metric, per_method, use_runs)
    data = table.memo(key, lambda: _plot_data(ctx, frame, x, y, directions, z_metric, per_method))
    auto_x, auto_y = table.memo((*key, "log"), data.log_axes)
    log_x = log_toggle(t1, "x", ctx.study.name, x, auto_x)
    log_y = log_toggle(t2, "y", ctx.study.name, y, auto_y)
    judged, _ = verdicts(ctx.stores, ctx.study)  # the trials each verdict compares, ringed on the kept figure
    fig = table.memo((*key, log_x, log_y, z_as), lambda: ring_compared(
        frontier_figure(data, log_x=log_x, log_y=log_y, z_as=z_as, per_method=per_method), data, judged))
    decision = decide_panel(ctx)
    if decision is not None:  # marked on a copy: the kept figure stays as the memo holds it
        fig = mark_decision(go.Figure(fig), data, decision)
    event = st.plotly_chart(fig, key="frontier_chart", on_select="rerun", selection_mode="points", width="stretch")
    _notes(ctx, data, failed, len(done), (log_x, log_y))
    provenance_caption(frame, [x, y, *([z_metric] if z_metric else [])])
    _selected(event)
    claims_panel(ctx)
    _downloads(ctx, data, log_x, log_y)
    _frontier_table(data)


FLIPS = "flog_flips"  # session state: (study, metric) -> log scale as the user last set it


def log_toggle(column: DeltaGenerator, axis: str, study: str, metric: str, automatic: bool) -> bool:
    """The "log x"/"log y" toggle: on by default when the metric spans more than two decades (``plots.wants_log``);
    a user's flip is kept for that study and metric, across reruns and axis changes."""
    key = f"flog{axis}"
    st.session_state[key] = st.session_state.setdefault(FLIPS, {}).get((study, metric), automatic)
    return column.toggle(f"log {axis}", key=key, on_change=_remember_flip, args=(key, study, metric),
                         help=f"default: {'on' if automatic else 'off'}, log scale when a metric's positive values span more than two decades")


def _remember_flip(key: str, study: str, metric: str) -> None:
    st.session_state.setdefault(FLIPS, {})[(study, metric)] = bool(st.session_state[key])


def _keep(key: str, options: list[str]) -> list[str]:
    """Forget a remembered choice that this study (or the other axes) no longer offers."""
    if key in st.session_state and st.session_state[key] not in options:
        del st.session_state[key]
    return options


def _plot_data(ctx: Context, frame: pd.DataFrame, x: str, y: str, directions: tuple[str, str], z: str | None, per_method: bool) -> FrontierData:
    table = ctx.table
    complete = frame[frame["state"] == "COMPLETE"]
    params = table.param_columns
    means = configuration_means(complete, params, [m for m in (x, y, z) if m and m in complete])
    if means is not None:  # draws of fewer configurations: each at its replicates' mean, the frontier over the means
        params = [*(c for c in params if c not in replicate_columns(complete, params)), "trials"]
        complete = means
        front = frontier_numbers(feasible_rows(complete), [x, y], list(directions))
        own = frontier_numbers(feasible_rows(complete), [x, y], list(directions), "methods") if per_method else None
    elif {x, y} <= {m for m, _ in table.objectives}:
        front = table.frontier([x, y], directions)
        own = table.frontier([x, y], directions, by="methods") if per_method else None
    else:  # over the trials that meet the study's constraints; the infeasible ones are still drawn, marked
        front = frontier_numbers(feasible_rows(complete), [x, y], list(directions))
        own = frontier_numbers(feasible_rows(complete), [x, y], list(directions), "methods") if per_method else None
    return frontier_points(complete, front, x=x, y=y, directions=directions, z=z, per_method=own, param_columns=params,
                           constraints=table.study.constraints, source=ctx.stores, title=f"{table.study.name}: {y} against {x}")


def _notes(ctx: Context, data: FrontierData, failed: int, complete: int, logs: tuple[bool, bool]) -> None:
    parts = [f"{complete} complete trial(s), {len(data.front)} on the frontier ({', '.join(data.directions)})"]
    if data.constraints:
        parts.append(f"feasible frontier under: {'; '.join(data.constraints)}; {len(data.infeasible)} infeasible trial(s) "
                     "drawn as grey ×, never on it (hover one for why)")
    if failed:
        parts.append(f"{failed} failed trial(s) not shown (see the Trial page for reasons)")
    pruned = int((ctx.table.frame["state"] == "PRUNED").sum())
    if pruned:
        parts.append(f"{pruned} pruned trial(s) not shown: stopped early, never on a frontier (their curves are on the Curves page)")
    simulated = sorted({m for s in data.points["simulated"].fillna("") for m in s.split(",") if m})
    if simulated:
        parts.append(f"hollow markers: cost saving simulated by {', '.join(simulated)} (not a deployable format)")
    parts += _uncertainty_notes(data)
    if data.reference.empty:
        parts.append("no trial of the unmodified model (method `none` in every stage) to show as reference")
    else:
        parts.append(f"star and dashed lines: the unmodified model (trial {int(data.reference['number'].min())})")
    parts.append("outlined markers: the Pareto frontier")
    for metric, log in zip((data.x, data.y), logs):
        hidden = int((data.points[metric] <= 0).sum()) if log else 0
        if hidden:
            parts.append(f"{hidden} trial(s) with {metric} <= 0 not drawn on the log axis (turn log off to see them)")
    parts += replicate_note(data.points, ctx.table.param_columns)
    st.caption(" · ".join(parts))


def replicate_note(points: pd.DataFrame, param_columns: list[str]) -> list[str]:
    """Say on the plot when its points are configurations averaged over draws (seeds, calibration draws, splits)."""
    if "draws" not in points:
        return []
    names = ", ".join(sorted({c.split(".")[-1] for c in param_columns if c.split(".")[-1] in DEFAULT_REPLICATES})) or "replicates"
    return [f"each point is a configuration at the mean over its draws ({names}; up to {int(points['draws'].max())} a "
            "configuration), the frontier drawn over the means, as `paretolab frontier` lists it; hover for its trials"]


def provenance_caption(frame: pd.DataFrame, shown: list[str]) -> None:
    """The base model's weights, and a mark when a shown energy is an estimate (from the trials' MLflow tags)."""
    parts = []
    weights = sorted(set(frame.get("paretolab.weights", pd.Series(dtype=object)).dropna()) - {""})
    if weights:
        parts.append(f"base weights: {', '.join(weights)}")
    sources = frame.get("paretolab.energy_source", pd.Series(dtype=object))
    from paretolab.measure.energy import is_energy_metric

    if any(is_energy_metric(m) for m in shown) and (sources == "estimate").any():
        parts.append("energy is an estimate (CPU seconds × watts per core: no NVML or RAPL reading) for "
                     f"{int((sources == 'estimate').sum())} trial(s)")
    if parts:
        st.caption(" · ".join(parts))


def _uncertainty_notes(data: FrontierData) -> list[str]:
    notes = []
    if any(c in data.points for c in ("ppl_ci_low", "acc_stderr", "acc_norm_stderr")):
        notes.append("error bars: 95 % interval of each quality number (ppl: bootstrap over windows; acc: ±1.96 standard errors)")
    tied = int((data.front["noise"] != "").sum()) if "noise" in data.front else 0
    if tied:
        notes.append(f"{tied} frontier point(s) within noise of a neighbour (column `noise` below; paired on per-example "
                     "scores where both trials have them, as `paretolab frontier` says it)")
    return notes


def _selected(event: object) -> None:
    points = getattr(getattr(event, "selection", None), "points", None) or []
    numbers = sorted({int(_trial_of(p["customdata"])) for p in points if isinstance(p, dict) and p.get("customdata") is not None})
    if numbers:
        st.button(f"Open trial {numbers[0]}", key="open_selected", on_click=open_trial, args=(numbers[0],), type="primary")


def _trial_of(customdata: object) -> object:
    """A point's trial number: its customdata, or the first entry of it (many-point traces carry hover values after it)."""
    return customdata[0] if isinstance(customdata, (list, tuple)) else customdata


def _downloads(ctx: Context, data: FrontierData, log_x: bool, log_y: bool) -> None:
    assert ctx.study is not None
    name = f"{file_part(ctx.study.name)}_{data.x}_vs_{data.y}"
    d1, d2, d3 = st.columns(3)
    d1.download_button("Frontier CSV", data.csv(), file_name=f"{name}_frontier.csv", mime="text/csv", key="dl_csv")
    # Images render only when clicked (a callable): matplotlib on 10k points takes longer than a repaint may.
    d2.download_button("Plot PNG", lambda: frontier_image(data, "png", log_x=log_x, log_y=log_y), file_name=f"{name}.png", mime="image/png", key="dl_png")
    d3.download_button("Plot SVG", lambda: frontier_image(data, "svg", log_x=log_x, log_y=log_y), file_name=f"{name}.svg", mime="image/svg+xml", key="dl_svg")


def _frontier_table(data: FrontierData) -> None:
    st.subheader("Frontier trials")
    shown = frontier_table(gap_column(data.front), data.shown, [c.removeprefix("param:") for c in data.params])
    st.dataframe(shown, hide_index=True, width="stretch")
    numbers = shown["number"].to_numpy()[:MAX_TRIAL_BUTTONS]
    if len(numbers):
        cols = st.columns(min(len(numbers), 8))
        for i, number in enumerate(numbers):
            cols[i % len(cols)].button(f"Trial {int(number)}", key=f"open_{int(number)}", on_click=open_trial, args=(int(number),))

