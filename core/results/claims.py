"""A pipeline's ``claim:`` and its verdict from the stored trials (``paretolab report`` prints it).

```yaml
claim: {text: "BHyT trains to a lower loss than RMSNorm", metric: val_loss, method: bhyt, baseline: none,
        expect: lower, pair_by: seed}
```

``method`` and ``baseline`` are labels of what the pipeline's ``choice`` stages picked (``bhyt``,
``none``, ``magnitude+rtn``: the chosen methods other than ``none`` joined by ``+``; ``none`` when
every choice picked ``none``); fixed stages such as ``train`` are in every trial and so not
named. A label may end in ``[param=value, ...]`` to take only the trials whose methods ran with those
values, so a baseline that is a parameter of the method can be named: ``tetrajet[recipe=naive]``. A method trial and a baseline trial are a *pair* when they have the same ``pair_by``
value and the same value of every other parameter that belongs to neither side's methods
(e.g. ``train.lr``, ``train.tokens``); when both sides are the same methods told apart by brackets,
also of those methods' parameters that no bracket names (``layerdrop[score=greedy_bi]`` vs
``layerdrop[score=random]`` pair at the same ``k``). The verdict is on the paired differences
``metric(method) - metric(baseline)``: their mean and a 95 % Student-t interval over the pairs
(a t interval rather than a bootstrap: studies pair over a handful of seeds, where a bootstrap's
percentiles are degenerate). *held* when the interval lies on the expected side of 0, *did not
hold* when it lies on the other side, *within noise* when it contains 0.

``pair_by: none`` pairs on the shared parameters alone, for sides that have no seed in common
(``catq[steps=160]`` vs ``absmean_ternary``). With a single pair there is no interval over pairs;
for a quality metric whose trials stored per-example scores (``ppl``, ``acc``...) the verdict then
rests on the paired bootstrap over that pair's evaluation windows or examples, and says so: it
covers evaluation noise, not seed-to-seed variation.

A claim about a value rather than a comparison (``depth_alpha`` ≈ 1) gives ``target`` and
``tolerance`` instead of ``method``/``baseline``: *held* when every trial's value lies within
target ± tolerance, *did not hold* when none does, *mixed* otherwise. Such values (a fit's
exponent) carry no interval here, and the verdict says so.

An optional ``reference`` (a third label, e.g. the full-precision run of a low-precision claim)
adds the share of the baseline-to-reference gap the method closes, per matched triple:
(baseline − method) / (baseline − reference), with its mean and t interval (no verdict).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from paretolab.study.report_spec import NO_PAIR_BY, Claim, split_label

LEVEL = 0.95
EQUAL_FLOPS_TOLERANCE = 0.01  # budgets within 1 % count as equal: no equal-FLOPs reading needed
NONE = "none"


def _selects(label: str, trial: dict[str, Any]) -> bool:
    """The trial has ``label``'s methods and ran them with the values its brackets ask for."""
    base, wanted = split_label(label)
    if trial["label"] != base:
        return False
    methods = base.split("+")
    for name, value in wanted.items():
        ran = [v for k, v in trial["params"].items() if k.split(".")[-1] == name and _method_of(k) in methods]
        if not ran or not all(_same(v, value) for v in ran):
            return False
    return True


def _same(value: Any, text: str) -> bool:
    try:
        return float(value) == float(text)
    except (TypeError, ValueError):
        return str(value) == text


# ---- verdicts -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Paired:
    """Paired differences ``method - baseline`` with their mean and 95 % t interval."""

    diffs: tuple[float, ...]
    pairs: tuple[tuple[int, int], ...]  # (method trial, baseline trial)

    @property
    def n(self) -> int:
        return len(self.diffs)

    @property
    def mean(self) -> float:
        return sum(self.diffs) / self.n if self.n else math.nan

    @property
    def interval(self) -> tuple[float, float] | None:
        if self.n < 2:
            return None
        from scipy.stats import t

        sd = math.sqrt(sum((d - self.mean) ** 2 for d in self.diffs) / (self.n - 1))
        half = float(t.ppf((1 + LEVEL) / 2, self.n - 1)) * sd / math.sqrt(self.n)
        return self.mean - half, self.mean + half

    def verdict(self, expect: str) -> str:
        """held / did not hold / within noise; or why there is no verdict."""
        if self.n == 0:
            return "no verdict: no matched pairs"
        span = self.interval
        if span is None:
            return "no verdict: one pair (an interval needs at least two)"
        return interval_verdict(*span, expect)


def interval_verdict(low: float, high: float, expect: str) -> str:
    """held when the interval of method − baseline lies on the expected side of 0, did not hold on the other, else within noise."""
    low, high = (low, high) if expect == "lower" else (-high, -low)
    return "held" if high < 0 else "did not hold" if low > 0 else "within noise"


def trial_label(choices: dict[str, str]) -> str:
    """The label of what a trial's choice stages picked: non-``none`` methods joined by ``+``, else ``none``."""
    picked = [m for m in choices.values() if m != NONE]
    return "+".join(picked) or NONE


def pair_trials(claim: Claim, trials: list[dict[str, Any]]) -> tuple[list[tuple[dict[str, Any], dict[str, Any]]], int]:
    """(method, baseline) trial pairs matched on ``pair_by`` and the shared parameters; and how many keys were ambiguous.

    Each trial is ``{"trial", "label", "params": {"stage.method.param" or "method.param": value}, metrics...}``. A key
    with more than one trial on a side (e.g. a baseline searched over its own parameter while
    the method is not) cannot be paired unambiguously and is counted, not guessed.
    """
    (method_base, method_wanted), (baseline_base, baseline_wanted) = split_label(claim.method), split_label(claim.baseline)
    own = {*method_base.split("+"), *baseline_base.split("+")}
    # Both sides the same methods, told apart by brackets (layerdrop[score=greedy_bi] vs [score=random]):
    # their other parameters (layerdrop.k) must match too, or every k would pile onto one key.
    bracketed = {*method_wanted, *baseline_wanted} if method_base == baseline_base else None

    def is_pair_by(name: str) -> bool:
        parts = name.split(".")
        return parts[-1] == claim.pair_by or ".".join(parts[-2:]) == claim.pair_by

    def side_of(trial: dict[str, Any]) -> str | None:
        return "method" if _selects(claim.method, trial) else "baseline" if _selects(claim.baseline, trial) else None

    # The pair_by parameters both sides have: when the method is itself a stage with that parameter
    # (a `train` chosen against `none` before a shared train stage), only the shared stage's value pairs.
    names = {side: set() for side in ("method", "baseline")}
    for trial in trials:
        if side := side_of(trial):
            names[side] |= {k for k in trial["params"] if is_pair_by(k)}
    common = names["method"] & names["baseline"]
    if not common:  # each side's own method has the parameter (puzzle_moe.calib_seed vs expert_drop.calib_seed): pair on its value
        common = names["method"] | names["baseline"]

    def key(trial: dict[str, Any]) -> tuple[Any, ...] | None:
        params = trial["params"]
        by = tuple(v for k, v in sorted(params.items()) if k in common)  # one value per stage that has it (train → … → train)
        if not by and claim.pair_by != NO_PAIR_BY:
            return None
        shared = sorted(
            (k, repr(v)) for k, v in params.items()
            if not is_pair_by(k) and (_method_of(k) not in own or (bracketed is not None and k.split(".")[-1] not in bracketed))
        )
        return (repr(by), *shared)

    sides: dict[str, dict[tuple[Any, ...], list[dict[str, Any]]]] = {"method": {}, "baseline": {}}
    for trial in trials:
        side = side_of(trial)
        k = key(trial) if side else None
        if side and k is not None and isinstance(trial.get(claim.metric), (int, float)):
            sides[side].setdefault(k, []).append(trial)
    pairs, ambiguous = [], 0
    for k in sorted(set(sides["method"]) & set(sides["baseline"])):
        m, b = sides["method"][k], sides["baseline"][k]
        if len(m) == 1 and len(b) == 1:
            pairs.append((m[0], b[0]))
        else:
            ambiguous += 1
    return pairs, ambiguous


def _method_of(param: str) -> str:
    """The method a parameter name belongs to: ``stage1.train.lr`` and ``train.lr`` -> ``train``."""
    parts = param.split(".")
    return parts[-2] if len(parts) >= 2 else ""


def paired(pairs: list[tuple[dict[str, Any], dict[str, Any]]], value: Callable[[dict[str, Any], dict[str, Any]], float | None]) -> Paired:
    """The differences ``value(method, baseline)`` over the pairs where it is defined."""
    kept = [(m, b, value(m, b)) for m, b in pairs]
    kept = [(m, b, d) for m, b, d in kept if d is not None and math.isfinite(d)]
    return Paired(tuple(d for _, _, d in kept), tuple((int(m["trial"]), int(b["trial"])) for m, b, _ in kept))


def equal_flops_difference(m: dict[str, Any], b: dict[str, Any], curve: Callable[[str], Any]) -> float | None:
    """``val_loss(method) - val_loss(baseline)`` at the smaller of their two training budgets; None when budgets match or a curve is missing.

    The trial with the larger ``train_flops`` has its learning curve read (interpolated) at the
    other's ``train_flops``; the other contributes its final ``val_loss``.
    """
    if not _budgets_differ(m, b):
        return None
    larger, smaller = (m, b) if m["train_flops"] > b["train_flops"] else (b, m)
    read = curve(larger.get("run_id", ""))
    at = read.at("flops", float(smaller["train_flops"])) if read is not None and read.has("flops") else None
    final = smaller.get("val_loss")
    if at is None or not isinstance(final, (int, float)):
        return None
    return at - final if larger is m else final - at


def claim_lines(claim: Claim, trials: list[dict[str, Any]], curve: Callable[[str], Any], fetch: Callable[[str], Any] | None = None) -> list[str]:
    """The Markdown block at the top of a study's section: the claim, the baseline, the verdict(s).

    ``fetch`` (run id -> its per-example scores) lets a single pair be judged on its evaluation units.
    """
    if claim.target is not None:
        return value_claim_lines(claim, trials)
    pairs, ambiguous = pair_trials(claim, trials)
    result = paired(pairs, lambda m, b: float(m[claim.metric]) - float(b[claim.metric]))
    on = "the shared parameters alone" if claim.pair_by == NO_PAIR_BY else f"`{claim.pair_by}` and every other shared parameter"
    lines = [f"**Claim:** {claim.text}", "",
             f"Method `{claim.method}` against baseline `{claim.baseline}` on `{claim.metric}` ({claim.expect} expected), "
             f"paired on {on}.", ""]
    single = _one_pair_verdict(claim, pairs, fetch) if result.n == 1 else None
    if single is not None:
        lines.append(single)
    else:
        lines.append(f"**Verdict: {result.verdict(claim.expect)}** — {_difference(claim, claim.metric, result)}.")
    if ambiguous:
        lines.append(f"{ambiguous} `{claim.pair_by}` value(s) left out: more than one trial on a side with the same parameters.")
    if claim.reference:
        lines += ["", gap_line(claim, trials)]
    flops = paired(pairs, lambda m, b: equal_flops_difference(m, b, curve))
    if flops.n:
        verdict = f"**{flops.verdict(claim.expect)}** — " if claim.metric == "val_loss" else ""
        lines += ["", f"At equal training FLOPs: {verdict}{_difference(claim, 'val_loss', flops)}; where budgets differ the "
                      "larger budget's learning curve is read (linearly interpolated) at the smaller budget's `train_flops`."]
    elif any(_budgets_differ(m, b) for m, b in pairs):  # budgets differ, yet no pair gave a reading: the curves are missing
        lines += ["", "Budgets differ between paired trials, but their learning curves (`learning_curve.json`) are not "
                      "readable from the store: no loss at equal FLOPs."]
    return [*lines, ""]


def _one_pair_verdict(claim: Claim, pairs: list[tuple[dict[str, Any], dict[str, Any]]], fetch: Callable[[str], Any] | None) -> str | None:
    """The verdict line for a single pair from the paired bootstrap over its evaluation units; None when they are not stored."""
    from paretolab.results.noise import QUALITY, difference

    if fetch is None or claim.metric not in QUALITY or len(pairs) != 1:
        return None
    m, b = pairs[0]
    d = difference(m, b, claim.metric, fetch)
    if d is None or d.unit == "unpaired":
        return None
    verdict = interval_verdict(d.low, d.high, claim.expect)
    return (f"**Verdict: {verdict}** — {claim.metric} {claim.method} − {claim.baseline} = {_num(d.diff)} [{_num(d.low)}, {_num(d.high)}] "
            f"(95 % paired bootstrap over the {d.n} {d.unit}s both trials were scored on; trials {m['trial']}–{b['trial']}). "
            f"One pair: the interval covers evaluation noise, not seed-to-seed variation.")


def value_claim_lines(claim: Claim, trials: list[dict[str, Any]]) -> list[str]:
    """The Markdown block of a value claim: each trial's value against target ± tolerance."""
    assert claim.target is not None and claim.tolerance is not None
    low, high = claim.target - claim.tolerance, claim.target + claim.tolerance
    values = [(int(t["trial"]), float(t[claim.metric])) for t in trials
              if isinstance(t.get(claim.metric), (int, float)) and math.isfinite(float(t[claim.metric]))]
    lines = [f"**Claim:** {claim.text}", "", f"`{claim.metric}` expected within {claim.target:g} ± {claim.tolerance:g}.", ""]
    if not values:
        return [*lines, f"**Verdict: no verdict: no trial reported {claim.metric}**.", ""]
    inside = [low <= v <= high for _, v in values]
    verdict = "held" if all(inside) else "did not hold" if not any(inside) else "mixed"
    listed = ", ".join(f"{v:.4g} (trial {n})" for n, v in values)
    return [*lines, f"**Verdict: {verdict}** — {claim.metric} = {listed}; point estimates (no interval).", ""]


def gap_closed(claim: Claim, trials: list[dict[str, Any]]) -> tuple[Paired, list[tuple[int, int, int]]]:
    """(baseline − method) / (baseline − reference) of ``claim.metric`` per (method, baseline, reference) triple matched as pairs are."""
    assert claim.reference is not None
    to_reference = Claim(claim.text, claim.metric, claim.baseline, claim.reference, claim.expect, claim.pair_by)
    reference_of = {int(b["trial"]): r for b, r in pair_trials(to_reference, trials)[0]}
    shares, triples = [], []
    for m, b in pair_trials(claim, trials)[0]:
        r = reference_of.get(int(b["trial"]))
        if r is None:
            continue
        gap = float(b[claim.metric]) - float(r[claim.metric])
        if gap != 0 and math.isfinite(gap):
            shares.append((float(b[claim.metric]) - float(m[claim.metric])) / gap)
            triples.append((int(m["trial"]), int(b["trial"]), int(r["trial"])))
    return Paired(tuple(shares), tuple((m, b) for m, b, _ in triples)), triples


def gap_line(claim: Claim, trials: list[dict[str, Any]]) -> str:
    """The Markdown line giving the share of the baseline-to-reference gap closed."""
    result, triples = gap_closed(claim, trials)
    name = f"share of the `{claim.baseline}` → `{claim.reference}` gap in {claim.metric} closed by `{claim.method}`"
    if result.n == 0:
        return f"{name.capitalize()}: no matched (method, baseline, reference) triple with a nonzero gap."
    span = result.interval
    ci = f" [{span[0]:.1%}, {span[1]:.1%}] (95 % t interval)" if span else ""
    listed = ", ".join(f"{m}–{b}–{r}" for m, b, r in triples)
    return f"{name[0].upper()}{name[1:]}: (baseline − method) / (baseline − reference) = {result.mean:.1%}{ci}, mean over n = {result.n} triple(s) (trials {listed})."


def _difference(claim: Claim, metric: str, result: Paired) -> str:
    name = f"{metric} {claim.method} − {claim.baseline}"
    if result.n == 0:
        same = "shared parameters" if claim.pair_by == NO_PAIR_BY else f"`{claim.pair_by}` and other parameters"
        return f"{name}: no pair of trials with the same {same} reported it"
    span = result.interval
    ci = f" [{_num(span[0])}, {_num(span[1])}] (95 % t interval)" if span else ""
    return f"{name} = {_num(result.mean)}{ci}, mean over n = {result.n} pair(s) (trials {', '.join(f'{a}–{b}' for a, b in result.pairs)})"


def _budgets_differ(m: dict[str, Any], b: dict[str, Any]) -> bool:
    fm, fb = m.get("train_flops"), b.get("train_flops")
    return isinstance(fm, (int, float)) and isinstance(fb, (int, float)) and fb > 0 and abs(fm - fb) > EQUAL_FLOPS_TOLERANCE * fb


def _num(value: float) -> str:
    return f"{value:+.4g}"
