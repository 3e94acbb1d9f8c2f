"""Uncertainty of quality numbers: standard errors, bootstrap intervals, paired differences.

Per-example scores travel as a trial's ``per_example.json`` artifact (:func:`per_example_json`):
``{"unit": "example" | "window", "n": N, "scores": {metric: [...]}, "weights": [...]?}``. A metric
is the (weighted) mean of its scores, except ``ppl``, which is ``exp`` of the token-weighted mean
of the per-window ``nll`` (each window's score is its mean NLL, its weight its token count).
Intervals are 95 % percentile bootstraps with a fixed seed, so a report is reproducible.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

ARTIFACT = "per_example.json"
LEVEL = 0.95
RESAMPLES = 2000
SEED = 0


def stderr(values: Sequence[float]) -> float:
    """Standard error of the mean as lm-eval computes it: sample std (n - 1) / sqrt(n)."""
    n = len(values)
    if n < 2:
        return float("nan")
    return float(np.std(np.asarray(values, dtype=float), ddof=1) / math.sqrt(n))


def mean_with_stderr(name: str, values: Sequence[float]) -> dict[str, float]:
    """``{name: mean, name_stderr: stderr}``; the stderr is left out below two values (it is undefined)."""
    out = {name: float(np.mean(values))} if len(values) else {}
    if len(values) >= 2:
        out[f"{name}_stderr"] = stderr(values)
    return out


def t_interval(values: Sequence[float], level: float = LEVEL) -> tuple[float, float, float]:
    """``(mean, low, high)``: the mean of ``values`` and its ``level`` Student-t interval (NaN bounds below two values)."""
    v = np.asarray([float(x) for x in values], dtype=float)
    if len(v) == 0:
        return float("nan"), float("nan"), float("nan")
    mean = float(v.mean())
    if len(v) < 2:
        return mean, float("nan"), float("nan")
    from scipy.stats import t

    half = float(t.ppf((1 + level) / 2, len(v) - 1) * v.std(ddof=1) / math.sqrt(len(v)))
    return mean, mean - half, mean + half


def per_example_json(unit: str, scores: dict[str, Sequence[float]], weights: Sequence[float] | None = None) -> str:
    """The ``per_example.json`` artifact text for a task's per-example (or per-window) scores."""
    n = len(next(iter(scores.values()))) if scores else 0
    payload: dict[str, Any] = {"unit": unit, "n": n, "scores": {k: [float(v) for v in vs] for k, vs in scores.items()}}
    if weights is not None:
        payload["weights"] = [float(w) for w in weights]
    return json.dumps(payload)


@dataclass(frozen=True)
class Samples:
    """One metric's per-unit scores, ready to resample."""

    values: np.ndarray
    weights: np.ndarray
    exp: bool  # the metric is exp(weighted mean), e.g. perplexity from per-window NLL
    unit: str
    root: bool = False  # the metric is sqrt(weighted mean), e.g. RMSE from per-row squared errors

    @property
    def n(self) -> int:
        return len(self.values)

    def value(self, idx: np.ndarray | None = None) -> np.ndarray | float:
        """The metric on all units, or on each row of resampled unit indices ``idx`` (B, n)."""
        if idx is None:
            mean = float(np.sum(self.values * self.weights) / np.sum(self.weights))
            return math.exp(mean) if self.exp else math.sqrt(mean) if self.root else mean
        mean = np.sum(self.values[idx] * self.weights[idx], axis=1) / np.sum(self.weights[idx], axis=1)
        return np.exp(mean) if self.exp else np.sqrt(mean) if self.root else mean


# Metrics stored as something else per unit: ppl = exp(mean nll), rmse = sqrt(mean squared error).
DERIVED = {"ppl": ("nll", "exp"), "rmse": ("sq_err", "root")}
# Keys the learner tasks (tabular, sequence) wrote before their per-row scores were named after their metrics.
LEGACY_KEYS = {"acc": "correct", "log_loss": "nll"}


def merge_per_example(existing: str, added: str) -> str:
    """Two ``per_example.json`` texts of one trial as one: the scores side by side when both score the same units (same
    unit and count), else both payloads as ``parts`` (a task's windows and a method's problems): no score is lost."""
    old, new = json.loads(existing), json.loads(added)
    parts = old.get("parts", [old])
    for part in parts:
        if part.get("unit") == new.get("unit") and part.get("n") == new.get("n") and part.get("weights") == new.get("weights"):
            part["scores"] = {**part.get("scores", {}), **new.get("scores", {})}
            break
    else:
        parts.append(new)
    return json.dumps(parts[0] if len(parts) == 1 else {"parts": parts})


def samples(payload: dict[str, Any], metric: str) -> Samples | None:
    """``metric``'s per-unit scores from a ``per_example.json`` payload (or the part of it holding them); None when it has none."""
    for part in payload.get("parts", []):
        found = samples(part, metric)
        if found is not None:
            return found
    scores = payload.get("scores", {})
    key, how = DERIVED.get(metric, (metric, ""))
    if not scores.get(key) and metric in LEGACY_KEYS and payload.get("unit") == "row":
        key = LEGACY_KEYS[metric]
    if not scores.get(key):
        return None
    values = np.asarray(scores[key], dtype=float)
    weights = np.asarray(payload.get("weights") or [1.0] * len(values), dtype=float)
    return Samples(values, weights, how == "exp", str(payload.get("unit", "example")), root=how == "root")


def bootstrap_interval(s: Samples, *, resamples: int = RESAMPLES, level: float = LEVEL, seed: int = SEED) -> tuple[float, float]:
    """Percentile bootstrap interval of the metric over its units."""
    idx = np.random.default_rng(seed).integers(0, s.n, size=(resamples, s.n))
    stats = s.value(idx)
    tail = (1 - level) / 2
    return float(np.quantile(stats, tail)), float(np.quantile(stats, 1 - tail))


@dataclass(frozen=True)
class PairedDifference:
    """``a - b`` on the same units with its paired-bootstrap interval."""

    diff: float
    low: float
    high: float
    n: int
    unit: str

    @property
    def within_noise(self) -> bool:
        """True when the interval contains zero: the two numbers are not distinguishable."""
        return self.low <= 0.0 <= self.high


def paired_difference(a: Samples, b: Samples, *, resamples: int = RESAMPLES, level: float = LEVEL, seed: int = SEED) -> PairedDifference | None:
    """Paired bootstrap of ``metric(a) - metric(b)``: the same resampled units for both; None if the units differ."""
    if a.n != b.n or a.n == 0 or a.unit != b.unit or not np.allclose(a.weights, b.weights):
        return None
    idx = np.random.default_rng(seed).integers(0, a.n, size=(resamples, a.n))
    diffs = a.value(idx) - b.value(idx)
    tail = (1 - level) / 2
    return PairedDifference(float(a.value()) - float(b.value()), float(np.quantile(diffs, tail)), float(np.quantile(diffs, 1 - tail)), a.n, a.unit)


def unpaired_within_noise(a: float, sa: float, b: float, sb: float, z: float = 1.959964) -> bool:
    """True when |a - b| is under z combined standard errors (used where per-example scores are not at hand)."""
    if any(not math.isfinite(v) for v in (a, sa, b, sb)):
        return False
    return abs(a - b) <= z * math.hypot(sa, sb)


Z95 = 1.959964


def interval(metrics: dict[str, Any], metric: str) -> tuple[float, float] | None:
    """A metric's logged 95 % interval: ``ppl_ci_low/high`` for ppl, log of them for nll, ``METRIC_ci_low/high`` where logged, else value ± 1.96 stderr.

    None when the numbers are missing or not finite (a NaN from a table of trials that lack them).
    """
    def number(key: str) -> float | None:
        try:
            value = float(metrics[key])
        except (KeyError, TypeError, ValueError):
            return None
        return value if math.isfinite(value) else None

    if metric in ("ppl", "nll"):
        low, high = number("ppl_ci_low"), number("ppl_ci_high")
        if low is None or high is None:
            return None
        return (low, high) if metric == "ppl" else (math.log(low), math.log(high))
    low, high = number(f"{metric}_ci_low"), number(f"{metric}_ci_high")
    if low is not None and high is not None:  # an interval logged as its ends (e.g. a t-interval over repeats)
        return low, high
    value, se = number(metric), number(f"{metric}_stderr")
    if value is None or se is None:
        return None
    return value - Z95 * se, value + Z95 * se
