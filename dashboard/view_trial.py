"""The Trial page (one trial in full, and how to reproduce it) and the Compare page (trials side by side)."""

from __future__ import annotations

import shlex
from typing import Any

import pandas as pd
import streamlit as st

from paretolab.dashboard import runs
from paretolab.dashboard.claims_panel import trial_claims
from paretolab.dashboard.context import Context, file_part, label
from paretolab.dashboard.layers import group_table, module_table
from paretolab.dashboard.plots import parallel_coordinates
from paretolab.dashboard.reproduce import reproduce_yaml
from paretolab.dashboard.tables import compare_table, key_values
from paretolab.plugin_api.numbers import axis_scale, axis_title
from paretolab.plugin_api.numbers import number as number_text
from paretolab.dashboard.view_engines import engine_section
from paretolab.data.names import printable

TRACEBACK = "traceback.txt"


def trial_page(ctx: Context) -> None:
    assert ctx.study is not None
    frame = ctx.table.frame
    st.header(f"Trial · {label(ctx.study.name)}")
    if frame.empty:
        st.info(f"Study '{label(ctx.study.name)}' has no trials yet.")
        return
    numbers = frame["number"].tolist()
    if st.session_state.get("trial") not in numbers:
        st.session_state["trial"] = numbers[0]
    number = st.selectbox("trial", numbers, key="trial", format_func=lambda n: _label(frame, n))
    row = frame[frame["number"] == number].iloc[0]
    params = {c.removeprefix("param:"): _plain(row[c]) for c in ctx.table.param_columns if _present(row[c])}
    objectives = {m: row[m] for m, _ in ctx.table.objectives}

    a, b, c = st.columns(3)
    a.metric("state", str(row["state"]))
    b.metric("methods", str(row["methods"]))
    c.metric("finished", "" if pd.isna(row["datetime_complete"]) else str(row["datetime_complete"])[:19])
    if row["fail_reason"]:
        st.error(f"Failed: {label(row['fail_reason'])}")
    if row["simulated"]:
        st.warning(f"The cost saving of {row['simulated']} is simulated in this trial (no deployable format or kernel ran).")
    if not row.get("feasible", True):
        st.warning(f"Infeasible: {label(row.get('infeasible_because') or 'breaks a bound')}. It stays off every frontier "
                   f"(constraints: {'; '.join(ctx.study.constraints) or 'not recorded'}).")
    if _present(row.get("pruned_at_step")):
        st.info(f"Pruned at step {row['pruned_at_step']}: the study's pruner stopped it early. Never on a frontier; its curve is on the Curves page.")
    trial_claims(ctx, int(number))

    detail = _run_detail(ctx, str(row["mlflow_run_id"]))
    left, right = st.columns(2)
    with left:
        st.subheader("Parameters")
        st.dataframe(key_values(params or {"(none)": ""}), hide_index=True, width="stretch")
        groups = group_table(params)
        if not groups.empty:
            st.caption("Per layer group (the stage's `layers:`; modules in no group ran with the stage's parameters):")
            st.dataframe(groups, hide_index=True, width="stretch")
        if detail and detail.params:
            with st.expander("all parameters as run (MLflow)"):
                st.dataframe(key_values(detail.params), hide_index=True, width="stretch")
    with right:
        st.subheader("Metrics")
        metrics = dict(detail.metrics) if detail else {}
        shown = {**{k: v for k, v in metrics.items() if not k.startswith(("stage_s.", "stage_energy_j."))}, **{k: v for k, v in objectives.items() if pd.notna(v)}}
        st.dataframe(key_values(shown or {"(none)": ""}, metrics=True), hide_index=True, width="stretch")
    if detail is not None:
        engine_section(detail.metrics, detail.params)
    stages = {k.removeprefix("stage_s."): v for k, v in (detail.metrics if detail else {}).items() if k.startswith("stage_s.")}
    if stages:
        st.subheader("Stage timings (s)")
        st.bar_chart(pd.Series(stages, name="seconds"), horizontal=True)
    if detail is not None:
        _energy_and_provenance(detail)
    if detail is None:
        st.caption("No MLflow run recorded for this trial (it may still be running, or the MLflow store is elsewhere).")
    else:
        _tags_and_artifacts(ctx, detail)
    st.subheader("Reproduce")
    text = reproduce_yaml(ctx.study.pipeline, params, study=ctx.study.name, number=int(number))
    st.code(text, language="yaml")
    st.download_button("Download pipeline YAML", text, file_name=f"{file_part(ctx.study.name)}-trial{number}.yaml", mime="text/yaml", key="dl_yaml")
    if str(row["state"]) == "COMPLETE":
        st.subheader("Export the model")
        st.code(f"paretolab export {shlex.quote(printable(ctx.study.name))} {number} --out {file_part(ctx.study.name)}-trial{number}", language="bash")
        st.caption("Re-applies this trial (same params, seed, calibration), checks its quality against the recorded one and "
                   "writes a directory transformers loads, with a compact form where the method has one; give the store flags "
                   "`paretolab dashboard` got. From Python: `paretolab.export(...)`, or `paretolab.apply(model, method, **params)`.")


def _energy_and_provenance(detail: runs.RunDetail) -> None:
    """Energy per stage with its source (estimates marked), and what the base model's weights are."""
    energy = {k.removeprefix("stage_energy_j."): v for k, v in detail.metrics.items() if k.startswith("stage_energy_j.")}
    source = detail.tags.get("paretolab.energy_source") or detail.params.get("info.energy_source", "")
    if energy:
        estimated = " — an estimate: CPU seconds × watts per core (no NVML or RAPL reading)" if source == "estimate" else ""
        st.subheader(f"Energy per stage (J, {source or 'source unknown'}){estimated}")
        st.bar_chart(pd.Series(energy, name="joules"), horizontal=True)
    weights = detail.tags.get("paretolab.weights") or detail.params.get("info.weights")
    if weights:
        stored, fp16 = detail.params.get("info.base_stored_bytes"), detail.params.get("info.base_fp16_bytes")
        sizes = f" (stored {number_text(float(stored), 'bytes')}; {number_text(float(fp16), 'bytes')} in fp16)" if stored and fp16 else ""
        st.caption(f"Base model weights: {weights}{sizes}")


def _tags_and_artifacts(ctx: Context, detail: runs.RunDetail) -> None:
    with st.expander("tags"):
        st.dataframe(key_values({k: v for k, v in sorted(detail.tags.items()) if not k.startswith("mlflow.")}), hide_index=True, width="stretch")
    files = runs.list_artifacts(ctx.stores.tracking_uri, detail)
    if TRACEBACK in files:
        st.subheader("Traceback")
        st.code(runs.read_artifact(ctx.stores.tracking_uri, detail, TRACEBACK).decode(errors="replace"), language="python")
    for path in (f for f in files if f.startswith("layers.") and f.endswith(".json")):
        st.subheader(f"Per-layer assignment ({path})")
        st.dataframe(module_table(runs.read_artifact(ctx.stores.tracking_uri, detail, path)), hide_index=True, width="stretch")
    if files:
        st.subheader("Artifacts")
        for i, path in enumerate(files):
            st.download_button(path, lambda p=path: runs.read_artifact(ctx.stores.tracking_uri, detail, p), file_name=path.rsplit("/", 1)[-1], key=f"art_{i}")


def compare_page(ctx: Context) -> None:
    assert ctx.study is not None
    st.header(f"Compare · {label(ctx.study.name)}")
    table = ctx.table
    if table.frame.empty:
        st.info(f"Study '{label(ctx.study.name)}' has no trials yet.")
        return
    frame = ctx.merged()
    numbers = frame["number"].tolist()
    metrics = [m for m, _ in table.objectives]
    default = table.frontier(metrics, [d for _, d in table.objectives]).tolist()[:4] if len(metrics) >= 1 else []
    chosen = st.multiselect("trials", numbers, default=default or numbers[:2], key="compare")
    if not chosen:
        st.info("Pick trials to compare.")
        return
    rows = frame[frame["number"].isin(chosen)].set_index("number").loc[chosen]
    fields = ["state", "methods", "simulated", *table.param_columns, *ctx.numeric_metrics(frame)]
    st.dataframe(compare_table(rows, [f for f in fields if f in rows.columns], table.param_columns), width="stretch")
    if len(chosen) >= 2:
        # by default the study's objectives and its searched params only (every MLflow metric made ~30 unreadable axes);
        # any other metric is the user's choice
        others = [m for m in ctx.numeric_metrics(frame) if m not in metrics]
        extra = st.multiselect("more metrics on the parallel coordinates", others, key="pc_metrics")
        titles = {m: axis_title(m, ctx.direction(m)) for m in [*metrics, *extra]}
        shown = [c for c in [*table.param_columns, *metrics, *extra] if c in rows.columns and rows[c].notna().any()]
        coords = rows[shown].apply(lambda col: col / axis_scale(col.name) if col.name in titles else col)  # bytes drawn in MB, as titled
        coords = coords.rename(columns=lambda c: titles.get(c, c.removeprefix("param:"))).reset_index()
        st.plotly_chart(parallel_coordinates(coords), key="parcoords", width="stretch")


def _run_detail(ctx: Context, run_id: str) -> runs.RunDetail | None:
    try:
        return runs.run_detail(ctx.stores.tracking_uri, run_id)
    except Exception as exc:
        st.warning(f"Could not read the trial's MLflow run: {type(exc).__name__}: {exc}")
        return None


def _label(frame: pd.DataFrame, number: int) -> str:
    row = frame[frame["number"] == number].iloc[0]
    return f"{number} · {row['state'].lower()} · {row['methods']}"


def _present(value: Any) -> bool:
    return value is not None and not (isinstance(value, float) and value != value)


def _plain(value: Any) -> Any:
    return value.item() if hasattr(value, "item") else value
