"""The pipeline blocks the report reads, ``claim:`` and ``frontiers:``: parsed and checked with the pipeline.

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

FIELDS = ("text", "metric", "method", "baseline", "expect", "pair_by", "reference", "target", "tolerance")


NO_PAIR_BY = "none"  # pair_by: none - pair on the shared parameters alone


EXPECT = ("lower", "higher")


@dataclass(frozen=True)
class Claim:
    text: str
    metric: str
    method: str
    baseline: str
    expect: str = "lower"
    pair_by: str = "seed"
    reference: str | None = None  # a third label: report the share of the baseline-to-reference gap the method closes
    target: float | None = None  # a value claim: metric within target ± tolerance (no method or baseline)
    tolerance: float | None = None


def parse_claim(raw: Any, stages: tuple[Any, ...], regs: Any) -> Claim | None:
    """Validate the pipeline's ``claim:`` against its stages and the metric registry; None when absent."""
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise ConfigError(f"claim: expected a mapping {{{', '.join(FIELDS)}}}, got {raw!r}")
    no_unknown(raw, FIELDS, "claim.")
    if "target" in raw or "tolerance" in raw:
        return _parse_value_claim(raw, regs)
    for key in ("text", "metric", "method", "baseline"):
        if key not in raw:
            raise ConfigError(f"claim.{key}: required field is missing (a claim needs {', '.join(FIELDS[:5])}; pair_by defaults to seed)")
        if not isinstance(raw[key], str) or not raw[key].strip():
            raise ConfigError(f"claim.{key}: expected text, got {raw[key]!r}")
    metric = lookup(regs.metrics, raw["metric"], "claim.metric").name
    expect = raw.get("expect", "lower")
    if expect not in EXPECT:
        raise ConfigError(f"claim.expect: expected lower or higher (the direction the method should move {metric}), got {expect!r}")
    labels = choice_methods(stages)
    params = stage_params(stages, regs)
    if "reference" in raw and (not isinstance(raw["reference"], str) or raw["reference"] in (raw["method"], raw["baseline"])):
        raise ConfigError(f"claim.reference: expected a label other than the method and the baseline, got {raw['reference']!r}")
    for key in ("method", "baseline", "reference")[: 3 if "reference" in raw else 2]:
        base, wanted = split_label(raw[key], where=f"claim.{key}")
        unknown = [m for m in base.split("+") if m not in labels]
        if unknown:
            raise ConfigError(
                f"claim.{key}: {raw[key]!r} names {', '.join(map(repr, unknown))}, which no `choice` stage offers; "
                f"give methods of the choice stages joined by + ({', '.join(sorted(labels)) or 'the pipeline has no choice stage'})"
            )
        for name in wanted:
            if not any(f"{m}.{name}" in params for m in base.split("+")):
                raise ConfigError(f"claim.{key}: {raw[key]!r} selects on {name!r}, which is no parameter of {base!r}")
    if raw["method"] == raw["baseline"]:
        raise ConfigError(f"claim.baseline: {raw['baseline']!r} is also the claim's method; compare the method with another choice")
    pair_by = raw.get("pair_by", "seed")
    if pair_by != NO_PAIR_BY and (not isinstance(pair_by, str) or not any(pair_by in (p, p.split(".", 1)[1]) for p in params)):
        raise ConfigError(
            f"claim.pair_by: {pair_by!r} is no parameter of this pipeline's methods; "
            f"give one of {', '.join(sorted(params)) or 'none'} (or its short name, e.g. seed), "
            f"or `none` to pair on the shared parameters alone"
        )
    return Claim(raw["text"].strip(), metric, raw["method"], raw["baseline"], expect, pair_by, raw.get("reference"))


def _parse_value_claim(raw: dict[str, Any], regs: Any) -> Claim:
    """``{text, metric, target, tolerance}``: the metric's value itself is claimed (no method or baseline)."""
    for key in ("text", "metric", "target", "tolerance"):
        if key not in raw:
            raise ConfigError(f"claim.{key}: required field is missing (a value claim needs text, metric, target and tolerance)")
    for key in ("method", "baseline", "reference", "pair_by", "expect"):
        if key in raw:
            raise ConfigError(f"claim.{key}: a value claim (target, tolerance) compares no methods; drop {key} or drop target/tolerance")
    if not isinstance(raw["text"], str) or not raw["text"].strip():
        raise ConfigError(f"claim.text: expected text, got {raw['text']!r}")
    metric = lookup(regs.metrics, raw["metric"], "claim.metric").name
    numbers = {}
    for key in ("target", "tolerance"):
        value = raw[key]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise ConfigError(f"claim.{key}: expected a number, got {value!r}")
        numbers[key] = float(value)
    if numbers["tolerance"] <= 0:
        raise ConfigError(f"claim.tolerance: expected a number > 0 (the half-width around target), got {raw['tolerance']!r}")
    return Claim(raw["text"].strip(), metric, "", "", "near", NO_PAIR_BY, None, numbers["target"], numbers["tolerance"])


def claim_from(raw: Any) -> Claim | None:
    """The claim a stored pipeline carries (validated when the study started), or None."""
    if isinstance(raw, dict) and isinstance(raw.get("text"), str) and isinstance(raw.get("metric"), str) and "target" in raw:
        try:
            return Claim(raw["text"], raw["metric"], "", "", "near", NO_PAIR_BY, None, float(raw["target"]), float(raw["tolerance"]))
        except (KeyError, TypeError, ValueError):
            return None
    if not isinstance(raw, dict) or not all(isinstance(raw.get(k), str) for k in ("text", "metric", "method", "baseline")):
        return None
    reference = raw.get("reference") if isinstance(raw.get("reference"), str) else None
    return Claim(raw["text"], raw["metric"], raw["method"], raw["baseline"], str(raw.get("expect", "lower")), str(raw.get("pair_by", "seed")), reference)


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


def choice_methods(stages: tuple[Any, ...]) -> set[str]:
    """Methods offered by the ``choice`` stages of parsed stages."""
    return {o.method for s in stages if len(s.options) > 1 for o in s.options}


def stage_params(stages: tuple[Any, ...], regs: Any) -> set[str]:
    """``method.param`` for every parameter the stages' methods have."""
    out = set()
    for stage in stages:
        for option in stage.options:
            method = regs.methods.get(option.method)
            out |= {f"{option.method}.{p}" for p in {*method.search_space(), *method.defaults(), *option.params}}
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
