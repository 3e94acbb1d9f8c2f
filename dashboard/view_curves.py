"""The Curves page: a training study's learning curves (loss against tokens or FLOPs), seeds grouped; pruned trials'
curves drawn too, faded and dotted, each up to where the study's pruner stopped it."""

from __future__ import annotations

from typing import Any

import pandas as pd
import streamlit as st

from paretolab.dashboard import runs
from paretolab.dashboard.context import Context, label
from paretolab.dashboard.curves import (
    BANDS,
    by_group,
    completed,
    curves_figure,
    summary,
    trial_curves,
)

MAX_TRIALS = 500  # curves read per study (one artifact each); beyond this the newest trials are shown


def curves_page(ctx: Context) -> None:
    assert ctx.study is not None
    st.header(f"Curves · {label(ctx.study.name)}")
    frame = ctx.table.frame
    done = frame[frame["state"].isin(["COMPLETE", "PRUNED"])]  # a pruned trial logged its curve up to where it stopped
    if done.empty:
        st.info(f"Study '{label(ctx.study.name)}' has no completed or pruned trials yet.")
        return
    done = done.tail(MAX_TRIALS)
    curves = ctx.table.memo(("curves", tuple(done["number"])), lambda: _read(ctx, done))
    if not curves:
        st.info(f"Study '{label(ctx.study.name)}' has no learning curves: none of its trials logged a `learning_curve.json` artifact "
                "or `curve.val_loss` history (only pipelines with a `train` stage do).")
        return
    c1, c2, c3, c4 = st.columns([2, 3, 3, 2])
    x = c1.radio("x axis", ["tokens", "flops"], key="cx", horizontal=True)
    kind = c2.radio("seeds", list(BANDS), key="cband", horizontal=True, help="mean line with a band across seeds, or every seed's own line")
    train = c3.toggle("also train_loss (dashed)", value=False, key="ctrain")
    log_x = c4.toggle("log x", value=False, key="clogx")
    losses = ["val_loss", "train_loss"] if train else ["val_loss"]
    shown = trial_curves(done, curves, x, losses)
    if not shown:
        st.info(f"No curve of study '{label(ctx.study.name)}' has {x}: the metric histories carry tokens only; choose tokens.")
        return
    st.plotly_chart(curves_figure(shown, x, losses, kind, log_x=log_x), key="curves", width="stretch")
    _notes(done, curves, shown, x, kind)
    st.subheader("Final val_loss per group")
    st.dataframe(summary(by_group(completed(shown))).rename(columns={"x at end (mean)": f"{x} at end (mean)"}), hide_index=True, width="stretch")


def _read(ctx: Context, done: pd.DataFrame) -> dict[int, Any]:
    """Trial number -> its curve, for the trials that have one."""
    out = {}
    for number, run_id in zip(done["number"], done["mlflow_run_id"]):
        try:
            curve = runs.learning_curve(ctx.stores.tracking_uri, str(run_id)) if run_id else None
        except Exception:  # an unreadable store is the same as no curve here; the Trial page says why
            curve = None
        if curve is not None:
            out[int(number)] = curve
    return out


def _notes(done: pd.DataFrame, curves: dict[int, Any], shown: list, x: str, kind: str) -> None:
    whole = completed(shown)
    parts = [f"{len(whole)} trial(s) in {len(by_group(whole))} group(s); a group is a method with its non-seed parameters"]
    if len(whole) < len(shown):
        parts.append(f"{len(shown) - len(whole)} pruned trial(s) drawn faded and dotted, each alone up to where the study's pruner "
                     "stopped it (legend: pruned at step N): not in a group's mean, band or the table below, and never on a frontier")
    if kind != "one line per seed":
        parts.append(f"line: mean over the group's seeds; band: {kind} across seeds (seeds aligned on the first seed's {x})")
    missing = len(done) - len(curves)
    if missing:
        parts.append(f"{missing} trial(s) logged no learning curve")
    tokens_only = sum(1 for c in curves.values() if not c.has(x))
    if tokens_only:
        parts.append(f"{tokens_only} trial(s) have their curve only as metric history (tokens, no FLOPs): not shown against {x}")
    st.caption(" · ".join(parts))
