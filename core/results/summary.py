"""The summary table a results document opens with: each study's claims, their verdicts with a mark and the effect with
its 95 % interval, one row per claim and setting (a study without a claim gets a row saying so).

The verdicts are the verdict code's own (:func:`paretolab.results.claims.verdict_rows` through
:mod:`paretolab.results.verdicts`, and :func:`~paretolab.results.claims.claim_lines` for a claim about a value), the
Holm adjustment is the one the study's section states, and the numbers are written by :mod:`paretolab.plugin_api.numbers`.
"""

from __future__ import annotations

from typing import Any

from paretolab.data.names import markdown_text
from paretolab.results.claims import claim_lines
from paretolab.results.estimate import holm
from paretolab.results.layout import VERDICT_LINE
from paretolab.results.read import load_study, trial_table
from paretolab.results.section import claim_trials
from paretolab.results.verdict_words import LEGEND, NO_VERDICT, effect_text, verdict_mark
from paretolab.results.verdicts import pipeline_claims, verdicts_of

COLUMNS = ("study", "claim", "verdict", "effect [95 % interval]")


def study_summary(name: str, source: Any) -> list[dict[str, str]]:
    """The study's rows of the summary: {study, claim, mark, verdict, effect}, in the order its section states them."""
    pipeline = load_study(name, source).user_attrs.get("pipeline") or {}
    claims = pipeline_claims(pipeline)
    if not claims:
        return [{"study": name, "claim": "*no claim stated*", "mark": "", "verdict": "", "effect": ""}]
    _, rows = trial_table(name, source)
    compared = verdicts_of([c for c in claims if c.target is None], pipeline, rows, source)
    kept = holm([r["p"] for r in compared]) if len(compared) > 1 else [True] * len(compared)
    out = []
    for claim in claims:
        if claim.target is not None:  # a claim about a value: its verdict as its block says it
            out.append(_value_row(name, claim, claim_trials(pipeline, rows)))
            continue
        mine = [(r, ok) for r, ok in zip(compared, kept) if r["claim"] == claim.text and r["metric"] == claim.metric
                and r["method"] == claim.method and r["baseline"] == claim.baseline]
        if not mine:
            out.append({"study": name, "claim": claim.text, "mark": NO_VERDICT, "verdict": "no verdict: no matched pairs", "effect": ""})
        for row, ok in mine:
            verdict = _short(row["verdict"])
            if verdict_mark(row["verdict"]) == "✓" and not ok:
                verdict += f"; not after Holm's adjustment over {len(compared)} comparisons"
            out.append({"study": name, "claim": claim.text + (f" (at {row['setting']})" if row["setting"] else ""),
                        "mark": verdict_mark(row["verdict"]), "verdict": verdict, "effect": effect_text(row)})
    return out


def _value_row(name: str, claim: Any, trials: list[dict[str, Any]]) -> dict[str, str]:
    line = next((line for line in claim_lines(claim, trials, lambda run: None) if VERDICT_LINE.match(line)), "")
    found = VERDICT_LINE.match(line)
    said = found.group(1) if found else "no verdict"
    effect = line.split(" — ", 1)[1].split(";", 1)[0] if " — " in line else ""
    return {"study": name, "claim": claim.text, "mark": verdict_mark(said), "verdict": _short(said), "effect": effect}


def _short(verdict: str) -> str:
    """The verdict without its parenthesised reasons (the section gives them): ``no verdict: budgets differ``."""
    return verdict.split(" (", 1)[0]


def summary_lines(entries: list[dict[str, str]]) -> list[str]:
    """The summary table (each study linked to its section) and the marks' legend."""
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for e in entries:
        verdict = f"{e['mark']} {e['verdict']}".strip()
        cells = [f"[{e['study']}](#{_anchor(e['study'])})", markdown_text(e["claim"]), markdown_text(verdict), markdown_text(e["effect"])]
        lines.append("| " + " | ".join(cells) + " |")
    return [*lines, "", f"{LEGEND}; each study's section gives the verdict's reasons and its trials.", ""]


def _anchor(heading: str) -> str:
    """The anchor GitHub and the site give a heading of a study's name (names are ``[A-Za-z0-9_.-]``)."""
    return "".join(c for c in heading.lower() if c.isalnum() or c in "-_")
