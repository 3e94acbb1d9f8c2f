"""Pages that need no single study's trials: Studies, Methods, Cluster."""

from __future__ import annotations

from urllib.parse import quote

import pandas as pd
import streamlit as st

from paretolab.dashboard.claims_panel import study_claims
from paretolab.dashboard.context import Context, describe_methods, describe_metrics, label
from paretolab.data.names import printable


def no_studies(ctx: Context) -> None:
    st.info(
        f"No studies in {ctx.stores.redacted().optuna_url} yet. Run one with `paretolab run pipelines/smoke.yaml` "
        "(about a minute), or point the dashboard at other stores with `--home`, `--storage` and `--tracking-uri`."
    )


def frontier_link(study: str) -> str:
    """The Frontier page of ``study``, as a link relative to the app's own address (the query string the app reads)."""
    return f"?page=Frontier&study={quote(study)}"


def studies_page(ctx: Context) -> None:
    st.header("Studies")
    st.caption(f"Optuna: {ctx.stores.redacted().optuna_url} · MLflow: {ctx.stores.redacted().tracking_uri}")
    if not ctx.studies:
        no_studies(ctx)
        return
    rare = [state for state in ("PRUNED", "WAITING") if any(s.counts.get(state) for s in ctx.studies)]  # columns only where some study has one
    rows = []
    for s in ctx.studies:
        rows.append({
            "study": frontier_link(s.name),
            "status": s.status,
            "claims": study_claims(ctx.stores, s),
            "complete": s.counts.get("COMPLETE", 0),
            "failed": s.counts.get("FAIL", 0),
            "running": s.counts.get("RUNNING", 0),
            **{state.lower(): s.counts.get(state, 0) for state in rare},
            "progress": s.finished / s.planned if s.planned else 0.0,
            "planned": s.planned,
            "objectives": printable(", ".join(f"{m} {ARROW.get(d[:3], '')}".strip() for m, d in s.objectives)),
            "model": printable(s.model),
            "methods": printable(_short_list(s.methods)),
            "last update": s.last_update,
        })
    # sized to fit beside the sidebar on a 1,280 px screen: narrow counts, the long lists cut (the Frontier has them whole)
    st.dataframe(
        pd.DataFrame(rows),
        hide_index=True,
        width="stretch",
        column_config={
            "study": st.column_config.LinkColumn("study", help="open the study's Frontier", display_text=r"study=([^&]+)$", width="medium"),
            "status": st.column_config.TextColumn("status", help="as `paretolab studies` says it; an interrupted study resumes with `paretolab run PIPELINE --resume`"),
            "claims": st.column_config.TextColumn("claims", help="the verdicts of the pipeline's claims, as `paretolab report` gives them (one per claim and setting; the Frontier has them whole)"),
            **{c: st.column_config.NumberColumn(c, width="small") for c in ("complete", "failed", "running", "planned", *(r.lower() for r in rare))},
            "progress": st.column_config.ProgressColumn("progress", help="finished trials / planned (search.trials)", min_value=0.0, max_value=1.0, format="percent", width="small"),
            "last update": st.column_config.DatetimeColumn("last update (UTC)", format="MM-DD HH:mm"),
        },
    )
    for s in ctx.studies:
        if s.status_hint:
            st.caption(f"{label(s.name)}: {printable(s.status_hint)}")  # the hint is our own Markdown (`commands`)
    st.caption("A study's name opens its Frontier; the sidebar picks the study for the other pages.")


ARROW = {"min": "↓", "max": "↑"}


def _short_list(names: list[str], keep: int = 3) -> str:
    return ", ".join(names[:keep]) + (f" +{len(names) - keep}" if len(names) > keep else "")


def methods_page(ctx: Context) -> None:
    st.header("Methods")
    try:
        methods = describe_methods()
        metrics = describe_metrics()
    except Exception as exc:
        st.error(f"The plugins could not be loaded: {exc}")
        return
    st.caption("Every method the installed plugins register. `cost` says whether the saving is real (a stored format or a kernel that runs) or simulated.")
    st.dataframe(pd.DataFrame(methods), hide_index=True, width="stretch")
    st.subheader("Metrics")
    st.dataframe(pd.DataFrame(metrics), hide_index=True, width="stretch")


def cluster_page(ctx: Context) -> None:
    st.header("Cluster")
    if not ctx.address:
        st.info(
            "local: no Ray cluster address was given, so studies run on a local Ray that `paretolab run` starts and stops. "
            "Start the dashboard with `--address HEAD:6379` to see a cluster's nodes, resources and jobs."
        )
        return
    from paretolab.dashboard.cluster import cluster_info

    try:
        info = cluster_info(ctx.address)
    except Exception as exc:
        st.error(f"Could not reach the Ray cluster at {ctx.address!r}: {type(exc).__name__}: {exc}")
        return
    st.write(f"Connected to **{info.address}** · {sum(n['alive'] for n in info.nodes)} node(s) alive")
    resources = pd.DataFrame({"total": pd.Series(info.total), "available": pd.Series(info.available)}).fillna(0.0)
    st.subheader("Resources")
    st.dataframe(resources, width="stretch")
    st.subheader("Nodes")
    st.dataframe(pd.DataFrame(info.nodes), hide_index=True, width="stretch")
    st.subheader("Jobs")
    if info.jobs:
        st.dataframe(pd.DataFrame(info.jobs), hide_index=True, width="stretch")
    elif info.jobs_error:
        st.caption(f"Jobs are not available from this cluster: {info.jobs_error}")
    else:
        st.caption("No jobs.")
