"""The words of a verdict, read once for every reader: its category (a dashboard badge, a count), its mark (a document's
summary) and the effect as a reader sees it. The verdicts themselves are :mod:`paretolab.results.claims`'; this module
only reads their wording, so the CLI, the documents and the dashboard say the same thing the same way.
"""

from __future__ import annotations

from typing import Any

from paretolab.plugin_api.numbers import BYTE_UNITS, RATIO, UNITLESS, interval_text, number, unit_of

CATEGORIES = ("held", "did not hold", "within noise", "inconclusive", "no verdict")  # every verdict falls in one
ALIASES = {"mixed": "inconclusive"}  # a claim's summary line over settings that disagree
MARKS = {"held": "✓", "did not hold": "✗", "within noise": "○", "inconclusive": "○", "no verdict": "—"}
NO_VERDICT = MARKS["no verdict"]
LEGEND = "✓ held · ✗ did not hold · ○ within noise or inconclusive · — no verdict"


def verdict_category(verdict: str) -> str:
    """``held`` (also ``held: ... deterministic``), ``did not hold``, ``within noise``, ``inconclusive`` (``mixed``
    too), else ``no verdict`` (``no verdict: ...`` and anything the verdict code did not judge)."""
    text = str(verdict).strip().lower()
    for words in (*CATEGORIES[:-1], *ALIASES):
        if text == words or text.startswith(f"{words}:"):
            return ALIASES.get(words, words)
    return "no verdict"


def verdict_mark(verdict: str) -> str:
    """✓, ✗, ○ or — for a verdict as the verdict code words it."""
    return MARKS[verdict_category(verdict)]


def effect_text(row: dict[str, Any]) -> str:
    """``ppl wanda ÷ magnitude = ×0.7792 [×0.7457, ×0.8155]`` (a ``scale: log`` claim's ratio), or method − baseline in
    the metric's unit, with its 95 % interval where it has one: every number by :mod:`paretolab.plugin_api.numbers`."""
    metric, log = str(row["metric"]), row.get("scale") == "log"
    unit = RATIO if log else unit_of(metric)
    low, high = row.get("low"), row.get("high")
    if low is not None and high is not None and low != high:
        shown = interval_text(row["difference"], low, high, unit, signed=not log)
    else:
        shown = number(row["difference"], unit, signed=not log)
    if unit not in UNITLESS and unit not in BYTE_UNITS:  # bytes are scaled and named by the formatter itself
        shown = f"{shown} {unit}"
    return f"{metric} {row['method']} {'÷' if log else '−'} {row['baseline']} = {shown}"
