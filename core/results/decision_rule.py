"""The words of a decision: a budget (``size_bytes <= 80 MB``) and a quality rule (``ppl no_worse 2 % vs none``).

A rule is a claim about every candidate configuration at once, in the claims' own words (``lower``, ``higher``,
``no_worse``, ``equivalent``; :mod:`paretolab.results.claims` judges it), so ``paretolab pick``, its Python twin and a
pipeline's ``decision:`` block read it one way:

- ``METRIC no_worse MARGIN vs LABEL`` and ``METRIC equivalent MARGIN vs LABEL``: ``2 %`` is relative (judged as a ratio,
  for a positive metric such as ``ppl``); ``1 pt`` is one percentage point of a fraction metric (``acc``); a bare number
  is in the metric's own unit;
- ``METRIC lower vs LABEL`` / ``METRIC higher vs LABEL``: no margin.

A budget is ``METRIC <= VALUE [UNIT]`` (also ``<``, ``>=``, ``>``): the unit a byte metric is written in (``80 MB``,
``512 MiB``) or a ratio to an arm's mean (``0.5 x none``). Each is refused in one line that names the field, the value
and the fix before anything is read.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

from paretolab.errors import ConfigError
from paretolab.plugin_api.numbers import BYTE_UNITS, metric_value, number, unit_of
from paretolab.study.report_spec import EXPECT, split_label

BYTES_PER = {"B": 1.0, "bytes": 1.0, "kB": 1e3, "KB": 1e3, "MB": 1e6, "GB": 1e9, "TB": 1e12,
             "KiB": 2.0**10, "MiB": 2.0**20, "GiB": 2.0**30}
FRACTION_UNITS = ("fraction", "accuracy")  # metrics a percentage point (``pt``) is a hundredth of
_NUMBER = r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?"
_KEEP = re.compile(rf"^\s*(?P<metric>[\w.:/-]+)\s+(?P<expect>\w+)\s+(?:(?P<margin>{_NUMBER})\s*(?P<unit>%|pt|[\w/]+)?\s+)?"
                   rf"vs\s+(?P<baseline>\S.*?)\s*$")
_WHERE = re.compile(rf"^\s*(?P<metric>[\w.:/-]+)\s*(?P<op><=|<|>=|>)\s*(?P<value>{_NUMBER})\s*(?P<unit>[A-Za-z%]+)?"
                    rf"(?:\s+(?P<arm>\S.*?))?\s*$")
KEEP_EXAMPLE = '"ppl no_worse 2 % vs none" or "acc equivalent 1 pt vs none"'
WHERE_EXAMPLE = '"size_bytes <= 80 MB" or "size_bytes <= 0.5 x none"'


@dataclass(frozen=True)
class Rule:
    """``metric`` of a candidate against ``baseline``, as a claim judges it (``scale: log`` for a relative margin)."""

    metric: str
    expect: str
    baseline: str
    margin: float | None = None
    scale: str = "linear"
    text: str = ""

    def words(self) -> str:
        if self.margin is None:
            return f"{self.metric} {self.expect} vs {self.baseline}"
        if self.scale == "log":
            return f"{self.metric} {self.expect} {number(self.margin * 100)} % vs {self.baseline}"
        if unit_of(self.metric) in FRACTION_UNITS:
            return f"{self.metric} {self.expect} {number(self.margin * 100)} pt vs {self.baseline}"
        return f"{self.metric} {self.expect} {metric_value(self.metric, self.margin)} vs {self.baseline}"


@dataclass(frozen=True)
class Budget:
    """``metric`` at most (``upper``) or at least ``value``, in the metric's stored unit, or ``value`` × ``ratio_to``'s mean."""

    metric: str
    value: float
    upper: bool = True
    strict: bool = False
    ratio_to: str | None = None
    text: str = ""

    def limit(self, reference: float | None) -> float | None:
        if self.ratio_to is None:
            return self.value
        return None if reference is None else self.value * reference

    def met(self, value: float, reference: float | None = None) -> bool:
        limit = self.limit(reference)
        if limit is None:
            return False
        if self.upper:
            return value < limit if self.strict else value <= limit
        return value > limit if self.strict else value >= limit

    def words(self, reference: float | None = None) -> str:
        sign = ("<" if self.strict else "<=") if self.upper else (">" if self.strict else ">=")
        if self.ratio_to is None:
            return f"{self.metric} {sign} {metric_value(self.metric, self.value)}"
        at = f" = {metric_value(self.metric, self.value * reference)}" if reference is not None else ""
        return f"{self.metric} {sign} {number(self.value)} x {self.ratio_to}{at}"


def parse_rule(text: str, metrics: dict[str, str], *, where: str = "--keep") -> Rule:
    """``text`` as a :class:`Rule`; ``metrics``: every metric the study recorded -> its better direction (``lower``/``higher``)."""
    match = _KEEP.match(str(text))
    if match is None:
        raise ConfigError(f"{where}: {text!r} is not a rule; write METRIC EXPECT [MARGIN %|pt] vs LABEL, e.g. {KEEP_EXAMPLE}")
    metric, expect, baseline = match["metric"], match["expect"], match["baseline"]
    _known(metric, metrics, where, text)
    if expect not in EXPECT:
        raise ConfigError(f"{where}: {expect!r} in {text!r} is not one of {', '.join(EXPECT)}; e.g. {KEEP_EXAMPLE}")
    split_label(baseline, where=where)
    if expect in ("lower", "higher"):
        if match["margin"] is not None:
            raise ConfigError(f"{where}: {expect!r} takes no margin ({text!r}); write '{metric} {expect} vs {baseline}', "
                              f"or 'no_worse MARGIN' for a margin")
        return Rule(metric, expect, baseline, text=text)
    if match["margin"] is None:
        raise ConfigError(f"{where}: {expect!r} needs a margin ({text!r}); e.g. '{metric} {expect} 2 % vs {baseline}'")
    margin, unit = float(match["margin"]), match["unit"] or ""
    if not math.isfinite(margin) or margin <= 0:
        raise ConfigError(f"{where}: the margin in {text!r} must be a positive number, got {match['margin']}")
    own = unit_of(metric)
    if unit == "%":
        if own in FRACTION_UNITS:
            raise ConfigError(f"{where}: {metric} is a fraction, so '{number(margin)} %' is ambiguous (relative, or points?); "
                              f"write '{number(margin)} pt' for percentage points")
        if margin >= 100:
            raise ConfigError(f"{where}: a relative margin must be below 100 %, got {number(margin)} %")
        return Rule(metric, expect, baseline, margin / 100, "log", text)
    if unit == "pt":
        if own not in FRACTION_UNITS:
            raise ConfigError(f"{where}: 'pt' (percentage points) is for a fraction such as acc, not {metric} "
                              f"(unit {own or 'none'}); write a relative margin like '2 %'")
        return Rule(metric, expect, baseline, margin / 100, "linear", text)
    return Rule(metric, expect, baseline, _in_unit(margin, unit, metric, where, text), "linear", text)


def parse_budget(text: str, metrics: dict[str, str], *, where: str = "--where") -> Budget:
    """``text`` as a :class:`Budget` in the metric's stored unit."""
    match = _WHERE.match(str(text))
    if match is None:
        raise ConfigError(f"{where}: {text!r} is not a budget; write METRIC <= VALUE [UNIT], e.g. {WHERE_EXAMPLE}")
    metric, op, value, unit, arm = match["metric"], match["op"], float(match["value"]), match["unit"] or "", match["arm"]
    _known(metric, metrics, where, text)
    upper, strict = op.startswith("<"), len(op) == 1
    if unit == "x":
        if not arm:
            raise ConfigError(f"{where}: {text!r} gives a ratio without its arm; write e.g. '{metric} {op} {number(value)} x none'")
        split_label(arm, where=where)
        if value <= 0:
            raise ConfigError(f"{where}: a ratio to {arm!r} must be > 0, got {number(value)}")
        return Budget(metric, value, upper, strict, arm, text)
    if arm:
        raise ConfigError(f"{where}: {arm!r} after the value in {text!r} is not understood; a ratio reads '{metric} {op} 0.5 x none'")
    return Budget(metric, _in_unit(value, unit, metric, where, text), upper, strict, None, text)


def _in_unit(value: float, unit: str, metric: str, where: str, text: str) -> float:
    """``value`` given in ``unit`` as ``metric`` stores it (``80 MB`` of a byte metric -> 8e7; of a MiB metric -> 76.29)."""
    own = unit_of(metric)
    if not unit or unit == own:
        return value
    if unit in BYTES_PER and own in BYTE_UNITS:
        return value * BYTES_PER[unit] / BYTE_UNITS[own]
    if unit in BYTES_PER:
        raise ConfigError(f"{where}: {metric} is not counted in bytes (unit {own or 'none'}), so {unit!r} in {text!r} does not apply")
    raise ConfigError(f"{where}: unknown unit {unit!r} in {text!r}; {metric}'s unit is {own or 'none (write the bare number)'}"
                      + (f"; bytes take {', '.join(BYTES_PER)}" if own in BYTE_UNITS else ""))


def _known(metric: str, metrics: dict[str, Any], where: str, text: str) -> None:
    if metric not in metrics:
        import difflib

        near = difflib.get_close_matches(metric, list(metrics), n=1, cutoff=0.4)
        hint = f"did you mean {near[0]!r}? " if near else ""
        raise ConfigError(f"{where}: no trial recorded {metric!r} (in {text!r}); {hint}recorded: {', '.join(sorted(metrics)) or 'none'}")
