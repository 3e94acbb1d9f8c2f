"""A decision read from a study (stores or bundle) and written down: the lines ``paretolab pick`` prints (Markdown, also
the record's page) and the record as JSON. One reading (:func:`decide_study`) serves the CLI, ``paretolab.pick`` and
the dashboard; every number is :mod:`paretolab.plugin_api.numbers`' and every verdict the claims' own."""

from __future__ import annotations

from typing import Any

from paretolab.data.names import markdown_text
from paretolab.plugin_api.numbers import RATIO, interval_text, metric_value, number, unit_of
from paretolab.results.pick import Candidate, Decision, decide
from paretolab.results.source import Source, source_of
from paretolab.results.verdict_words import verdict_mark
from paretolab.stores.locations import Stores

RECORD_VERSION = 1


def decide_study(name: str, where: Stores | Source, *, keep: str, budgets: list[str] | tuple[str, ...] = (),
                 cost: str | None = None) -> Decision:
    """The decision on study ``name``'s complete trials, judged as its report judges claims."""
    from paretolab.plugin_api.manager import registries
    from paretolab.results.metric_facts import chance_levels, metric_bounds, metric_exact
    from paretolab.results.read import load_study, trial_table
    from paretolab.results.section import claim_trials

    source = source_of(where)
    pipeline = load_study(name, source).user_attrs.get("pipeline") or {}
    _, rows = trial_table(name, source)
    directions = {m.name: "higher" if m.direction == "maximize" else "lower" for m in registries().metrics}
    return decide(name, claim_trials(pipeline, rows), pipeline, directions, keep=keep, where=budgets, cost=cost,
                  fetch=source.per_example(), bounds=metric_bounds, chance=chance_levels(pipeline, source), exact=metric_exact)


def decision_lines(d: Decision) -> list[str]:
    """The decision in Markdown: the rule, the choice with its evidence, rivals, unconfirmed cheaper ones, every candidate."""
    budget = "; ".join(b.words(d.references.get(str(b.ratio_to))) for b in d.budgets) or "no budget"
    best = "lowest" if d.lower_cost else "highest"
    lines = [f"# Decision: {markdown_text(d.study)}", "",
             f"- **Rule:** keep `{d.rule.words()}`", f"- **Budget:** {budget}", f"- **Cost:** the {best} mean `{d.cost}` wins",
             f"- **Candidates:** {len(d.candidates)} configurations, each judged by all its replicates (mean cost, "
             f"paired interval against `{d.rule.baseline}`)", ""]
    if d.choice is not None:
        c = d.choice
        lines += [f"**Choice: `{c.name()}`** — trials {_numbers(c)}; {d.cost} {_cost(d, c)}; {_evidence(d, c)}.", "",
                  f"Its settings: {_settings(c)}.", ""]
        if d.rivals:
            lines += ["Rivals (they keep the rule too, at a cost within noise of the choice's):", ""]
            lines += [f"- `{r.name()}` — {d.cost} {_cost(d, r)}; {_evidence(d, r)}" for r in d.rivals] + [""]
        if d.unconfirmed:
            lines += ["Cheaper, but unconfirmed (the interval cannot tell them from a breach of the rule):", ""]
            lines += [f"- `{u.name()}` — {d.cost} {_cost(d, u)}; {_evidence(d, u)}" for u in d.unconfirmed] + [""]
    else:
        lines += [f"**No choice:** {d.why}.", ""]
        if d.nearest is not None:
            n = d.nearest
            lines += [f"Nearest miss: `{n.name()}` — trials {_numbers(n)}; {d.cost} {_cost(d, n)}"
                      f"{'; over the budget: ' + n.over if n.over else ''}; {_evidence(d, n)}.", ""]
    lines += confirmation_lines(d)
    lines += ["| | configuration | trials | " + d.cost + " (mean) | " + d.rule.metric + " (mean) | against " + d.rule.baseline
              + " | verdict | budget |", "|---|---|---|---|---|---|---|---|"]
    for c in d.candidates:
        lines.append(f"| {verdict_mark(c.verdict)} | `{c.name()}` | {_numbers(c)} | {metric_value(d.cost, c.cost)} | "
                     f"{metric_value(d.rule.metric, c.quality)} | {candidate_effect(d, c)} | {markdown_text(c.verdict)} | "
                     f"{'within' if c.in_budget else markdown_text(c.over)} |")
    return lines + [""]


POWER = (1.96 + 0.84) / 1.96  # a 95 % interval's half-width -> the difference detected with 80 % power (two-sided 5 %)


def confirmation_lines(d: Decision) -> list[str]:
    """The choice (and rivals) judged again on the confirm part; what the search part said; the smallest difference the
    confirm part could detect. A study with a split but no confirmation yet says how to get one."""
    if d.choice is None:
        return []
    if d.confirmation is None:
        if d.split:
            return ["**Not confirmed yet:** the study keeps a confirm part the search never scored; `paretolab pick` with "
                    "the study's stores (not a bundle) re-measures the choice there.", ""]
        return ["**Not confirmed:** the search scored every example (no `confirm:` split in the pipeline), so the choice's "
                "interval is the one that selected it; add `confirm: {share: 0.5, seed: 0}` to confirm on held-out examples.", ""]
    c, conf = d.choice, d.confirmation
    again = conf.candidates.get(c.name())
    if again is None:
        return []
    held = conf.survived(c)
    fresh = "; calibrated methods re-applied on fresh calibration draws" if conf.fresh_draws else ""
    lines = [f"**On the confirm part** ({conf.examples}; examples the search never scored{fresh}): "
             f"{_evidence(d, again)} — " + ("the choice survived." if held else "the choice did **not** survive: the search's "
                                           "evidence for it does not hold on new examples."), ""]
    lines.append(f"- search part: {candidate_effect(d, c)}; confirm part: {candidate_effect(d, again)} "
                 f"(the shrinkage from the examples that chose it: {_moved(d, c, again)})")
    detect = detectable(d, again)
    if detect:
        lines.append(f"- the smallest difference the confirm part could detect (80 % power, two-sided 5 %): {detect}")
    for r in d.rivals:
        other = conf.candidates.get(r.name())
        if other is not None:
            lines.append(f"- rival `{r.name()}` on the confirm part: {_evidence(d, other)}")
    return [*lines, ""]


def detectable(d: Decision, c: Candidate) -> str:
    """The smallest effect ``c``'s confirm-part interval could tell from none: its half-width scaled to 80 % power."""
    import math

    if c.low is None or c.high is None or c.low == c.high:
        return ""
    if d.rule.scale == "log" and c.low > 0:
        return number(math.exp(POWER * (math.log(c.high) - math.log(c.low)) / 2), RATIO) + f" on {d.rule.metric} ÷ {d.rule.baseline}"
    return number(POWER * (c.high - c.low) / 2, unit_of(d.rule.metric)) + f" on {d.rule.metric} − {d.rule.baseline}"


def _moved(d: Decision, search: Candidate, confirm: Candidate) -> str:
    if search.difference is None or confirm.difference is None:
        return "not measurable"
    if d.rule.scale == "log":
        return f"{number(confirm.difference / search.difference, RATIO)} on the ratio"
    return f"{number(confirm.difference - search.difference, unit_of(d.rule.metric), signed=True)} on the difference"


def decision_record(d: Decision) -> dict[str, Any]:
    """The decision as JSON data (the record ``pick --out`` writes beside its Markdown page)."""
    return {"version": RECORD_VERSION, "study": d.study, "rule": d.rule.words(), "rule_text": d.rule.text,
            "budgets": [b.words(d.references.get(str(b.ratio_to))) for b in d.budgets], "cost": d.cost,
            "choice": _candidate(d.choice), "rivals": [_candidate(c) for c in d.rivals],
            "unconfirmed": [_candidate(c) for c in d.unconfirmed], "nearest_miss": _candidate(d.nearest), "why": d.why,
            "split": d.split, "confirmation": None if d.confirmation is None else {
                "examples": d.confirmation.examples, "survived": d.confirmation.survived(d.choice) if d.choice else None,
                "candidates": {k: _candidate(v) for k, v in d.confirmation.candidates.items()}},
            "candidates": [_candidate(c) for c in d.candidates]}


def _candidate(c: Candidate | None) -> dict[str, Any] | None:
    if c is None:
        return None
    return {"configuration": c.name(), "label": c.label, "settings": {k: c.settings[k] for k in sorted(c.settings)},
            "engines": engine_costs(c),
            "trials": c.numbers, "cost": c.cost, "cost_span": list(c.cost_span), "quality": c.quality,
            "difference": c.difference, "low": c.low, "high": c.high, "replicates": c.replicates, "verdict": c.verdict,
            "in_budget": c.in_budget, "over_budget": c.over}


def engine_costs(c: Candidate) -> dict[str, float]:
    """What the engines measured for a candidate's trials (the engine measure's ``llama_*`` / ``vllm_*`` numbers), each
    metric's mean over the trials that have it; empty where the study ran no engine."""
    from paretolab.results.engines import ENGINES

    seen: dict[str, list[float]] = {}
    for t in c.trials:
        for k, v in t.items():
            if k.split("_", 1)[0] in ENGINES and isinstance(v, (int, float)) and not isinstance(v, bool):
                seen.setdefault(k, []).append(float(v))
    return {k: sum(vs) / len(vs) for k, vs in sorted(seen.items())}


def _settings(c: Candidate) -> str:
    from paretolab.plugin_api.numbers import param_value

    return ", ".join(f"`{k}={param_value(v)}`" for k, v in sorted(c.settings.items())) or "none (the unmodified model)"


def _numbers(c: Candidate) -> str:
    return ", ".join(map(str, c.numbers))


def _cost(d: Decision, c: Candidate) -> str:
    low, high = (metric_value(d.cost, v) for v in c.cost_span)
    return f"{metric_value(d.cost, c.cost)} (span {low}–{high})" if low != high else metric_value(d.cost, c.cost)


def candidate_effect(d: Decision, c: Candidate) -> str:
    """The candidate against the baseline: ``×1.012 [×0.998, ×1.027]`` (a relative rule) or a signed difference."""
    if c.difference is None:
        return "—"
    log = d.rule.scale == "log"
    unit = RATIO if log else unit_of(d.rule.metric)
    if c.low is None or c.high is None or c.low == c.high:
        return number(c.difference, unit, signed=not log)
    return interval_text(c.difference, c.low, c.high, unit, signed=not log)


def _evidence(d: Decision, c: Candidate) -> str:
    log = d.rule.scale == "log"
    what = f"{d.rule.metric} {'÷' if log else '−'} {d.rule.baseline} = {candidate_effect(d, c)}"
    reps = f" over {c.replicates} pair(s)" if c.replicates else ""
    return f"{what}{reps}: {c.verdict}"
