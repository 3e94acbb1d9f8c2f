"""A claim's estimate from its pairs: the mean difference with a 95 % interval that carries both noises.

Each pair is one replicate (a seed, a calibration draw, a split): ``d = f(metric(method)) − f(metric(baseline))``
with ``f`` the identity or, on ``scale: log``, the logarithm (a ratio judged as a ratio). Two noises
stand behind the mean of the ``d``:

- **replicate to replicate**: a Student-t interval over the replicates' ``d`` (n − 1 degrees of freedom);
- **example to example**: where both trials stored their per-example (or per-window) scores, a paired
  bootstrap over those units (the same resampled units for every replicate scored on the same units).

The interval adds the two half-widths in quadrature, so one replicate still gets an honest interval
from its examples and replicates that agree exactly still carry their example noise. With two or
three replicates the t quantile is large on purpose: a spread seen twice is a poor estimate of itself.
A bounded metric's difference is clipped to what the metric can take (±1 for a fraction). An
interval of zero width is no verdict: no variation was observed (unless the metric is registered exact and each arm
reads the same on every replicate: then :mod:`paretolab.results.claims` judges the exact effect as it stands).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from paretolab.plugin_api.numbers import plural
from paretolab.stats import Samples, samples

LEVEL = 0.95
RESAMPLES = 2000
SEED = 0
Fetch = Callable[[str], "dict[str, Any] | None"]


@dataclass(frozen=True)
class Estimate:
    """The mean of the replicates' differences, its 95 % interval, and what the interval rests on."""

    mean: float
    low: float | None
    high: float | None
    replicates: int
    units: str = ""  # "16 windows" when the example noise is in, else ""
    clipped: bool = False

    @property
    def zero_width(self) -> bool:
        return self.low is not None and self.high is not None and self.high - self.low <= 1e-12 * max(1.0, abs(self.mean))

    def rests_on(self) -> str:
        reps = f"{self.replicates} replicate{'s' if self.replicates != 1 else ''}"
        if self.units and self.replicates > 1:
            return f"t over {reps} ⊕ paired bootstrap over {self.units}"
        if self.units:
            return f"paired bootstrap over {self.units}; one replicate: evaluation noise only, not seed-to-seed"
        return f"t over {reps}; no per-example scores stored"


def estimate(pairs: list[tuple[dict[str, Any], dict[str, Any]]], metric: str, *, log: bool = False,
             fetch: Fetch | None = None, bounds: tuple[float, float] | None = None,
             value: Callable[[dict[str, Any], dict[str, Any]], float | None] | None = None) -> Estimate | None:
    """The estimate over ``pairs`` (method, baseline); None when no pair has a finite difference.

    ``value`` overrides the per-pair difference (the equal-FLOPs reading); it then carries no example noise.
    """
    f = _log if log else float
    rows = []
    for m, b in pairs:
        d = value(m, b) if value is not None else _diff(f, m.get(metric), b.get(metric))
        if d is not None and math.isfinite(d):
            rows.append((m, b, d))
    if not rows:
        return None
    diffs = np.asarray([d for _, _, d in rows])
    mean, n = float(diffs.mean()), len(diffs)
    t_half = t_half_width(diffs)
    units = _unit_draws([(m, b) for m, b, _ in rows], metric, f, fetch) if value is None and fetch is not None else None
    if units is None and t_half is None:
        return Estimate(mean, None, None, n)
    low_half = high_half = t_half or 0.0
    label = ""
    if units is not None:
        draws, label = units
        tail = (1 - LEVEL) / 2
        center = float(draws.mean())
        low_half = math.hypot(low_half, center - float(np.quantile(draws, tail)))
        high_half = math.hypot(high_half, float(np.quantile(draws, 1 - tail)) - center)
    low, high = mean - low_half, mean + high_half
    clipped = False
    if bounds is not None and not log:
        span = bounds[1] - bounds[0]
        clipped = low < -span or high > span
        low, high = max(low, -span), min(high, span)
    return Estimate(mean, low, high, n, label, clipped)


def _diff(f: Callable[[Any], float], a: Any, b: Any) -> float | None:
    try:
        return f(a) - f(b)
    except (TypeError, ValueError):
        return None


def _log(x: Any) -> float:
    x = float(x)
    if x <= 0:
        raise ValueError("log scale needs positive values")
    return math.log(x)


def t_half_width(diffs: np.ndarray) -> float | None:
    """Half-width of the LEVEL t-interval of the mean of ``diffs`` (None below two values)."""
    if len(diffs) < 2:
        return None
    from scipy.stats import t

    return float(t.ppf((1 + LEVEL) / 2, len(diffs) - 1) * diffs.std(ddof=1) / math.sqrt(len(diffs)))


def _unit_draws(pairs: list[tuple[dict[str, Any], dict[str, Any]]], metric: str, f: Callable[[Any], float],
                fetch: Fetch) -> tuple[np.ndarray, str] | None:
    """Bootstrap draws of the mean over replicates of ``f(method) − f(baseline)`` resampling examples; None without scores.

    Replicates scored on the same units share the resampled indices (a fixed test set is one draw of
    examples for all of them); a method and its baseline always share them when their units match.
    """
    loaded = []
    for m, b in pairs:
        pm, pb = fetch(str(m.get("run_id", ""))), fetch(str(b.get("run_id", "")))
        sm, sb = (samples(pm, metric) if pm else None), (samples(pb, metric) if pb else None)
        if sm is None or sb is None:
            return None  # every replicate needs its examples, or the example noise would be half counted
        loaded.append((sm, sb))
    rng = np.random.default_rng(SEED)
    shared = all(_same_units(a, b) and _same_units(a, loaded[0][0]) for a, b in loaded)
    fv = np.log if f is _log else np.asarray
    total = np.zeros(RESAMPLES)
    idx = rng.integers(0, loaded[0][0].n, size=(RESAMPLES, loaded[0][0].n)) if shared else None
    for sm, sb in loaded:
        im = idx if shared else rng.integers(0, sm.n, size=(RESAMPLES, sm.n))
        ib = im if shared or _same_units(sm, sb) else rng.integers(0, sb.n, size=(RESAMPLES, sb.n))
        total += fv(sm.value(im)) - fv(sb.value(ib))
    first = loaded[0][0]
    label = f"{first.n} {plural(first.unit)}" if shared else f"the {plural(first.unit)} of each trial"
    return total / len(loaded), label


def _same_units(a: Samples, b: Samples) -> bool:
    return a.n == b.n and a.unit == b.unit and np.allclose(a.weights, b.weights)


# ---- verdicts -----------------------------------------------------------------------------------


def worse_side(claim_better: str, low: float, high: float) -> tuple[float, float]:
    """The interval turned so that positive means the method is worse than the baseline."""
    return (low, high) if claim_better == "lower" else (-high, -low)


def margin_band(margin: float | None, better: str, log: bool) -> tuple[float, float] | None:
    """The margin as (lower, upper) bounds on the worse-side difference (positive: the method is worse).

    Linear: ±margin in the metric's units. ``scale: log``: the ratio written, method ÷ baseline within ×(1 − margin) …
    ×(1 + margin), so a 10 % margin means ×0.9 … ×1.1 (not ±0.1 on the log, which is ×0.905 … ×1.105)."""
    if margin is None:
        return None
    if not log:
        return -margin, margin
    low, high = math.log(1 - margin), math.log(1 + margin)  # log ratio bounds
    return (low, high) if better == "lower" else (-high, -low)


def verdict(est: Estimate, expect: str, better: str, band: tuple[float, float] | None) -> str:
    """held / did not hold / within noise (lower, higher); held / did not hold / inconclusive (no_worse, equivalent).

    ``band``: :func:`margin_band` of the claim's margin (no_worse and equivalent only)."""
    if est.low is None or est.high is None:
        return "no verdict: one replicate and no per-example scores stored (an interval needs two replicates or the examples)"
    if est.zero_width:
        across = f" and every resample of its {est.units}" if est.units else ""
        return f"no verdict: no variation observed across {est.replicates} replicate(s){across}"
    if expect in ("lower", "higher"):
        low, high = worse_side(expect, est.low, est.high)  # positive: moved against the expected direction
        return "held" if high < 0 else "did not hold" if low > 0 else "within noise"
    assert band is not None
    low, high = worse_side(better, est.low, est.high)
    if expect == "no_worse":
        return "held" if high < band[1] else "did not hold" if low > band[1] else "inconclusive"
    inside = band[0] < low and high < band[1]
    return "held" if inside else "did not hold" if low > band[1] or high < band[0] else "inconclusive"


def p_value(est: Estimate, expect: str, better: str, band: tuple[float, float] | None) -> float | None:
    """One-sided p of the claimed direction from the interval, read as normal (for Holm's adjustment)."""
    if est.low is None or est.high is None or est.zero_width:
        return None
    from scipy.stats import norm

    se = (est.high - est.low) / (2 * norm.ppf((1 + LEVEL) / 2))
    if se <= 0:
        return None
    if expect in ("lower", "higher"):
        toward = -est.mean if expect == "lower" else est.mean  # positive: moved the claimed way
        return float(norm.sf(toward / se))
    assert band is not None
    worse = est.mean if better == "lower" else -est.mean
    below = float(norm.sf((band[1] - worse) / se))  # H0: worse >= the upper bound
    if expect == "no_worse":
        return below
    return max(below, float(norm.sf((worse - band[0]) / se)))  # equivalence: both one-sided tests (TOST)


def holm(pvalues: list[float | None], alpha: float = (1 - LEVEL) / 2) -> list[bool]:
    """Holm's step-down over one-sided p values at family-wise ``alpha``: which tests still hold; None counts as not held."""
    order = sorted((p, i) for i, p in enumerate(pvalues) if p is not None)
    m = len(pvalues)
    held = [False] * m
    for rank, (p, i) in enumerate(order):
        if p > alpha / (m - rank):
            break
        held[i] = True
    return held
