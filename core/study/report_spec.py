"""The pipeline blocks the report reads, ``claims:`` (or ``claim:``) and ``frontiers:``: parsed and checked with the pipeline.

A trial never reads them (they are left out of the pipeline hash); :mod:`paretolab.results.claims`
judges a claim on the stored trials and :mod:`paretolab.results.frontier` lists the frontiers. They
are validated here, where the pipeline is parsed, so that a typo is refused before any trial runs
and parsing needs none of the report's code.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from paretolab.errors import ConfigError
from paretolab.study.fields import lookup, no_unknown

FIELDS = ("text", "metric", "method", "baseline", "expect", "replicates", "pair_by", "margin", "scale",
          "reference", "target", "tolerance", "works", "budget", "budget_tolerance")


NO_PAIR_BY = "none"  # pair_by: none (or replicates: []) - no replicate: pair on the shared parameters alone


EXPECT = ("lower", "higher", "no_worse", "equivalent")
SCALES = ("linear", "log")
# A budget a claim names ("at equal tokens"): the metric the train stage records it in. Any other registered metric
# (expert_bytes, ...) can be named too; the verdict is then reached only where the paired trials recorded it equal.
BUDGETS = {"tokens": "train_tokens", "steps": "train_steps", "flops": "train_flops"}
BUDGET_TOLERANCE = 0.05  # budgets within 5 % of the larger count as equal unless the claim says otherwise


@dataclass(frozen=True)
class Claim:
    """One claim of a pipeline: ``metric(method) − metric(baseline)`` judged over named replicates.

    ``replicates`` are the parameters whose values are draws (seeds, calibration draws, data splits):
    pairs are matched on them and on every shared setting; every other setting that varies splits
    the verdict per setting. ``better`` is the metric's good direction (from its registration), which
    ``no_worse`` and ``equivalent`` judge against ``margin`` (relative on ``scale: log``).
    """

    text: str
    metric: str
    method: str
    baseline: str
    expect: str = "lower"
    replicates: tuple[str, ...] = ("seed",)
    reference: str | None = None  # a third label: report the share of the baseline-to-reference gap the method closes
    target: float | None = None  # a value claim: metric within target ± tolerance (no method or baseline)
    tolerance: float | None = None
    margin: float | None = None  # no_worse / equivalent: how much worse (or different) still counts as no worse
    scale: str = "linear"  # log: judge the ratio method ÷ baseline (ppl, bytes, time)
    better: str = "lower"  # the metric's good direction: lower or higher
    works: str | None = None  # a metric that is 1 where the method did what it is for (decode_ok): below 1, no verdict there
    budget: str | None = None  # "tokens", "steps", "flops" or a metric: the claim is at equal budget (no verdict where it is not)
    budget_tolerance: float = BUDGET_TOLERANCE  # how far apart (relative to the larger) paired budgets may be and still count as equal

    def __post_init__(self) -> None:
        if isinstance(self.replicates, str):  # the pair_by spelling: one name, or none
            object.__setattr__(self, "replicates", () if self.replicates == NO_PAIR_BY else (self.replicates,))

    @property
    def budget_metric(self) -> str | None:
        """The metric the claim's budget is recorded in (``train_tokens`` for ``budget: tokens``), or None."""
        return BUDGETS.get(self.budget, self.budget) if self.budget else None

    @property
    def pair_by(self) -> str:
        """The replicates as the old ``pair_by`` spelling read: ``seed``, ``none`` or ``a, b``."""
        return ", ".join(self.replicates) or NO_PAIR_BY


def parse_claims(raw: dict[str, Any], stages: tuple[Any, ...], regs: Any) -> tuple[Claim, ...]:
    """A pipeline's ``claims:`` (a list) or ``claim:`` (one), validated against its stages and the metric registry."""
    if "claim" in raw and "claims" in raw:
        raise ConfigError("claims: give either `claim:` (one claim) or `claims:` (a list), not both")
    if "claims" not in raw:
        one = parse_claim(raw.get("claim"), stages, regs)
        return (one,) if one is not None else ()
    items = raw["claims"]
    if not isinstance(items, list) or not items:
        raise ConfigError(f"claims: expected a list of claim mappings [{{text, metric, method, baseline, ...}}, ...], got {items!r}")
    return tuple(parse_claim(item, stages, regs, where=f"claims[{i}]") for i, item in enumerate(items))  # type: ignore[misc]


def parse_claim(raw: Any, stages: tuple[Any, ...], regs: Any, *, where: str = "claim") -> Claim | None:
    """Validate one claim mapping against the stages and the metric registry; None when absent."""
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: expected a mapping {{{', '.join(FIELDS)}}}, got {raw!r}")
    no_unknown(raw, FIELDS, f"{where}.")
    if "target" in raw or "tolerance" in raw:
        return _parse_value_claim(raw, regs, where)
    for key in ("text", "metric", "method", "baseline"):
        if key not in raw:
            raise ConfigError(f"{where}.{key}: required field is missing (a claim needs text, metric, method, baseline; "
                              "expect defaults to lower, replicates to [seed])")
        if not isinstance(raw[key], str) or not raw[key].strip():
            raise ConfigError(f"{where}.{key}: expected text, got {raw[key]!r}")
    metric = lookup(regs.metrics, raw["metric"], f"{where}.metric")
    expect = raw.get("expect", "lower")
    if expect not in EXPECT:
        raise ConfigError(f"{where}.expect: expected lower or higher (the direction the method should move {metric.name}), "
                          f"or no_worse / equivalent with a margin; got {expect!r}")
    margin = _margin(raw, expect, where)
    scale = raw.get("scale", "linear")
    if scale not in SCALES:
        raise ConfigError(f"{where}.scale: expected linear or log (log judges the ratio method ÷ baseline), got {scale!r}")
    if scale == "log" and margin is not None and margin >= 1:
        raise ConfigError(f"{where}.margin: {margin:g} with scale: log is a ratio ×(1 − {margin:g}) … ×(1 + {margin:g}), which needs a "
                          "margin below 1 (0.1 means ×0.9 … ×1.1)")
    works = None
    if "works" in raw:
        works = lookup(regs.metrics, raw["works"], f"{where}.works").name
    labels = {o.method for s in stages for o in s.options}  # a choice's method, or a fixed stage's (rtn[bits=4] vs rtn[bits=8])
    params = stage_params(stages, regs)
    if "reference" in raw and (not isinstance(raw["reference"], str) or raw["reference"] in (raw["method"], raw["baseline"])):
        raise ConfigError(f"{where}.reference: expected a label other than the method and the baseline, got {raw['reference']!r}")
    for key in ("method", "baseline", "reference")[: 3 if "reference" in raw else 2]:
        base, wanted = split_label(raw[key], where=f"{where}.{key}")
        unknown = [m for m in base.split("+") if m not in labels]
        if unknown:
            raise ConfigError(
                f"{where}.{key}: claim {raw['text'].strip()!r} compares {raw[key]!r}, but no stage of this pipeline runs "
                f"{', '.join(map(repr, unknown))}; name methods of its stages joined by + ({', '.join(sorted(labels))}), "
                f"or add {unknown[0]!r} to a choice stage"
            )
        for name in wanted:
            if not any(f"{m}.{name}" in params for m in base.split("+")):
                raise ConfigError(f"{where}.{key}: {raw[key]!r} selects on {name!r}, which is no parameter of {base!r}")
    if raw["method"] == raw["baseline"]:
        raise ConfigError(f"{where}.baseline: {raw['baseline']!r} is also the claim's method; compare the method with another choice")
    replicates = _replicates(raw, params, where)
    better = "lower" if metric.direction == "minimize" else "higher"
    budget, tolerance = _budget(raw, regs, where)
    return Claim(raw["text"].strip(), metric.name, raw["method"], raw["baseline"], expect, replicates, raw.get("reference"),
                 margin=margin, scale=scale, better=better, works=works, budget=budget, budget_tolerance=tolerance)


def _budget(raw: dict[str, Any], regs: Any, where: str) -> tuple[str | None, float]:
    """``budget: tokens`` (steps, flops, or a registered metric) and its ``budget_tolerance`` (default 5 %)."""
    if "budget_tolerance" in raw and "budget" not in raw:
        raise ConfigError(f"{where}.budget_tolerance: belongs to a budget; add budget: tokens (or steps, flops) or drop it")
    tolerance = raw.get("budget_tolerance", BUDGET_TOLERANCE)
    if isinstance(tolerance, bool) or not isinstance(tolerance, (int, float)) or not math.isfinite(tolerance) or not 0 <= tolerance < 1:
        raise ConfigError(f"{where}.budget_tolerance: expected a fraction in [0, 1) (0.05: paired budgets within 5 % of the larger "
                          f"count as equal), got {tolerance!r}")
    budget = raw.get("budget")
    if budget is None:
        return None, float(tolerance)
    if not isinstance(budget, str) or not budget.strip():
        raise ConfigError(f"{where}.budget: expected {', '.join(BUDGETS)} or a metric name (the budget the claim holds equal), got {budget!r}")
    if budget not in BUDGETS:
        lookup(regs.metrics, budget, f"{where}.budget")
    return budget, float(tolerance)


def _margin(raw: dict[str, Any], expect: str, where: str) -> float | None:
    if expect in ("no_worse", "equivalent"):
        margin = raw.get("margin")
        if isinstance(margin, bool) or not isinstance(margin, (int, float)) or not math.isfinite(margin) or margin < 0:
            raise ConfigError(f"{where}.margin: expect {expect} needs a margin >= 0 (how much worse still counts as no worse, "
                              f"in the metric's units; a fraction such as 0.05 with scale: log), got {margin!r}")
        return float(margin)
    if "margin" in raw:
        raise ConfigError(f"{where}.margin: a margin belongs to expect no_worse or equivalent, not {expect}; drop it or change expect")
    return None


def _replicates(raw: dict[str, Any], params: set[str], where: str) -> tuple[str, ...]:
    """``replicates: [seed, ...]`` (``pair_by: seed`` is the one-item spelling; ``none`` or ``[]`` for no replicate)."""
    if "replicates" in raw and "pair_by" in raw:
        raise ConfigError(f"{where}.pair_by: give either replicates (a list) or pair_by (its one-item spelling), not both")
    key = "replicates" if "replicates" in raw else "pair_by"
    value = raw.get(key, "seed")
    names = [] if value in (NO_PAIR_BY, None) else [value] if isinstance(value, str) else value
    if not isinstance(names, list) or not all(isinstance(n, str) and n for n in names):
        raise ConfigError(f"{where}.{key}: expected a list of parameter names (e.g. [seed]), or none; got {value!r}")
    for name in names:
        if not any(name in (p, p.split(".", 1)[1]) for p in params):
            raise ConfigError(
                f"{where}.{key}: {name!r} is no parameter of this pipeline's methods; "
                f"give one of {', '.join(sorted(params)) or 'none'} (or its short name, e.g. seed), "
                f"or `none` when the arms have no replicate (each setting then rests on its examples alone)"
            )
    return tuple(names)


def _parse_value_claim(raw: dict[str, Any], regs: Any, where: str = "claim") -> Claim:
    """``{text, metric, target, tolerance}``: the metric's value itself is claimed (no method or baseline)."""
    for key in ("text", "metric", "target", "tolerance"):
        if key not in raw:
            raise ConfigError(f"{where}.{key}: required field is missing (a value claim needs text, metric, target and tolerance)")
    for key in ("method", "baseline", "reference", "pair_by", "replicates", "expect", "margin", "scale", "budget", "budget_tolerance"):
        if key in raw:
            raise ConfigError(f"{where}.{key}: a value claim (target, tolerance) compares no methods; drop {key} or drop target/tolerance")
    if not isinstance(raw["text"], str) or not raw["text"].strip():
        raise ConfigError(f"{where}.text: expected text, got {raw['text']!r}")
    metric = lookup(regs.metrics, raw["metric"], f"{where}.metric").name
    numbers = {}
    for key in ("target", "tolerance"):
        value = raw[key]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise ConfigError(f"{where}.{key}: expected a number, got {value!r}")
        numbers[key] = float(value)
    if numbers["tolerance"] <= 0:
        raise ConfigError(f"{where}.tolerance: expected a number > 0 (the half-width around target), got {raw['tolerance']!r}")
    return Claim(raw["text"].strip(), metric, "", "", "near", (), None, numbers["target"], numbers["tolerance"])


def claims_from(pipeline: dict[str, Any], directions: dict[str, str]) -> list[Claim]:
    """The claims a stored pipeline carries (validated when the study started); ``directions``: metric -> minimize/maximize."""
    raw = pipeline.get("claims")
    items = raw if isinstance(raw, list) else [pipeline.get("claim")]
    return [c for c in (claim_from(item, directions) for item in items) if c is not None]


def claim_from(raw: Any, directions: dict[str, str] | None = None) -> Claim | None:
    """One stored claim mapping back to a Claim, or None when it is not one."""
    if isinstance(raw, dict) and isinstance(raw.get("text"), str) and isinstance(raw.get("metric"), str) and "target" in raw:
        try:
            return Claim(raw["text"], raw["metric"], "", "", "near", (), None, float(raw["target"]), float(raw["tolerance"]))
        except (KeyError, TypeError, ValueError):
            return None
    if not isinstance(raw, dict) or not all(isinstance(raw.get(k), str) for k in ("text", "metric", "method", "baseline")):
        return None
    reference = raw.get("reference") if isinstance(raw.get("reference"), str) else None
    value = raw.get("replicates", raw.get("pair_by", "seed"))
    replicates = () if value in (NO_PAIR_BY, None) else (value,) if isinstance(value, str) else tuple(map(str, value))
    margin = raw.get("margin")
    better = "higher" if (directions or {}).get(raw["metric"]) == "maximize" else "lower"
    tolerance = raw.get("budget_tolerance", BUDGET_TOLERANCE)
    return Claim(raw["text"], raw["metric"], raw["method"], raw["baseline"], str(raw.get("expect", "lower")), replicates, reference,
                 margin=float(margin) if isinstance(margin, (int, float)) else None, scale=str(raw.get("scale", "linear")), better=better,
                 works=raw.get("works") if isinstance(raw.get("works"), str) else None,
                 budget=raw.get("budget") if isinstance(raw.get("budget"), str) else None,
                 budget_tolerance=float(tolerance) if isinstance(tolerance, (int, float)) else BUDGET_TOLERANCE)


def split_label(label: str, *, where: str = "claim") -> tuple[str, dict[str, str]]:
    """``tetrajet[recipe=naive]`` -> (``tetrajet``, {``recipe``: ``naive``}); a label without brackets selects nothing more."""
    base, bracket, rest = label.partition("[")
    if not bracket:
        return label.strip(), {}
    if not rest.endswith("]"):
        raise ConfigError(f"{where}: {label!r} opens '[' without closing it; write method[param=value, ...]")
    wanted = {}
    for item in filter(None, (part.strip() for part in rest[:-1].split(","))):
        name, eq, value = item.partition("=")
        if not eq or not name.strip():
            raise ConfigError(f"{where}: {item!r} in {label!r} is not param=value")
        wanted[name.strip()] = value.strip()
    return base.strip(), wanted


def stage_params(stages: tuple[Any, ...], regs: Any) -> set[str]:
    """``method.param`` for every parameter the stages' methods have."""
    out = set()
    for stage in stages:
        for option in stage.options:
            method = regs.methods.get(option.method)
            out |= {f"{option.method}.{p}" for p in {*method.search_space(), *method.defaults(), *option.params}}
            out |= {f"{option.method}.{p}/{group.name}" for group in getattr(option, "layers", ()) for p in group.params}  # per layer group
    return out


def parse_frontiers(raw: Any, regs: Any) -> tuple[tuple[str, str], ...]:
    """A pipeline's ``frontiers:`` — pairs of registered metrics (``[val_bpb, pipeline_energy_j]``) whose frontier the report prints."""
    if raw is None:
        return ()
    if not isinstance(raw, list) or not raw:
        raise ConfigError(f"frontiers: expected a list of metric pairs like [[val_bpb, pipeline_energy_j]], got {raw!r}")
    out = []
    for i, pair in enumerate(raw):
        if not isinstance(pair, list) or len(pair) != 2 or not all(isinstance(m, str) for m in pair) or pair[0] == pair[1]:
            raise ConfigError(f"frontiers[{i}]: expected two different metric names [quality, cost], got {pair!r}")
        out.append(tuple(lookup(regs.metrics, m, f"frontiers[{i}]").name for m in pair))
    return tuple(out)  # type: ignore[return-value]
