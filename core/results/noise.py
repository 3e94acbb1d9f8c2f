"""Quality differences with their uncertainty, read back from stored trials (report and frontier).

A trial's quality numbers carry their per-example scores as the ``per_example.json`` MLflow
artifact (see :mod:`paretolab.stats`), fetched through the study's source (``Source.per_example``). Two trials evaluated on the same examples (or windows)
are compared paired: one bootstrap resamples the same units for both. Where a trial has no
artifact (older runs), the comparison falls back to the unpaired test on the logged standard
errors and says so.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from paretolab.plugin_api.numbers import interval_text, number, plural
from paretolab.stats import (
    PairedDifference,
    interval,
    paired_difference,
    samples,
)

QUALITY = ("acc", "acc_norm", "ppl", "nll")
Fetch = Callable[[str], "dict[str, Any] | None"]


def difference(a: dict[str, Any], b: dict[str, Any], metric: str, fetch: Fetch) -> PairedDifference | None:
    """``a[metric] - b[metric]`` for two trial rows: paired on their per-example scores, else unpaired (n = 0)."""
    pa, pb = fetch(a.get("run_id", "")), fetch(b.get("run_id", ""))
    sa, sb = (samples(pa, metric) if pa else None), (samples(pb, metric) if pb else None)
    if sa is not None and sb is not None:
        paired = paired_difference(sa, sb)
        if paired is not None:
            return paired
    ia, ib = interval(a, metric), interval(b, metric)
    if ia is None or ib is None or metric not in a or metric not in b:
        return None
    # unpaired: the difference's 95 % interval from the two intervals' half-widths, in quadrature
    half = ((ia[1] - ia[0]) ** 2 + (ib[1] - ib[0]) ** 2) ** 0.5 / 2
    diff = float(a[metric]) - float(b[metric])
    return PairedDifference(diff, diff - half, diff + half, 0, "unpaired")


def quality_cells(rows: list[dict[str, Any]], baseline_of: Callable[[dict[str, Any]], "dict[str, Any] | str | None"],
                  metrics: list[str], fetch: Fetch) -> list[str]:
    """Give each row its quality ± interval and, against its own baseline, the difference with its interval.

    ``baseline_of(row)`` is the baseline trial of the row's replicate (the ``none`` trial of the same
    seed), the row itself when it is that baseline, or a text saying why it has none (``unpaired: ...``).
    Writes ``row[metric]`` as text (``0.652 ± 0.021`` with 1 standard error, or ``23.4 [22.1, 24.9]``
    for a 95 % interval), ``row["n"]`` (the sample size) and ``row[f"Δ{metric} vs none"]``; returns
    the added difference columns.
    """
    added: list[str] = []
    for metric in [m for m in metrics if m in QUALITY and any(m in r for r in rows)]:
        column = f"Δ{metric} vs none"
        for row in rows:
            baseline = baseline_of(row)
            if isinstance(baseline, str) and metric in row:
                row[column] = baseline
                added += [column] if column not in added else []
            elif isinstance(baseline, dict) and baseline is not row and metric in row:
                d = difference(row, baseline, metric, fetch)
                if d is not None:
                    row[column] = describe(d)
                    added += [column] if column not in added else []
        for row in rows:
            if metric in row:
                row[metric] = with_interval(row, metric)
    for row in rows:
        row["n"] = sample_size(row)
    return added


def describe(d: PairedDifference) -> str:
    """``+0.012 [-0.004, +0.030] within noise`` (paired over n examples, or marked unpaired).

    A zero-width interval (the two trials score alike on every example) is "no variation observed": it is neither
    within nor beyond a noise that was not seen.
    """
    how = "unpaired" if d.unit == "unpaired" else f"paired, {d.n} {plural(d.unit)}" if d.n else f"paired over {plural(d.unit)}"
    verdict = "no variation observed" if d.low == d.high else "within noise" if d.within_noise else "beyond noise"
    return f"{interval_text(d.diff, d.low, d.high, signed=True)} {verdict} ({how})"


def engine_ppl_gaps(engine: dict[str, Any]) -> dict[str, str]:
    """Per engine, the served model's perplexity against the trial's recorded one (the engine measure's paired
    difference over the task's windows, ``E_ppl_diff`` and its interval) in the words above: ``within noise`` or not."""
    out: dict[str, str] = {}
    for key in sorted(k for k in engine if k.endswith("_ppl_diff")):
        low, high = engine.get(f"{key}_ci_low"), engine.get(f"{key}_ci_high")
        if low is not None and high is not None:
            d = PairedDifference(float(engine[key]), float(low), float(high), int(engine.get("n_windows") or 0), "window")
            out[key.removesuffix("_ppl_diff")] = describe(d)
    return out


def with_interval(row: dict[str, Any], metric: str) -> str:
    value = float(row[metric])
    stderr = row.get(f"{metric}_stderr")
    if stderr is not None:
        return f"{number(value)} ± {number(float(stderr), digits=2)}"
    span = interval(row, metric)
    return interval_text(value, span[0], span[1]) if span else number(value)


def sample_size(row: dict[str, Any]) -> str:
    """What the quality numbers rest on: ``200 examples`` or ``8 windows`` (empty when not logged)."""
    parts = [f"{int(row[k])} {unit}" for k, unit in (("n_examples", "examples"), ("n_windows", "windows")) if row.get(k) is not None]
    return ", ".join(parts)


def mark_indistinguishable(rows: list[dict[str, Any]], metrics: list[str], fetch: Fetch) -> None:
    """On a frontier sorted along it, set ``row["noise"]`` to the neighbours whose quality is within noise of the row's."""
    for row in rows:
        row.setdefault("noise", "")
    for left, right in zip(rows, rows[1:]):
        for metric in metrics:
            d = difference(left, right, metric, fetch) if metric in QUALITY else None
            if d is not None and d.within_noise:
                for a, b in ((left, right), (right, left)):
                    note = f"{metric} ≈ trial {b['trial']}"
                    a["noise"] = f"{a['noise']}; {note}" if a["noise"] else note
