"""The claims of a study where the reader looks: a Claims panel on the Frontier page (each claim, its verdict as a badge,
the effect with its interval, the compared trials ringed on the plot), a column on the Studies page, and on a Trial
page the claims the trial takes part in.

The verdicts are ``paretolab report``'s, read by :func:`paretolab.results.verdicts.study_verdicts` (the path
``paretolab.load_study(...).verdicts`` takes), judged once per version of a study (its trials by state, newest update
and claims; see :func:`verdicts`): a repaint of an unchanged study judges nothing again.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from html import escape
from typing import Any

import numpy as np
import plotly.graph_objects as go
import streamlit as st

from paretolab.dashboard import data
from paretolab.dashboard.context import Context, label
from paretolab.dashboard.plots import FrontierData
from paretolab.plugin_api.numbers import number
from paretolab.results.verdict_words import effect_text, verdict_category
from paretolab.results.verdicts import StudyVerdicts, pipeline_claims, study_verdicts, verdict_counts
from paretolab.stores import Stores

BADGE = {"held": "green", "did not hold": "red", "within noise": "blue", "inconclusive": "orange", "no verdict": "gray"}
RING = {"held": "#2ca02c", "did not hold": "#d62728", "within noise": "#1f77b4", "inconclusive": "#ff7f0e", "no verdict": "#7f7f7f"}


_JUDGED: OrderedDict[tuple[str, str, str], tuple[tuple[Any, ...], tuple[StudyVerdicts, str]]] = OrderedDict()
_JUDGED_SIZE = 64  # studies
_LOCK = threading.Lock()


def version(study: data.StudyInfo) -> tuple[Any, ...]:
    """What changes when a trial is added to the study or changes state, or its claims are edited: the study's id, its
    trials by state and newest update (as ``data.list_studies`` read them, no query more), and its claims."""
    claims = study.pipeline.get("claims") or study.pipeline.get("claim")
    return study.study_id, tuple(sorted(study.counts.items())), str(study.last_update), json.dumps(claims, sort_keys=True, default=str)


def verdicts(stores: Stores, study: data.StudyInfo) -> tuple[StudyVerdicts, str]:
    """(the study's claims and verdicts, "" or why they could not be judged), judged once per version of the study.

    Kept here rather than with the trial table (``TrialTable.memo``): the Studies page asks for every study with a
    claim, more than the eight tables that cache holds, and the verdicts are read through the report's own source."""
    if not pipeline_claims(study.pipeline):  # no claim: nothing to read
        return StudyVerdicts(), ""
    key, now = (stores.optuna_url, stores.tracking_uri, study.name), version(study)
    with _LOCK:
        hit = _JUDGED.get(key)
    if hit is not None and hit[0] == now:
        return hit[1]
    try:
        judged = study_verdicts(study.name, stores), ""
    except Exception as exc:  # noqa: BLE001 - a store that cannot be read is said on the page (and asked again), not a traceback
        return StudyVerdicts(), f"{type(exc).__name__}: {exc}"
    with _LOCK:
        _JUDGED[key] = (now, judged)
        _JUDGED.move_to_end(key)
        while len(_JUDGED) > _JUDGED_SIZE:
            _JUDGED.popitem(last=False)
    return judged


def study_claims(stores: Stores, study: data.StudyInfo) -> str:
    """The Studies page's cell: ``3 held``, ``1 held, 1 no verdict``; ``—`` for a study without a claim."""
    judged, error = verdicts(stores, study)
    return "?" if error else verdict_counts(judged)


def badge(verdict: str) -> str:
    """The verdict's category as a coloured badge (Markdown)."""
    category = verdict_category(verdict)
    return f":{BADGE[category]}-badge[{category}]"


def pairs_text(row: dict[str, Any]) -> str:
    return ", ".join(f"{m} vs {b}" for m, b in row["trials"])  # method vs baseline, as the report lists them


def _verdict_line(row: dict[str, Any]) -> str:
    """Badge, setting, effect, pairs; the verdict's own words too where they say more than the badge (why no verdict)."""
    said = str(row["verdict"])
    why = f" — {label(said)}" if said != verdict_category(said) else ""
    at = f"**{label(row['setting'])}**: " if row["setting"] else ""
    return (f"{badge(said)} {at}{label(effect_text(row))} (n = {row['pairs']} pair(s): trials {label(pairs_text(row))}){why}")


def claims_panel(ctx: Context) -> StudyVerdicts:
    """The Frontier page's Claims panel (nothing for a study without a claim); returns what it showed."""
    assert ctx.study is not None
    judged, error = verdicts(ctx.stores, ctx.study)
    if error:
        st.subheader("Claims")
        st.warning(f"The study's claims could not be judged: {label(error)}")
    if not judged.claims:
        return judged
    st.subheader("Claims")
    st.caption("Verdicts as `paretolab report` gives them, one per claim and setting (the report adds Holm-adjusted verdicts "
               "for the set). Ringed on the plot, in the badge's colour: the trials each verdict compares.")
    for claim in judged.claims:
        st.markdown(f"**{label(claim.text)}**")
        if claim.target is not None:
            st.caption(f"{label(claim.metric)} expected within {number(claim.target)} ± {number(claim.tolerance)}: "
                       "a claim about a value, judged per trial in `paretolab report`.")
            continue
        st.caption(f"{label(claim.method)} against {label(claim.baseline)} on {label(claim.metric)}, {label(claim.expect)} expected")
        rows = [r for r in judged.rows if (r["claim"], r["metric"], r["method"], r["baseline"]) == (claim.text, claim.metric, claim.method, claim.baseline)]
        for row in rows:
            st.markdown(_verdict_line(row))
        if not rows:
            st.markdown(f"{badge('no verdict')} no pair of trials could be compared (`paretolab report` says why)")
    return judged


def ring_compared(fig: go.Figure, plot: FrontierData, judged: StudyVerdicts) -> go.Figure:
    """``fig`` with the trials each verdict compares ringed in its badge's colour: one small trace per category, each
    category's rings wider than the last, so a trial compared by several verdicts shows them all, concentric."""
    from paretolab.dashboard.configurations import point_of

    sx, sy = plot.scales()
    points = plot.points.set_index("number", drop=False)
    shown_as = point_of(plot.points)  # a trial averaged into its configuration's point is ringed there
    for step, (category, colour) in enumerate(RING.items()):
        hover: dict[int, list[str]] = {}
        for row in (r for r in judged.rows if verdict_category(r["verdict"]) == category):
            at = f" at {row['setting']}" if row["setting"] else ""
            for m, b in row["trials"]:
                for number_, arm in ((m, row["method"]), (b, row["baseline"])):
                    hover.setdefault(shown_as.get(int(number_), int(number_)), []).append(
                        escape(f"{arm} arm of “{row['claim']}”{at}: {row['verdict']}"))
        numbers = [n for n in sorted(hover) if n in points.index]
        if not numbers:
            continue
        shown = points.loc[numbers]
        fig.add_trace(go.Scatter(
            x=shown[plot.x].to_numpy() / sx, y=shown[plot.y].to_numpy() / sy, mode="markers", name=f"claim: {category}",
            marker={"symbol": "circle-open", "size": 18 + 7 * step, "color": colour, "line": {"width": 2.5, "color": colour}},
            customdata=np.array(numbers), hovertext=[f"trial {n}<br>" + "<br>".join(dict.fromkeys(hover[n])) for n in numbers],
            hoverinfo="text"))
    return fig


def trial_claims(ctx: Context, number_: int) -> None:
    """On a Trial page: the verdicts whose comparison takes this trial, as the method's or the baseline's arm."""
    assert ctx.study is not None
    judged, _ = verdicts(ctx.stores, ctx.study)
    mine = [(row, "method", row["method"]) for row in judged.rows if any(int(m) == number_ for m, _ in row["trials"])]
    mine += [(row, "baseline", row["baseline"]) for row in judged.rows if any(int(b) == number_ for _, b in row["trials"])]
    if not mine:
        return
    st.subheader("Claims")
    for row, role, arm in mine:
        at = f" at {label(row['setting'])}" if row["setting"] else ""
        st.markdown(f"{badge(row['verdict'])} **{label(row['claim'])}**{at} — this trial is on the {role}'s arm ({label(arm)}): "
                    f"{label(row['verdict'])}; {label(effect_text(row))}")
