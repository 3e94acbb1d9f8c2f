"""A pipeline's claims and their verdicts from the stored trials (``paretolab report`` prints them).

```yaml
claims:
  - {text: "BHyT trains to a lower loss than RMSNorm", metric: val_loss, method: bhyt, baseline: none,
     expect: lower, replicates: [seed]}
  - {text: "... and costs no more than 2 % in time", metric: train_s, method: bhyt, baseline: none,
     expect: no_worse, margin: 0.02, scale: log, replicates: [seed]}
```

(``claim:`` is the one-item spelling, ``pair_by: seed`` the one-item spelling of ``replicates``.)
Trials are matched into pairs and groups as :mod:`paretolab.results.pairing` says: on the named
replicates and every shared setting, one verdict per setting. The estimate and its interval are
:mod:`paretolab.results.estimate`'s (replicate noise and example noise, in quadrature). Verdicts:

- ``lower`` / ``higher``: *held* when the interval of method − baseline lies on the expected side of 0,
  *did not hold* on the other side, *within noise* when it contains 0;
- ``no_worse`` (``margin``): *held* when the whole interval stays on the good side of the margin
  (the method is at most ``margin`` worse, in the metric's good direction), *did not hold* when it
  lies wholly beyond, else *inconclusive*; ``equivalent``: the interval within ±margin;
- an interval of zero width is no verdict ("no variation observed"), nor is one replicate without
  per-example scores; but an *exact* metric (registered ``exact``: bytes held, floats stored) whose every replicate
  reads the same on both arms is an exact effect, judged as it stands against the claim ("held: -42.11 MB on each
  of 3 seeds, deterministic").

Before any of these, a comparison that cannot bear on the claim is no verdict, saying why: the method did not work
(``works``), a calibrated side rests on too few draws, the trials did not get the budget the claim names (``budget:
tokens`` — "at equal tokens": paired ``train_tokens`` more than ``budget_tolerance``, default 5 %, apart), or an arm is
at chance (its median trial at or beyond what a uniform guess scores: perplexity at or above the model's vocabulary,
accuracy at or below the chance rate its task declares; both arms there: "both at chance").

A study that tests several claims (or one claim over several settings) also gets Holm-adjusted verdicts
for the set. A claim about a value (``depth_alpha`` ≈ 1: ``target``, ``tolerance``) is judged on each
trial's stored interval (``<metric>_ci_low``/``_ci_high``) when it has one. An optional ``reference``
(a third label) adds the share of the baseline-to-reference gap the method closes, per setting.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from typing import Any

from paretolab.plugin_api.numbers import BYTE_UNITS, DIGITS, RATIO, UNITLESS, interval_digits, interval_text, metric_value, number, plural, ratio, unit_of
from paretolab.results.estimate import Estimate, estimate, holm, margin_band, p_value, verdict, worse_side
from paretolab.results.pairing import Group, group_pairs, pair_trials, trial_label
from paretolab.results.value_claims import value_claim_lines
from paretolab.study.report_spec import Claim

EQUAL_FLOPS_TOLERANCE = 0.01  # budgets within 1 % count as equal: no equal-FLOPs reading needed
Bounds = Callable[[str], "tuple[float, float] | None"]
Chance = Callable[[str], "tuple[float, str] | None"]  # metric -> (what a uniform guess scores, how it is known: "vocabulary 49152")
Exact = Callable[[str], bool]  # metric -> whether it is registered exact (a count or size the configuration fixes)

__all__ = ["claim_lines", "claims_lines", "judge", "pair_trials", "trial_label", "verdict_rows"]


def claims_lines(claims: list[Claim], trials: list[dict[str, Any]], curve: Callable[[str], Any],
                 fetch: Callable[[str], Any] | None = None, bounds: Bounds | None = None, chance: Chance | None = None,
                 exact: Exact | None = None) -> list[str]:
    """Every claim's block, then (for more than one comparison) the Holm-adjusted verdicts of the set."""
    lines: list[str] = []
    tests: list[tuple[str, float | None, str]] = []  # (what, one-sided p, unadjusted verdict)
    for claim in claims:
        lines += _one_claim(claim, trials, curve, fetch, bounds, tests, chance, exact)
    if len(tests) > 1:
        kept = holm([p for _, p, _ in tests])
        # Holm can only take a "held" away: every other comparison reads here as its own line says
        listed = "; ".join(f"{what}: " + (v if v != "held" else "held" if ok else "not held after adjustment (held unadjusted)")
                           for (what, _, v), ok in zip(tests, kept))
        lines += [f"**Holm-adjusted** ({len(claims)} claim(s), {len(tests)} comparison(s); family-wise 5 %, one-sided 2.5 % "
                  f"per claimed direction): {listed}.", ""]
    return lines


def claim_lines(claim: Claim, trials: list[dict[str, Any]], curve: Callable[[str], Any],
                fetch: Callable[[str], Any] | None = None, bounds: Bounds | None = None, chance: Chance | None = None,
                exact: Exact | None = None) -> list[str]:
    """One claim's Markdown block (no Holm line)."""
    return _one_claim(claim, trials, curve, fetch, bounds, [], chance, exact)


def _one_claim(claim: Claim, trials: list[dict[str, Any]], curve: Callable[[str], Any], fetch: Callable[[str], Any] | None,
               bounds: Bounds | None, tests: list[tuple[str, float | None, str]], chance: Chance | None = None,
               exact: Exact | None = None) -> list[str]:
    if claim.target is not None:
        return value_claim_lines(claim, trials)
    groups, ambiguous = group_pairs(claim, trials)
    on = "no replicate (each setting rests on its examples)" if not claim.replicates else \
        f"replicates `{claim.pair_by}` and every other shared setting"
    expected = claim.expect if claim.margin is None else f"{claim.expect} within a margin of {_margin(claim)}"
    budget = (f", at equal {claim.budget} (paired `{claim.budget_metric}` within {_percent(claim.budget_tolerance)})"
              if claim.budget else "")
    lines = [f"**Claim:** {claim.text}", "",
             f"Method `{claim.method}` against baseline `{claim.baseline}` on `{claim.metric}` ({expected} expected"
             f"{', judged as a ratio' if claim.scale == 'log' else ''}), paired on {on}{budget}.", ""]
    if not groups:
        lines.append(f"**Verdict: no verdict: no matched pairs** — {claim.metric} {claim.method} − {claim.baseline}: "
                     "no pair of trials with the same replicate and settings reported it.")
    if len(groups) > 1:
        lines += [f"The arms span {len(groups)} settings ({', '.join(n for n, _ in groups[0].setting)}): one verdict per setting.", ""]
    for group, est, said, p in _judged(claim, groups, fetch, bounds, chance, exact):
        at = f" at {group.label()}" if group.setting else ""
        lines.append(f"**Verdict{at}: {said}** — {_difference(claim, est, group)}.")
        tests.append((f"`{claim.metric}` {claim.method}{at}", p, said))
        if claim.reference:
            lines.append(gap_line(claim, group, trials))
        lines += _equal_flops(claim, group, curve)
    if ambiguous:
        lines.append(f"{ambiguous} replicate/setting key(s) left out: more than one trial on a side with the same parameters.")
    return [*lines, ""]


def _judged(claim: Claim, groups: list[Group], fetch: Callable[[str], Any] | None, bounds: Bounds | None,
            chance: Chance | None = None, exact: Exact | None = None) -> Any:
    """(group, estimate, verdict, one-sided p for Holm) for each group with an estimate: the one place a verdict is reached."""
    rng = bounds(claim.metric) if bounds else None
    for group in groups:
        est = estimate(group.pairs, claim.metric, log=claim.scale == "log", fetch=fetch, bounds=rng)
        if est is None:
            continue
        said = (did_not_work(claim, group) or calibration_verdict(group) or budget_verdict(claim, group)
                or chance_verdict(claim, group, chance))
        if said is not None:
            yield group, est, said, None
            continue
        said = exact_verdict(claim, est, group, exact)
        if said is not None:  # an exact effect carries no sampling error: it holds for Holm as it holds here
            yield group, est, said, 0.0 if said.startswith("held") else 1.0
            continue
        said = verdict(est, claim.expect, claim.better, _band(claim))
        yield group, est, said, None if said.startswith("no verdict") else p_value(est, claim.expect, claim.better, _band(claim))


def judge(claim: Claim, group: Group, fetch: Callable[[str], Any] | None = None, bounds: Bounds | None = None,
          chance: Chance | None = None, exact: Exact | None = None) -> tuple[Estimate, str] | None:
    """One group's estimate and verdict as the report reaches them (``paretolab pick`` judges each candidate here)."""
    found = next(_judged(claim, [group], fetch, bounds, chance, exact), None)
    return None if found is None else (found[1], found[2])


def _side_values(group: Group, side: int, metric: str) -> list[float]:
    """The finite values of ``metric`` on one side (0: method, 1: baseline) of a group, each trial once, sorted."""
    seen = {int(pair[side]["trial"]): pair[side].get(metric) for pair in group.pairs}
    return sorted(float(v) for v in seen.values() if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v))


def _span(metric: str, values: list[float]) -> str:
    low, high = metric_value(metric, values[0]), metric_value(metric, values[-1])
    return low if low == high else f"{low}–{high}"


def _percent(fraction: float) -> str:
    return f"{number(fraction * 100)} %"


def budget_verdict(claim: Claim, group: Group) -> str | None:
    """"no verdict: budgets differ" when the claim names a budget (``budget: tokens``) that some pair of trials did not get
    within ``budget_tolerance`` (relative to the larger), or a trial recorded none to check; None where the budgets match."""
    name = claim.budget_metric
    if name is None:
        return None
    missing = sorted({int(t["trial"]) for pair in group.pairs for t in pair
                      if not isinstance(t.get(name), (int, float)) or not math.isfinite(float(t[name]))})
    if missing:
        return (f"no verdict: the claim is at equal {claim.budget}, but trial(s) {', '.join(map(str, missing))} recorded no "
                f"`{name}` to check it by")
    tolerance = claim.budget_tolerance
    if all(abs(float(m[name]) - float(b[name])) <= tolerance * max(abs(float(m[name])), abs(float(b[name]))) for m, b in group.pairs):
        return None
    return (f"no verdict: budgets differ ({claim.budget} {claim.method} {_span(name, _side_values(group, 0, name))} vs "
            f"{claim.baseline} {_span(name, _side_values(group, 1, name))}, more than {_percent(tolerance)} apart)")


def chance_verdict(claim: Claim, group: Group, chance: Chance | None) -> str | None:
    """"no verdict: both at chance" (or "the baseline is at chance", "the method is at chance") where an arm's median
    trial scores at or beyond what a uniform guess does on the claim's metric (``chance``: the model's vocabulary for a
    perplexity, the task's chance rate for an accuracy): a difference between guesses, or from one, says nothing."""
    level = chance(claim.metric) if chance is not None else None
    if level is None:
        return None
    value, known = level
    lower = claim.better == "lower"
    at = []
    for side, label in ((0, claim.method), (1, claim.baseline)):
        values = _side_values(group, side, claim.metric)
        if values:
            median = statistics.median(values)
            if (median >= value) if lower else (median <= value):
                at.append((side, label, values))
    if not at:
        return None
    who = "both at chance" if len(at) == 2 else f"the {'method' if at[0][0] == 0 else 'baseline'} is at chance"
    listed = " and ".join(f"{label} {_span(claim.metric, values)}" for _, label, values in at)
    return f"no verdict: {who} ({claim.metric} {listed} {'≥' if lower else '≤'} {known})"


def exact_verdict(claim: Claim, est: Estimate, group: Group, exact: Exact | None) -> str | None:
    """An exact effect: the claim's metric is registered ``exact`` (a count or size the configuration fixes) and every
    replicate (two at least) reads the same on each arm. Judged as it stands: ``lower``/``higher`` hold when it moved the
    claimed way, ``no_worse`` when it is at most the margin worse, ``equivalent`` when within ±margin. None otherwise
    (then an interval of zero width stays "no variation observed")."""
    if exact is None or not est.zero_width or est.replicates < 2 or not exact(claim.metric):
        return None
    if any(len({float(pair[side][claim.metric]) for pair in group.pairs}) != 1 for side in (0, 1)):
        return None
    worse = worse_side(claim.better, est.mean, est.mean)[0]  # positive: the method is worse
    band = _band(claim)
    if claim.expect in ("lower", "higher"):
        held = worse_side(claim.expect, est.mean, est.mean)[0] < 0
    elif claim.expect == "no_worse":
        assert band is not None
        held = worse <= band[1]
    else:
        assert band is not None
        held = band[0] <= worse <= band[1]
    if claim.scale == "log":
        shown = ratio(math.exp(est.mean))
    else:
        unit = unit_of(claim.metric)
        shown = metric_value(claim.metric, est.mean, signed=True) + (f" {unit}" if unit not in UNITLESS and unit not in BYTE_UNITS else "")
    names = [r.split(".")[-1] for r in claim.replicates]
    each = plural(names[0]) if len(names) == 1 else "replicates" if names else "pairs"
    return f"{'held' if held else 'did not hold'}: {shown} on each of {est.replicates} {each}, deterministic"


def did_not_work(claim: Claim, group: Group) -> str | None:
    """"no verdict: the method did not work here" when the claim names a ``works`` metric (decode_ok) that some of the
    method's trials in this setting read below 1: a cost or quality of an output that cannot be used is no evidence."""
    if claim.works is None:
        return None
    seen = [m.get(claim.works) for m, _ in group.pairs]
    failing = [v for v in seen if not isinstance(v, (int, float)) or v < 1]
    if not failing:
        return None
    shown = ", ".join("not reported" if not isinstance(v, (int, float)) else number(v) for v in failing)
    return f"no verdict: {claim.method} did not work here ({claim.works} = {shown}, below 1)"


MIN_CALIBRATION_DRAWS = 3


def calibration_verdict(group: Group) -> str | None:
    """"no verdict: one calibration draw" when a calibrated side of the comparison rests on fewer than 3 draws, else None.

    A calibrated method's result moves with its calibration sample (by as much as the effects compared, for methods
    of one family), so a verdict needs the draws as replicates: each trial names its draws (``info.calibration_draws``)."""
    for side, name in ((0, "method"), (1, "baseline")):
        draws = [t.get("run_params", {}).get("info.calibration_draws") for t in (pair[side] for pair in group.pairs)]
        used = {d for d in draws if d}
        if used and len(used) < MIN_CALIBRATION_DRAWS:
            count = "one calibration draw" if len(used) == 1 else f"{len(used)} calibration draws"
            return (f"no verdict: {count} on the {name}'s side (a calibrated result moves with its calibration sample; "
                    f"≥ {MIN_CALIBRATION_DRAWS} draws, paired as replicates, are needed)")
    return None


def verdict_rows(claims: list[Claim], trials: list[dict[str, Any]], fetch: Callable[[str], Any] | None = None,
                 bounds: Bounds | None = None, chance: Chance | None = None, exact: Exact | None = None) -> list[dict[str, Any]]:
    """The verdicts as data (``paretolab.load_study(...).verdicts``): one row per claim and setting, as the report says them.

    ``difference``/``low``/``high`` are method − baseline, or the ratio method ÷ baseline for a ``scale: log`` claim;
    ``p`` the one-sided p value the Holm line adjusts (None for no verdict). Value claims (``target``) are left out: their verdict is per trial, in the report.
    """
    rows = []
    for claim in claims:
        if claim.target is not None:
            continue
        groups, _ = group_pairs(claim, trials)
        back = math.exp if claim.scale == "log" else (lambda v: v)
        for group, est, said, p in _judged(claim, groups, fetch, bounds, chance, exact):
            rows.append({"claim": claim.text, "metric": claim.metric, "method": claim.method, "baseline": claim.baseline,
                         "setting": group.label() if group.setting else "", "expect": claim.expect, "margin": claim.margin,
                         "scale": claim.scale, "verdict": said, "difference": back(est.mean),
                         "low": None if est.low is None else back(est.low), "high": None if est.high is None else back(est.high),
                         "pairs": est.replicates, "trials": [(m["trial"], b["trial"]) for m, b in group.pairs], "p": p})
    return rows


def _band(claim: Claim) -> tuple[float, float] | None:
    return margin_band(claim.margin, claim.better, claim.scale == "log")


def _margin(claim: Claim) -> str:
    """The margin as the claim means it: in the metric's units, or on ``scale: log`` the ratio it allows."""
    if claim.scale != "log" or claim.margin is None:
        return number(claim.margin)
    worst = 1 + claim.margin if claim.better == "lower" else 1 - claim.margin
    if claim.expect == "no_worse":
        return f"{claim.margin:.1%} (the ratio {'at most' if claim.better == 'lower' else 'at least'} {ratio(worst)})"
    return f"{claim.margin:.1%} (the ratio within {ratio(1 - claim.margin)} … {ratio(1 + claim.margin)})"


def _difference(claim: Claim, est: Estimate, group: Group) -> str:
    log = claim.scale == "log"
    name = f"{claim.metric} {claim.method} {'÷' if log else '−'} {claim.baseline}"
    unit = RATIO if log else unit_of(claim.metric)  # a ratio ×1.24 [×1.08, ×1.43]; a difference in the metric's unit (bytes: MB)
    d = interval_digits(*((math.exp(est.low), math.exp(est.high)) if log else (est.low, est.high)), unit) if est.low is not None and est.high is not None else DIGITS
    show = (lambda v: number(math.exp(v), unit, digits=d)) if log else (lambda v: number(v, unit, signed=True, digits=d))
    span = f" [{show(est.low)}, {show(est.high)}]" if est.low is not None and est.high is not None and not est.zero_width else ""
    rests = f" (95 % interval: {est.rests_on()}{'; clipped to the metric’s range' if est.clipped else ''})" if span else ""
    if est.zero_width:
        rests = f" (the same on all {est.replicates} replicate(s)" + (f" and on every resample of their {est.units})" if est.units else ", no per-example scores stored)")
    trials = ", ".join(f"{m['trial']} vs {b['trial']}" for m, b in group.pairs)  # method vs baseline (a dash read as a range)
    return f"{name} = {show(est.mean)}{span}{rests}, mean over n = {est.replicates} pair(s) (trials {trials})"


def _equal_flops(claim: Claim, group: Group, curve: Callable[[str], Any]) -> list[str]:
    """The loss at equal training FLOPs where the paired budgets differ (read off the larger budget's learning curve)."""
    est = estimate(group.pairs, "val_loss", value=lambda m, b: equal_flops_difference(m, b, curve))
    if est is not None:
        said = f"**{verdict(est, claim.expect, claim.better, margin_band(claim.margin, claim.better, False))}** — " if claim.metric == "val_loss" else ""
        text = _difference(Claim(claim.text, "val_loss", claim.method, claim.baseline), est, group)
        return ["", f"At equal training FLOPs: {said}{text}; where budgets differ the larger budget's learning curve is read "
                    f"(linearly interpolated) at the smaller budget's `train_flops`. {flops_counted(group)}", ""]
    if any(_budgets_differ(m, b) for m, b in group.pairs):  # budgets differ, yet no pair gave a reading: the curves are missing
        return ["", "Budgets differ between paired trials, but their learning curves (`learning_curve.json`) are not "
                    "readable from the store: no loss at equal FLOPs.", ""]
    return []


FLOPS_COUNT = "train_flops_counts"  # a trial's info: what its train_flops includes beyond forward + backward


def flops_counted(group: Group) -> str:
    """What ``train_flops`` counts on this line's trials: forward + backward per step, and anything a method added
    (its trials' ``info.train_flops_counts``, e.g. UPipe's recomputed attention)."""
    extra = sorted({side.get("run_params", {}).get(f"info.{FLOPS_COUNT}", "") for pair in group.pairs for side in pair} - {""})
    counted = "forward and backward of every step" + (f", plus {'; '.join(extra)}" if extra else "")
    return f"`train_flops` counts: {counted}."


def equal_flops_difference(m: dict[str, Any], b: dict[str, Any], curve: Callable[[str], Any]) -> float | None:
    """``val_loss(method) - val_loss(baseline)`` at the smaller of their two training budgets; None when budgets match or a curve is missing."""
    if not _budgets_differ(m, b):
        return None
    larger, smaller = (m, b) if m["train_flops"] > b["train_flops"] else (b, m)
    read = curve(larger.get("run_id", ""))
    at = read.at("flops", float(smaller["train_flops"])) if read is not None and read.has("flops") else None
    final = smaller.get("val_loss")
    if at is None or not isinstance(final, (int, float)):
        return None
    return at - final if larger is m else final - at


def _budgets_differ(m: dict[str, Any], b: dict[str, Any]) -> bool:
    fm, fb = m.get("train_flops"), b.get("train_flops")
    return isinstance(fm, (int, float)) and isinstance(fb, (int, float)) and fb > 0 and abs(fm - fb) > EQUAL_FLOPS_TOLERANCE * fb


def gap_line(claim: Claim, group: Group, trials: list[dict[str, Any]]) -> str:
    """The share of the baseline-to-reference gap the method closes, (baseline − method) / (baseline − reference), per triple."""
    assert claim.reference is not None
    to_reference = Claim(claim.text, claim.metric, claim.baseline, claim.reference, claim.expect, claim.replicates)
    reference_of = {int(b["trial"]): r for b, r in pair_trials(to_reference, trials)[0]}
    triples = [(m, b, reference_of[int(b["trial"])]) for m, b in group.pairs if int(b["trial"]) in reference_of]
    triples = [(m, b, r) for m, b, r in triples if float(b[claim.metric]) != float(r[claim.metric])]
    name = f"Share of the `{claim.baseline}` → `{claim.reference}` gap in {claim.metric} closed by `{claim.method}`"
    if not triples:
        return f"{name}: no matched (method, baseline, reference) triple with a nonzero gap."
    reference = {id(b): r for _, b, r in triples}

    def share(m: dict[str, Any], b: dict[str, Any]) -> float:
        base, ref = float(b[claim.metric]), float(reference[id(b)][claim.metric])
        return (base - float(m[claim.metric])) / (base - ref)

    est = estimate([(m, b) for m, b, _ in triples], claim.metric, value=share)
    assert est is not None
    if est.low is None or est.high is None:
        ci = " (one triple: no interval)"
    elif est.zero_width:
        ci = f" (the same on all {est.replicates}: no variation observed)"
    else:
        ci = f" [{est.low:.1%}, {est.high:.1%}] (95 % t interval over replicates)"
    listed = ", ".join(f"{m['trial']} vs {b['trial']} vs {r['trial']}" for m, b, r in triples)  # method vs baseline vs reference
    return f"{name}: (baseline − method) / (baseline − reference) = {est.mean:.1%}{ci}, mean over n = {est.replicates} triple(s) (trials {listed})."
