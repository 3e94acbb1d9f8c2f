"""A study whose trials repeat configurations over replicates (seeds, calibration draws, splits), drawn as
``paretolab frontier`` lists it: one point per configuration at its replicates' mean, the frontier over the means.
"""

from __future__ import annotations

import pandas as pd

from paretolab.results.replicates import DEFAULT_REPLICATES


def replicate_columns(frame: pd.DataFrame, param_columns: list[str], replicates: tuple[str, ...] = DEFAULT_REPLICATES) -> list[str]:
    """The ``param:`` columns of ``frame`` that are replicates and take more than one value."""
    return [c for c in param_columns if c.split(".")[-1] in replicates and c in frame and frame[c].nunique() > 1]


def configuration_means(frame: pd.DataFrame, param_columns: list[str], metrics: list[str]) -> pd.DataFrame | None:
    """One row per configuration (``methods`` and every parameter but the replicates): ``metrics`` averaged over its
    trials, ``number`` its first trial, ``trials`` all of them (``"0+3+6"``), ``draws`` how many; None without replicates."""
    reps = replicate_columns(frame, param_columns)
    if not reps or frame.empty:
        return None
    keys = ["methods", *[c for c in param_columns if c not in reps and c in frame]]
    groups = frame.groupby(keys, dropna=False, sort=False)
    out = groups.first()
    for m in metrics:
        out[m] = groups[m].mean()
    out["number"] = groups["number"].min()
    out["draws"] = groups.size()
    out["trials"] = groups["number"].agg(lambda s: "+".join(map(str, sorted(s))))
    if "feasible" in frame:
        out["feasible"] = groups["feasible"].agg(lambda s: bool(s.astype(bool).all()))
    return out.reset_index()


def point_of(points: pd.DataFrame) -> dict[int, int]:
    """Each trial's point on the plot: itself, or the first trial of its configuration where draws are averaged."""
    numbers = [int(n) for n in points["number"]]
    if "trials" not in points:
        return {n: n for n in numbers}
    return {int(t): n for n, trials in zip(numbers, points["trials"]) for t in str(trials).split("+")}

