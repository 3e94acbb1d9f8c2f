"""A pipeline's ``constraints:``: bounds a trial must meet to count, absolute or relative to an arm.

    constraints:
      - {metric: size_bytes, max: 2.0e8}                                   # absolute
      - {metric: acc, min: 0.45}
      - {metric: ppl, max_ratio_to: none, max: 1.10}                      # ppl <= 1.10 x the unmodified model's
      - {metric: ppl, max_ratio_to: "magnitude[sparsity=0.0]", max: 1.02}

The driver judges each finished trial once, when it records it: Optuna gets one constraint
value per bound (``trial.set_constraint``; > 0 is infeasible by that much, in the metric's units),
which NSGA-II and TPE read to steer away from infeasible regions; the trial keeps
``feasible`` and the reason in its attributes, and MLflow gets the reason as a tag. Frontiers
(``paretolab frontier``, ``report``, the dashboard) are drawn over feasible trials only, with the
infeasible ones marked. A relative bound's reference is the earliest complete trial of its arm:
the driver runs that arm first, before any other trial, so every later verdict has it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from paretolab.errors import ConfigError
from paretolab.plugin_api.numbers import E_NOTATION, metric_value, number
from paretolab.study.arms import arm_params, in_arm
from paretolab.study.fields import lookup, no_unknown

STUDY_ATTR = "constraints"  # study user attr: the pipeline's bounds in words (empty without constraints)
FEASIBLE = "feasible"  # user attr: True / False
VIOLATIONS = "constraint_violations"  # user attr: one value per bound (> 0: by how much not)
REASON = "infeasible_because"  # user attr: the broken bounds in words
MEASURED = "constraint_metrics"  # user attr: the constrained metrics' values (a reference reads them)


@dataclass(frozen=True)
class Constraint:
    metric: str
    bound: float  # the limit, or the ratio when ``ratio_to`` is set
    upper: bool  # max (True) or min (False)
    ratio_to: str | None = None  # an arm's label
    arm: tuple[tuple[str, Any], ...] = ()  # the Optuna parameters that select the arm

    def limit(self, reference: float | None) -> float:
        return self.bound * reference if self.ratio_to is not None and reference is not None else self.bound

    def violation(self, value: float, reference: float | None = None) -> float:
        """> 0 when broken, by that much in the metric's units; <= 0 when met."""
        limit = self.limit(reference)
        return value - limit if self.upper else limit - value

    def describe(self, reference: float | None = None) -> str:
        sign = "<=" if self.upper else ">="
        if self.ratio_to is None:
            return f"{self.metric} {sign} {metric_value(self.metric, self.bound)}"
        ref = f" = {metric_value(self.metric, self.limit(reference))}" if reference is not None else ""
        return f"{self.metric} {sign} {number(self.bound)} x {self.ratio_to}{ref}"


def parse_constraints(raw: Any, stages: tuple[Any, ...], regs: Any) -> tuple[Constraint, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list) or not raw:
        raise ConfigError("constraints: expected a list like [{metric: ppl, max_ratio_to: none, max: 1.1}, {metric: size_bytes, max: 2.0e8}]")
    out = []
    for i, item in enumerate(raw):
        where = f"constraints[{i}]"
        if not isinstance(item, dict) or "metric" not in item:
            raise ConfigError(f"{where}: expected {{metric: NAME, max: X}} or {{metric: NAME, min: X}}, got {item!r}")
        no_unknown(item, ("metric", "max", "min", "max_ratio_to", "min_ratio_to"), where + ".")
        metric = lookup(regs.metrics, item["metric"], f"{where}.metric").name
        bounds = [k for k in ("max", "min") if k in item]
        if len(bounds) != 1:
            raise ConfigError(f"{where}: give exactly one of `max` and `min`, got {bounds or 'neither'}")
        key = bounds[0]
        value = item[key]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise ConfigError(f"{where}.{key}: expected a finite number, got {value!r}")
        ratio_keys = [k for k in ("max_ratio_to", "min_ratio_to") if k in item]
        if ratio_keys and ratio_keys != [f"{key}_ratio_to"]:
            raise ConfigError(f"{where}: {ratio_keys[0]} goes with `{ratio_keys[0].split('_')[0]}`, not `{key}`; "
                              f"write {{metric: {metric}, {key}_ratio_to: ARM, {key}: RATIO}}")
        label = item.get(f"{key}_ratio_to")
        if ratio_keys:
            label = "none" if label is None else str(label)
            if value <= 0:
                raise ConfigError(f"{where}.{key}: a ratio to {label!r} must be > 0, got {value!r}")
            arm = tuple(sorted(arm_params(stages, regs, label, f"{where}.{key}_ratio_to").items()))
            out.append(Constraint(metric, float(value), key == "max", label, arm))
        else:
            out.append(Constraint(metric, float(value), key == "max"))
    return tuple(out)


def reference_arms(constraints: tuple[Constraint, ...]) -> list[tuple[str, dict[str, Any]]]:
    """(label, Optuna parameters) of each distinct arm a relative bound refers to (the driver runs them first)."""
    seen: list[tuple[str, dict[str, Any]]] = []
    for c in constraints:
        if c.ratio_to is not None and dict(c.arm) not in [arm for _, arm in seen]:
            seen.append((f"the reference of constraints: {c.ratio_to}", dict(c.arm)))
    return seen


def missing_references(constraints: tuple[Constraint, ...], study: Any) -> list[str]:
    """The reference arms without a complete trial yet (their labels)."""
    import optuna

    complete = [t.params for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))]
    return [label for label, arm in reference_arms(constraints) if not any(in_arm(p, arm) for p in complete)]


def trial_verdict(constraints: tuple[Constraint, ...], study: Any, number: int, params: dict[str, Any],
                  metrics: dict[str, float]) -> tuple[dict[str, Any], dict[str, float]]:
    """:func:`verdict_attrs` of trial ``number``, its references read from the study's complete trials (and itself)."""
    import optuna

    if not constraints:
        return {}, {}
    done = [(t.number, t.params, t.user_attrs.get(MEASURED) or {})
            for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))]
    refs = references(constraints, [*done, (number, params, metrics)])
    return verdict_attrs(constraints, metrics, refs)


def references(constraints: tuple[Constraint, ...], trials: list[tuple[int, dict[str, Any], dict[str, float]]]) -> dict[int, float | None]:
    """Each relative bound's reference value (by index): its metric in the earliest complete trial of its arm.

    ``trials``: (number, Optuna params, constrained metric values) of the complete trials.
    """
    out: dict[int, float | None] = {}
    for i, c in enumerate(constraints):
        if c.ratio_to is None:
            continue
        members = sorted((n, m) for n, p, m in trials if in_arm(p, dict(c.arm)) and c.metric in m)
        out[i] = float(members[0][1][c.metric]) if members else None
    return out


def judge(constraints: tuple[Constraint, ...], metrics: dict[str, float], refs: dict[int, float | None]) -> tuple[list[float], str]:
    """(violation per bound, the broken bounds in words or "") of one trial's metrics."""
    values, broken = [], []
    for i, c in enumerate(constraints):
        value = metrics.get(c.metric)
        if value is None or not math.isfinite(value):
            values.append(math.inf)
            broken.append(f"{c.metric} not reported")
            continue
        if c.ratio_to is not None and refs.get(i) is None:
            values.append(math.inf)
            broken.append(f"{c.metric}: its reference {c.ratio_to} has no complete trial yet")
            continue
        v = c.violation(value, refs.get(i))
        values.append(v)
        if v > 0:
            broken.append(f"{c.metric} {metric_value(c.metric, value)} breaks {c.describe(refs.get(i))}")
    return values, "; ".join(broken)


def verdict_attrs(constraints: tuple[Constraint, ...], metrics: dict[str, float], refs: dict[int, float | None]) -> tuple[dict[str, Any], dict[str, float]]:
    """(user attrs, Optuna constraint values by key) recording one complete trial's verdict; both empty without constraints."""
    if not constraints:
        return {}, {}
    values, reason = judge(constraints, metrics, refs)
    user = {FEASIBLE: not reason, VIOLATIONS: [min(v, 1e300) for v in values], REASON: reason,
            MEASURED: {c.metric: float(metrics[c.metric]) for c in constraints if c.metric in metrics}}
    return user, {str(i): min(v, 1e300) for i, v in enumerate(values)}


def verdict_tags(verdict: dict[str, Any]) -> dict[str, str]:
    """The MLflow tags of a trial's verdict (none without constraints)."""
    if FEASIBLE not in verdict:
        return {}
    return {"paretolab.feasible": "true" if verdict[FEASIBLE] else "false", "paretolab.infeasible_because": verdict[REASON][:4000]}


def keep_verdict(trial: Any, verdict: dict[str, Any], bounds: dict[str, float]) -> None:
    """Write a verdict into a running Optuna trial: its user attrs, and one constraint value per bound (what NSGA-II and TPE read)."""
    for key, value in verdict.items():
        trial.set_user_attr(key, value)
    for key, bound in bounds.items():
        trial.set_constraint(key, bound)


def reason_text(text: str) -> str:
    """A stored reason or bound in words (``infeasible_because``, the study's ``constraints``) as today's code writes it:
    the e-notation older code left (``size_bytes 5.3806e+08 breaks size_bytes <= 1 x rtn = 1.8154e+08``) in the
    metric's unit (``538.1 MB``), a ratio bound (``1 x rtn``) a plain number."""
    parts = []
    for part in str(text).split("; "):
        metric = part.split(" ", 1)[0].rstrip(":")

        def plain(m: Any, part: str = part, metric: str = metric) -> str:
            value = float(m.group(1) + m.group(2))
            return number(value) if part[m.end():].startswith(" x ") else metric_value(metric, value)

        parts.append(E_NOTATION.sub(plain, part))
    return "; ".join(parts)
