"""``paretolab interaction STUDY --a A --b B``: do two stacked methods' effects add up?

A study with a choice stage for each method (each offering ``none``) holds the four arms: the base,
A alone, B alone and A+B. On the log scale an effect is a ratio to the base, and two effects that
do not interact multiply: ``log(AB) - log(base) = (log(A) - log(base)) + (log(B) - log(base))``. The
**interaction term** is what is left::

    I = log(AB) - log(A) - log(B) + log(base)

``I = 0``: the effects add up on the log scale (A+B costs what A and B cost apart); ``I > 0`` for
perplexity: stacking hurts more than the two alone predict; ``I < 0``: less. For a quality metric
with per-window scores (``ppl``) the four trials are scored on the same windows, so the interval of
``I`` is a paired bootstrap over the windows (the same resampled windows for all four arms); a cost
measured once per trial (``size_bytes``, a deterministic count) has no interval, and a timing with
a spread (``_iqr``) is reported without one (say so, and rerun with repeats to get one).

Some metrics are B's effect already, measured inside each trial against the same target without B:
speculative decoding's ``speedup_vs_greedy`` (times greedy decoding of the trial's own target beside it)
and ``mean_accepted_len`` (tokens per target forward; greedy decoding makes 1). For these ``relative``
metrics the base and A arms read 1 by definition and only B and A+B are needed:
``I = log(A+B) - log(B)``, B's effect on A's target against its effect on the base. Their interval
resamples each trial's own units (its prompts) apart, as the two trials need not share them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from paretolab.errors import ConfigError
from paretolab.plugin_api.numbers import interval_text, number
from paretolab.stats import LEVEL, RESAMPLES, SEED, Samples

NONE = "none"


@dataclass
class Interaction:
    metric: str
    values: dict[str, float]  # arm (base, A, B, A+B) -> the metric
    effect_a: float  # log(A) - log(base)
    effect_b: float
    effect_ab: float
    term: float  # effect_ab - effect_a - effect_b
    low: float | None = None  # its interval (None: no per-unit scores)
    high: float | None = None
    n: int = 0  # windows the interval is over
    trials: dict[str, int] | None = None
    relative: bool = False  # B's effect measured inside each trial: base and A read 1, the interval resamples each trial's units apart

    @property
    def reading(self) -> str:
        if self.low is None or self.high is None:
            return "no interval (no per-prompt figures kept by these trials)" if self.relative else "no interval (one measurement per arm)"
        if self.low <= 0 <= self.high:
            return "additive within noise"
        return "super-additive (more than the sum)" if self.low > 0 else "sub-additive (less than the sum)"


def log_term(base: float, a: float, b: float, ab: float) -> tuple[float, float, float, float]:
    """(effect of A, of B, of A+B, interaction term) on the natural log scale."""
    if min(base, a, b, ab) <= 0:
        raise ConfigError(f"the log scale needs positive values; got base {base}, A {a}, B {b}, A+B {ab}")
    la, lb, lab, l0 = (math.log(x) for x in (a, b, ab, base))
    return la - l0, lb - l0, lab - l0, lab - la - lb + l0


def paired_term(base: Samples, a: Samples, b: Samples, ab: Samples, *, resamples: int = RESAMPLES, level: float = LEVEL,
                seed: int = SEED) -> tuple[float, float, int] | None:
    """The interval of the interaction term by resampling the same windows for all four arms; None when they differ."""
    arms = (base, a, b, ab)
    if len({s.n for s in arms}) != 1 or len({s.unit for s in arms}) != 1 or not all(np.allclose(s.weights, base.weights) for s in arms):
        return None
    idx = np.random.default_rng(seed).integers(0, base.n, size=(resamples, base.n))
    v0, va, vb, vab = (np.log(s.value(idx)) for s in arms)
    terms = vab - va - vb + v0
    tail = (1 - level) / 2
    return float(np.quantile(terms, tail)), float(np.quantile(terms, 1 - tail)), base.n


def unpaired_term(b: Samples, ab: Samples, *, resamples: int = RESAMPLES, level: float = LEVEL, seed: int = SEED) -> tuple[float, float, int]:
    """The interval of ``log(A+B) - log(B)`` resampling each trial's units apart (a relative metric: base and A read 1)."""
    rng = np.random.default_rng(seed)
    terms = np.log(ab.value(rng.integers(0, ab.n, size=(resamples, ab.n)))) - np.log(b.value(rng.integers(0, b.n, size=(resamples, b.n))))
    tail = (1 - level) / 2
    return float(np.quantile(terms, tail)), float(np.quantile(terms, 1 - tail)), min(b.n, ab.n)


def arms_of(rows: list[dict[str, Any]], a: str, b: str, study: str, *, relative: bool = False) -> dict[str, dict[str, Any]]:
    """The first complete trial of each arm: base (``none``), A, B and A+B (labels as the report writes them); only B and
    A+B where every metric asked for is ``relative`` (B's effect measured inside each trial)."""
    wanted = {"base": {NONE}, "A": {a}, "B": {b}, "A+B": {f"{a}+{b}", f"{b}+{a}"}}
    if relative:
        wanted = {arm: labels for arm, labels in wanted.items() if arm in ("B", "A+B")}
    out = {}
    for arm, labels in wanted.items():
        found = next((r for r in rows if r["method"] in labels), None)
        if found is None:
            have = sorted({r["method"] for r in rows})
            raise ConfigError(f"study {study!r} has no complete trial of {arm} ({' or '.join(sorted(labels))}); it has {', '.join(have)}. "
                              + ("A relative metric needs B alone and A+B" if relative else
                                 "An interaction needs a choice stage per method, each offering {method: none}, and all four arms run"))
        out[arm] = found
    return out


def interaction(study: str, source: Any, a: str, b: str, metrics: list[str], relative: tuple[str, ...] = ()) -> list[Interaction]:
    """The interaction of ``a`` and ``b`` in ``study`` for each of ``metrics`` (see the module's docstring); ``relative``: the
    metrics that are B's effect measured inside each trial (base and A read 1)."""
    from paretolab.results.read import trial_table
    from paretolab.results.source import source_of
    from paretolab.stats import samples

    src = source_of(source)
    _, rows = trial_table(study, src)
    only_relative = bool(metrics) and all(m in relative for m in metrics)
    arms = arms_of(rows, a, b, study, relative=only_relative)
    fetch = src.per_example()
    out = []
    for metric in metrics:
        own = {arm: row for arm, row in arms.items() if metric not in relative or arm in ("B", "A+B")}
        missing = [arm for arm, row in own.items() if not isinstance(row.get(metric), (int, float))]
        if missing:
            raise ConfigError(f"--metric {metric}: trial(s) of {', '.join(missing)} in {study!r} did not report it; pick a metric every arm has")
        values = {"base": 1.0, "A": 1.0, **{arm: float(row[metric]) for arm, row in own.items()}}
        ea, eb, eab, term = log_term(values["base"], values["A"], values["B"], values["A+B"])
        found = {arm: samples(fetch(row["run_id"]) or {}, metric) if row["run_id"] else None for arm, row in own.items()}
        if metric in relative:
            span = unpaired_term(found["B"], found["A+B"]) if all(found.values()) else None
        else:
            span = paired_term(*(found[k] for k in ("base", "A", "B", "A+B"))) if all(found.values()) else None
        out.append(Interaction(metric, values, ea, eb, eab, term, *(span or (None, None, 0)),
                               trials={arm: row["trial"] for arm, row in own.items()}, relative=metric in relative))
    return out


def markdown(study: str, a: str, b: str, found: list[Interaction]) -> str:
    from paretolab.results.section import markdown_table

    rows = []
    for x in found:
        span = f"[{number(x.low, signed=True)}, {number(x.high, signed=True)}]" if x.low is not None else "—"
        rows.append({"metric": x.metric, "base": x.values["base"], a: x.values["A"], b: x.values["B"], f"{a}+{b}": x.values["A+B"],
                     f"log {a}/base": number(x.effect_a, signed=True), f"log {b}/base": number(x.effect_b, signed=True),
                     f"log {a}+{b}/base": number(x.effect_ab, signed=True), "interaction": number(x.term, signed=True), "95 % interval": span,
                     "reading": x.reading + (f" (prompts resampled within each trial; {b} is measured against its own target inside each "
                                             f"trial, so base and {a} read 1)" if x.relative and x.n else f" ({x.n} windows, paired)" if x.n else "")})
    trials = found[0].trials if found else {}
    head = (f"Interaction of {a} and {b} in study {study!r} (trials: " + ", ".join(f"{k} #{v}" for k, v in (trials or {}).items())
            + "). On the natural-log scale: interaction = log(A+B) − log(A) − log(B) + log(base); 0 when the two effects add up.")
    relative = [x.metric for x in found if x.relative]
    if relative:
        head += (f" {', '.join(relative)}: {b}'s effect measured inside each trial against its own target, so base and {a} read 1 and "
                 "the interaction is log(A+B) − log(B).")
    return head + "\n\n" + markdown_table(rows, list(rows[0]) if rows else ["metric"]) + "\n"
