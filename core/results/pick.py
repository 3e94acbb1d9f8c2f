"""From a frontier to a decision: the cheapest configuration whose quality holds (``paretolab pick``).

A *configuration* is a method with its settings; its replicates (seeds, calibration draws: the pipeline's claims'
``replicates``, else ``seed``, ``calib_seed``, ``split``) are draws of it, never configurations of their own. Each is
judged by all its replicates at once, as a claim "this configuration keeps ``rule``" — paired with the rule's baseline
on the same replicate (a baseline that has none pairs with every draw), judged by
:func:`paretolab.results.claims.judge`, the verdict path of every report — and placed at its replicates' mean cost.

The choice is the configuration that meets every budget (on its mean), whose verdict *held*, and that is best on the
cost (the first budget's metric unless ``cost`` names another): the lowest for a metric whose better direction is
lower. Rivals are the other held configurations whose cost is within noise of the choice's (their replicates' ranges,
widened by any stored interval, overlap). Cheaper configurations whose verdict is only inconclusive or within noise are
listed apart: the data cannot confirm them. When nothing qualifies, the nearest miss is named with its verdict.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field, replace
from typing import Any

from paretolab.errors import ConfigError
from paretolab.results.claims import judge
from paretolab.results.decision_rule import Budget, Rule, parse_budget, parse_rule
from paretolab.results.pairing import Group, selects
from paretolab.results.replicates import configuration_groups, is_replicate, named_params, report_replicates
from paretolab.results.verdict_words import verdict_category
from paretolab.study.report_spec import Claim

MISS_ORDER = ("inconclusive", "within noise", "did not hold", "no verdict")  # nearest first


@dataclass
class Candidate:
    """One configuration: its trials (one per replicate), mean cost and quality, and the rule's verdict on it."""

    label: str  # the choice stages' label (``rtn``, ``wanda+rtn``)
    settings: dict[str, Any]  # every non-replicate parameter by its full name (``stage0.rtn.bits``)
    trials: list[dict[str, Any]]
    cost: float = math.nan
    cost_span: tuple[float, float] = (math.nan, math.nan)
    quality: float = math.nan
    in_budget: bool = False
    over: str = ""  # the budgets it breaks, in words
    verdict: str = ""
    difference: float | None = None  # candidate − baseline, or ÷ on a relative rule
    low: float | None = None
    high: float | None = None
    replicates: int = 0
    named: tuple[str, ...] = ()  # the settings its name shows: those that tell it from its label's other configurations

    @property
    def category(self) -> str:
        return verdict_category(self.verdict)

    @property
    def numbers(self) -> list[int]:
        return sorted(int(t["trial"]) for t in self.trials)

    def name(self) -> str:
        """``rtn[bits=4, group_size=64]``: the label and its settings by short name."""
        from paretolab.plugin_api.numbers import param_value

        shown = ", ".join(f"{k.split('.')[-1]}={param_value(self.settings[k])}" for k in self.named)
        return f"{self.label}[{shown}]" if shown else self.label


@dataclass
class Confirmation:
    """The rule judged again on the confirm part: ``examples`` says how many the part holds ("confirm part: 6 of 12
    windows ..."); ``candidates`` the choice and its rivals, by name, each with its confirm-part quality and verdict."""

    examples: str = ""
    candidates: dict[str, Candidate] = field(default_factory=dict)
    fresh_draws: bool = False  # calibrated methods were re-applied on calibration draws no search trial made

    def survived(self, choice: Candidate) -> bool:
        """The choice keeps the rule on the confirm part too."""
        again = self.candidates.get(choice.name())
        return again is not None and again.category == "held"


@dataclass
class Decision:
    """What ``pick`` found: the rule and budgets, the choice (or None), its rivals, the unconfirmed cheaper ones, the
    nearest miss with why, and every candidate judged."""

    study: str
    rule: Rule
    budgets: list[Budget]
    cost: str
    rule_better: str = "lower"  # the rule metric's better direction
    lower_cost: bool = True  # the cost's better direction is lower (size, time); else higher (tokens/s)
    model: str = ""  # the study's base model
    claim: Claim | None = None  # the rule as the claim every candidate is judged by
    replicates: tuple[str, ...] = ()
    baseline_config: Candidate | None = None
    confirmation: Confirmation | None = None  # the rule judged on the confirm part (``paretolab.api.confirm``)
    split: dict[str, Any] | None = None  # the pipeline's confirm split (None: the search scored every example)
    references: dict[str, float] = field(default_factory=dict)  # a ratio budget's arm -> its mean
    choice: Candidate | None = None
    rivals: list[Candidate] = field(default_factory=list)
    unconfirmed: list[Candidate] = field(default_factory=list)
    nearest: Candidate | None = None
    why: str = ""
    candidates: list[Candidate] = field(default_factory=list)


def decide(study: str, trials: list[dict[str, Any]], pipeline: dict[str, Any], directions: dict[str, str], *,
           keep: str, where: list[str] | tuple[str, ...] = (), cost: str | None = None, fetch: Any = None,
           bounds: Any = None, chance: Any = None, exact: Any = None) -> Decision:
    """The decision on ``trials`` (:func:`paretolab.results.section.claim_trials`' rows of the study's complete trials).

    ``directions``: every metric the trials recorded -> ``lower`` or ``higher`` (its better direction)."""
    recorded = {m: d for m, d in directions.items() if any(_finite(t.get(m)) for t in trials)}
    rule = parse_rule(keep, recorded)
    budgets = [parse_budget(w, recorded) for w in where]
    cost = cost or (budgets[0].metric if budgets else None)
    if cost is None:
        raise ConfigError("pick: name the cost to minimize: --where 'size_bytes <= 80 MB' (its metric) or --cost METRIC")
    if cost not in recorded:
        parse_budget(f"{cost} <= 0", recorded, where="--cost")  # the one refusal for a metric no trial recorded
    replicates = report_replicates(pipeline)
    chosen = {m for t in trials for m in t["label"].split("+")}
    baseline = [t for t in trials if selects(rule.baseline, t, chosen) and _finite(t.get(rule.metric))]
    if not baseline:
        labels = sorted({t["label"] for t in trials})
        raise ConfigError(f"--keep: no trial of the baseline {rule.baseline!r} recorded {rule.metric}; the study's labels: {', '.join(labels)}")
    base_configs = configurations(baseline, replicates)
    if len(base_configs) > 1:
        raise ConfigError(f"--keep: the baseline {rule.baseline!r} spans {len(base_configs)} configurations "
                          f"({', '.join(c.name() for c in base_configs)}); name one of them")
    decision = Decision(study, rule, budgets, cost, directions[rule.metric], model=str(pipeline.get("model") or ""),
                        split=pipeline.get("confirm") if isinstance(pipeline.get("confirm"), dict) else None)
    for b in budgets:
        if b.ratio_to is not None:
            decision.references[b.ratio_to] = _reference(b, trials, chosen)
    better_low = decision.lower_cost = directions.get(cost, "lower") == "lower"
    base_key = _key(base_configs[0])
    decision.baseline_config, decision.replicates = base_configs[0], replicates
    decision.claim = Claim(rule.text or rule.words(), rule.metric, "candidate", rule.baseline, rule.expect, replicates,
                           margin=rule.margin, scale=rule.scale, better=directions[rule.metric])
    for cand in configurations([t for t in trials if _finite(t.get(rule.metric)) and _finite(t.get(cost))], replicates):
        _measure(cand, decision)
        if _key(cand) == base_key:
            cand.verdict, cand.replicates = "held: it is the baseline", len(cand.trials)
        else:
            judge_candidate(cand, decision, baseline, fetch, bounds, chance, exact)
        decision.candidates.append(cand)
    decision.candidates.sort(key=lambda c: (c.cost if better_low else -c.cost, c.name()))
    return _choose(decision)


def configurations(trials: list[dict[str, Any]], replicates: tuple[str, ...]) -> list[Candidate]:
    """The trials grouped into configurations: same label, same value of every parameter that is no replicate."""
    found = [Candidate(str(members[0]["label"]), {k: v for k, v in named_params(members[0]).items() if not is_replicate(k, replicates)}, members)
             for members in configuration_groups(trials, replicates).values()]
    for c in found:
        mates = [o.settings for o in found if o.label == c.label]
        c.named = tuple(sorted(k for k in c.settings if len({repr(m.get(k)) for m in mates}) > 1))
    return found


def _key(c: Candidate) -> tuple[Any, ...]:
    return c.label, tuple(sorted((k, repr(v)) for k, v in c.settings.items()))


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _reference(budget: Budget, trials: list[dict[str, Any]], chosen: set[str]) -> float:
    arm = [float(t[budget.metric]) for t in trials if selects(str(budget.ratio_to), t, chosen) and _finite(t.get(budget.metric))]
    if not arm:
        raise ConfigError(f"--where: no trial of {budget.ratio_to!r} recorded {budget.metric} (in {budget.text!r}); "
                          f"name an arm the study ran, e.g. none")
    return statistics.fmean(arm)


def _measure(cand: Candidate, decision: Decision) -> None:
    """Mean cost and quality over the replicates, the cost's noise span, and the budgets it meets on its means."""
    values = [float(t[decision.cost]) for t in cand.trials]
    lows = [float(t.get(f"{decision.cost}_ci_low", v)) if _finite(t.get(f"{decision.cost}_ci_low")) else v for t, v in zip(cand.trials, values)]
    highs = [float(t.get(f"{decision.cost}_ci_high", v)) if _finite(t.get(f"{decision.cost}_ci_high")) else v for t, v in zip(cand.trials, values)]
    cand.cost, cand.cost_span = statistics.fmean(values), (min(lows), max(highs))
    cand.quality = statistics.fmean(float(t[decision.rule.metric]) for t in cand.trials)
    broken = []
    for b in decision.budgets:
        seen = [float(t[b.metric]) for t in cand.trials if _finite(t.get(b.metric))]
        ref = decision.references.get(str(b.ratio_to))
        if not seen:
            broken.append(f"{b.metric} not recorded")
        elif not b.met(statistics.fmean(seen), ref):
            from paretolab.plugin_api.numbers import metric_value

            broken.append(f"{b.metric} {metric_value(b.metric, statistics.fmean(seen))} breaks {b.words(ref)}")
    cand.in_budget, cand.over = not broken, "; ".join(broken)


def judge_candidate(cand: Candidate, decision: Decision, baseline: list[dict[str, Any]], fetch: Any = None,
                    bounds: Any = None, chance: Any = None, exact: Any = None) -> None:
    """Pair the candidate's trials with the baseline's on the same replicate and judge the decision's rule on them
    (its mean quality too); ``fetch``: run id -> per-example scores (the search's from the store, the confirm part's
    from the re-applied trials)."""
    assert decision.claim is not None
    cand.quality = statistics.fmean(float(t[decision.rule.metric]) for t in cand.trials)
    pairs = _pairs(cand.trials, baseline, decision.replicates)
    claim = replace(decision.claim, method=cand.name())  # its verdict's words name it ("the method is at chance (ppl rtn[bits=2] ...)")
    found = judge(claim, Group((), pairs), fetch, bounds, chance, exact) if pairs else None
    if found is None:
        cand.verdict = "no verdict: no trial of the baseline on the same replicate" if not pairs else "no verdict: no estimate"
        return
    est, cand.verdict = found
    back = math.exp if claim.scale == "log" else (lambda v: v)
    cand.difference = back(est.mean)
    cand.low = None if est.low is None else back(est.low)
    cand.high = None if est.high is None else back(est.high)
    cand.replicates = est.replicates


def _pairs(mine: list[dict[str, Any]], baseline: list[dict[str, Any]], replicates: tuple[str, ...]) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    def rep(t: dict[str, Any]) -> tuple[Any, ...]:
        return tuple(sorted((k.split(".")[-1], repr(v)) for k, v in t["params"].items() if is_replicate(k, replicates)))

    by_rep = {rep(b): b for b in baseline}
    if len(baseline) == 1:  # a baseline with no replicate (the unmodified model) pairs with every draw
        return [(m, baseline[0]) for m in mine]
    if all(rep(m) == () for m in mine):  # a candidate with no replicate pairs with every draw of the baseline
        return [(mine[0], b) for b in baseline] if len(mine) == 1 else []
    return [(m, by_rep[rep(m)]) for m in mine if rep(m) in by_rep]


def _choose(decision: Decision) -> Decision:
    fits = [c for c in decision.candidates if c.in_budget]
    held = [c for c in fits if c.category == "held"]
    if held:
        choice = decision.choice = held[0]
        decision.rivals = [c for c in held[1:] if _overlap(c.cost_span, choice.cost_span)]
        decision.unconfirmed = [c for c in fits if c.category in ("inconclusive", "within noise")
                                and decision.candidates.index(c) < decision.candidates.index(choice)]
        return decision
    if fits:
        decision.nearest = min(fits, key=lambda c: (MISS_ORDER.index(c.category) if c.category in MISS_ORDER else len(MISS_ORDER),
                                                    _shortfall(c, decision), decision.candidates.index(c)))
        decision.why = f"no configuration within the budget keeps the rule; the nearest: {decision.nearest.verdict}"
        return decision
    kept = [c for c in decision.candidates if c.category == "held" and c is not decision_baseline(decision)]
    if kept:
        decision.nearest = kept[0]
        decision.why = f"no configuration meets the budget while keeping the rule; the cheapest that keeps it: {kept[0].over}"
    else:
        decision.why = "no configuration meets the budget, and none but the baseline keeps the rule"
    return decision


def decision_baseline(decision: Decision) -> Candidate | None:
    """The candidate that is the rule's baseline configuration itself (it keeps the rule trivially)."""
    base = decision.baseline_config
    return next((c for c in decision.candidates if base is not None and _key(c) == _key(base)), None)


def _overlap(a: tuple[float, float], b: tuple[float, float]) -> bool:
    return a[0] <= b[1] and b[0] <= a[1]


def _shortfall(c: Candidate, decision: Decision) -> float:
    """How far a candidate's interval reaches on the worse side (smaller: nearer to keeping the rule)."""
    lower_better = decision.rule_better == "lower"
    bound = (c.high if lower_better else c.low) if c.high is not None and c.low is not None else c.difference
    if bound is None:
        return math.inf
    return bound if lower_better else -bound
