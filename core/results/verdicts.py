"""A study's claims and their verdicts as data, read from a source: the one path ``paretolab.load_study(...).verdicts``
and the dashboard take (the rows are :func:`paretolab.results.claims.verdict_rows`', judged as ``paretolab report``
judges them), and the category a verdict's text falls in (``held``, ``did not hold``, ``within noise``,
``inconclusive``, ``no verdict``) for a badge or a count.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from paretolab.plugin_api.manager import registries
from paretolab.results.claims import verdict_rows
from paretolab.results.metric_facts import chance_levels, metric_bounds, metric_exact
from paretolab.results.read import load_study, trial_table
from paretolab.results.section import claim_trials
from paretolab.results.source import Source, source_of
from paretolab.results.verdict_words import CATEGORIES, verdict_category  # noqa: F401  (verdict_category: the readers' import)
from paretolab.stores.locations import Stores
from paretolab.study.report_spec import Claim, claims_from

COLUMNS = ["claim", "metric", "method", "baseline", "setting", "expect", "margin", "scale", "verdict",
           "difference", "low", "high", "pairs", "trials"]  # of each row, in this order


@dataclass
class StudyVerdicts:
    """A study's claims (as its pipeline states them) and the verdict rows judged on its complete trials."""

    claims: list[Claim] = field(default_factory=list)
    rows: list[dict[str, Any]] = field(default_factory=list)


def pipeline_claims(pipeline: dict[str, Any]) -> list[Claim]:
    """The claims a stored pipeline carries, each judged in its metric's registered better direction."""
    if not pipeline.get("claims") and not pipeline.get("claim"):
        return []
    return claims_from(pipeline, {m.name: m.direction for m in registries().metrics})


def verdicts_of(claims: list[Claim], pipeline: dict[str, Any], rows: list[dict[str, Any]], source: Source) -> list[dict[str, Any]]:
    """The verdict rows of ``claims`` on ``rows`` (:func:`~paretolab.results.read.trial_table`'s), one per claim and setting."""
    if not claims:
        return []
    return verdict_rows(claims, claim_trials(pipeline, rows), source.per_example(), metric_bounds,
                        chance_levels(pipeline, source), metric_exact)


def study_verdicts(name: str, where: Stores | Source) -> StudyVerdicts:
    """Study ``name``'s claims and verdicts; its trials are read only when its pipeline states a claim."""
    source = source_of(where)
    pipeline = load_study(name, source).user_attrs.get("pipeline") or {}
    claims = pipeline_claims(pipeline)
    if not claims:
        return StudyVerdicts()
    _, rows = trial_table(name, source)
    return StudyVerdicts(claims, verdicts_of(claims, pipeline, rows, source))


def verdict_counts(verdicts: StudyVerdicts) -> str:
    """``3 held`` / ``1 held, 1 no verdict``: the categories of a study's verdicts, a claim no comparison could judge
    counted as no verdict; ``—`` without a claim judged by comparison (a value claim is judged per trial)."""
    compared = [c for c in verdicts.claims if c.target is None]
    if not compared:
        return "—"
    judged = {(r["claim"], r["metric"], r["method"], r["baseline"]) for r in verdicts.rows}
    unjudged = sum(1 for c in compared if (c.text, c.metric, c.method, c.baseline) not in judged)
    counts = {k: 0 for k in CATEGORIES}
    for row in verdicts.rows:
        counts[verdict_category(row["verdict"])] += 1
    counts["no verdict"] += unjudged
    return ", ".join(f"{n} {k}" for k, n in counts.items() if n)
