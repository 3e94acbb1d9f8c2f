"""A claim about a value (``depth_alpha`` ≈ 1: ``target``, ``tolerance``), judged on each trial's stored 95 % interval
(``<metric>_ci_low``/``_ci_high``): the report's block for it (:mod:`paretolab.results.claims` calls it)."""

from __future__ import annotations

import math
from typing import Any

from paretolab.plugin_api.numbers import interval_text, metric_value, number, unit_of
from paretolab.study.report_spec import Claim


def value_claim_lines(claim: Claim, trials: list[dict[str, Any]]) -> list[str]:
    """A value claim: each trial's value (and its stored 95 % interval) against target ± tolerance."""
    assert claim.target is not None and claim.tolerance is not None
    low, high = claim.target - claim.tolerance, claim.target + claim.tolerance
    rows = [t for t in trials if isinstance(t.get(claim.metric), (int, float)) and math.isfinite(float(t[claim.metric]))]
    lines = [f"**Claim:** {claim.text}", "", f"`{claim.metric}` expected within {number(claim.target)} ± {number(claim.tolerance)}.", ""]
    if not rows:
        return [*lines, f"**Verdict: no verdict: no trial reported {claim.metric}**.", ""]
    spans = [_stored_interval(t, claim.metric) for t in rows]
    if any(s is None for s in spans):
        where = ", ".join(f"{metric_value(claim.metric, float(t[claim.metric]))} (trial {t['trial']})" for t in rows)
        side = "inside" if all(low <= float(t[claim.metric]) <= high for t in rows) else "outside" \
            if not any(low <= float(t[claim.metric]) <= high for t in rows) else "partly inside"
        return [*lines, f"**Verdict: no verdict: point estimates, no interval** — {claim.metric} = {where}; {side} the band.", ""]
    judged = ["held" if low <= s[0] and s[1] <= high else "did not hold" if s[1] < low or s[0] > high else "inconclusive"
              for s in spans if s is not None]
    said = judged[0] if len(set(judged)) == 1 else "mixed"
    listed = ", ".join(f"{interval_text(float(t[claim.metric]), s[0], s[1], unit_of(claim.metric))} (trial {t['trial']})" for t, s in zip(rows, spans) if s)
    return [*lines, f"**Verdict: {said}** — {claim.metric} = {listed}; 95 % intervals as the trials stored them.", ""]


def _stored_interval(trial: dict[str, Any], metric: str) -> tuple[float, float] | None:
    low, high = trial.get(f"{metric}_ci_low"), trial.get(f"{metric}_ci_high")
    if isinstance(low, (int, float)) and isinstance(high, (int, float)) and math.isfinite(low) and math.isfinite(high):
        return float(low), float(high)
    return None
