"""The Frontier page's Decide panel: a budget and a quality rule in ``paretolab pick``'s words, the choice with its
evidence, its rivals and the cheaper unconfirmed configurations, marked on the plot. The decision is
:func:`paretolab.results.decision_record.decide_study`'s — the CLI's and ``paretolab.pick``'s one code path — taken once
per (study version, rule, budget)."""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any

import numpy as np
import plotly.graph_objects as go
import streamlit as st

from paretolab.dashboard.claims_panel import version
from paretolab.dashboard.context import Context, label
from paretolab.dashboard.plots import FrontierData
from paretolab.errors import ParetolabError
from paretolab.results.decision_record import decide_study, decision_lines
from paretolab.results.pick import Decision

MARKS = {"choice": ("star-diamond", "#2ca02c", 22), "rival": ("diamond-open", "#2ca02c", 16),
         "unconfirmed": ("diamond-open", "#ff7f0e", 16), "nearest miss": ("x-open", "#d62728", 18)}
_DECIDED: OrderedDict[tuple[Any, ...], tuple[Decision | None, str]] = OrderedDict()
_DECIDED_SIZE = 32
_LOCK = threading.Lock()


def default_rule(ctx: Context) -> tuple[str, str]:
    """(rule, budget) to start from: the first quality objective kept within 2 % of the unmodified model, and the other
    objective at half of it — or blanks where the study has no such arm."""
    assert ctx.study is not None
    objectives = [m for m, _ in ctx.table.objectives]
    has_none = "none" in set(ctx.table.frame.get("methods", []))
    if len(objectives) < 2 or not has_none:
        return "", ""
    quality, cost = objectives[0], objectives[1]
    return f"{quality} no_worse 2 % vs none", f"{cost} <= 0.5 x none"


def decided(ctx: Context, keep: str, where: list[str]) -> tuple[Decision | None, str]:
    """(the decision, "") or (None, why it was refused), once per version of the study and these words."""
    assert ctx.study is not None
    key = (ctx.stores.optuna_url, ctx.stores.tracking_uri, ctx.study.name, version(ctx.study), keep, tuple(where))
    with _LOCK:
        if key in _DECIDED:
            return _DECIDED[key]
    try:
        found: tuple[Decision | None, str] = (decide_study(ctx.study.name, ctx.stores, keep=keep, budgets=where), "")
    except ParetolabError as exc:
        found = (None, str(exc))
    with _LOCK:
        _DECIDED[key] = found
        while len(_DECIDED) > _DECIDED_SIZE:
            _DECIDED.popitem(last=False)
    return found


def decide_panel(ctx: Context) -> Decision | None:
    """The panel's inputs and its decision (None until the reader asks, or when the words are refused)."""
    rule, budget = default_rule(ctx)
    with st.expander("Decide: the cheapest configuration whose quality holds", expanded=False):
        st.caption("As `paretolab pick` decides: each configuration judged by all its replicates against the rule's "
                   "baseline; the choice meets every budget on its mean and is cheapest on the first budget's metric.")
        c1, c2 = st.columns(2)
        keep = c1.text_input("keep (rule)", value=rule, key="pick_keep", placeholder="ppl no_worse 2 % vs none")
        where = c2.text_input("where (budgets, separated by ';')", value=budget, key="pick_where", placeholder="size_bytes <= 80 MB")
        if not st.toggle("decide", key="pick_on") or not keep.strip():
            return None
        budgets = [w.strip() for w in where.split(";") if w.strip()]
        decision, error = decided(ctx, keep.strip(), budgets)
        if error:
            st.error(label(error))
            return None
        assert decision is not None
        st.markdown("\n".join(decision_lines(decision)[2:]))  # the page's own title is the study's
        return decision


def mark_decision(fig: go.Figure, plot: FrontierData, decision: Decision | None) -> go.Figure:
    """``fig`` with the choice starred and its rivals, the cheaper unconfirmed ones and the nearest miss marked."""
    if decision is None:
        return fig
    from paretolab.dashboard.configurations import point_of

    sx, sy = plot.scales()
    points = plot.points.set_index("number", drop=False)
    shown_as = point_of(plot.points)  # a configuration averaged over its draws is one point
    groups = {"choice": [decision.choice] if decision.choice else [], "rival": decision.rivals,
              "unconfirmed": decision.unconfirmed, "nearest miss": [decision.nearest] if decision.nearest else []}
    for role, candidates in groups.items():
        numbers = sorted({shown_as.get(n, n) for c in candidates for n in c.numbers} & set(points.index))
        if not numbers:
            continue
        names = {shown_as.get(n, n): c.name() for c in candidates for n in c.numbers}
        symbol, colour, size = MARKS[role]
        shown = points.loc[numbers]
        fig.add_trace(go.Scatter(
            x=shown[plot.x].to_numpy() / sx, y=shown[plot.y].to_numpy() / sy, mode="markers", name=f"pick: {role}",
            marker={"symbol": symbol, "size": size, "color": colour, "line": {"width": 2, "color": colour}},
            customdata=np.array(numbers), hovertext=[f"trial {n}<br>{role}: {names[n]}" for n in numbers], hoverinfo="text"))
    return fig
