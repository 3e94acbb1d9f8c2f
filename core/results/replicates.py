"""Which parameters of a study are replicates, and what that means for its table and frontiers.

A replicate is a draw (a seed, a calibration draw, a data split), not a treatment: the report pairs a
row with the baseline trial of the *same* replicate, and a study with replicates draws its frontier
per configuration (the mean over replicates, with its spread) rather than pooling the draws as if
each were a configuration of its own. The names come from the pipeline's claims (``replicates:``);
without a claim, parameters called ``seed``, ``calib_seed`` or ``split`` are taken as replicates.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Callable
from typing import Any

from paretolab.study.report_spec import claims_from

DEFAULT_REPLICATES = ("seed", "calib_seed", "split")
NONE = "none"


def report_replicates(pipeline: dict[str, Any]) -> tuple[str, ...]:
    """The replicate names of a stored pipeline: its claims' ``replicates``, else the usual names."""
    named = {r for c in claims_from(pipeline, {}) for r in c.replicates}
    return tuple(sorted(named)) or DEFAULT_REPLICATES


def named_params(row: dict[str, Any]) -> dict[str, Any]:
    """Every parameter the trial ran with, ``stage.method.param`` -> value (fixed ones too, from the MLflow run); Optuna's searched ones without a run."""
    logged = {key: _parsed(value) for key, value in row.get("run_params", {}).items()
              if key.count(".") == 2 and not key.startswith(("info.", "trial."))}
    return logged or {k: v for k, v in row.get("params", {}).items() if not k.endswith(".method")}


def _parsed(text: Any) -> Any:
    """A logged MLflow param (text) back to the value the trial had, so it matches Optuna's."""
    try:
        return json.loads(text) if isinstance(text, str) else text
    except ValueError:
        return text


def is_replicate(name: str, replicates: tuple[str, ...]) -> bool:
    parts = name.split(".")
    return any(parts[-1] == r or ".".join(parts[-2:]) == r for r in replicates)


def replicate_of(row: dict[str, Any], replicates: tuple[str, ...]) -> dict[str, str]:
    """``{short name: value}`` of the row's replicate parameters (``{"seed": "1"}``)."""
    return {k.split(".")[-1]: str(v) for k, v in named_params(row).items() if is_replicate(k, replicates)}


def baseline_finder(rows: list[dict[str, Any]], replicates: tuple[str, ...]) -> Callable[[dict[str, Any]], "dict[str, Any] | str | None"]:
    """row -> the ``none`` trial of the same replicate (the row itself when it is one), a text when there is none, or None.

    Among several ``none`` trials of that replicate, the one sharing most other parameter values is taken.
    """
    nones = [r for r in rows if r.get("method") == NONE]

    def find(row: dict[str, Any]) -> dict[str, Any] | str | None:
        if not nones:
            return None
        if row.get("method") == NONE:
            return row
        mine = replicate_of(row, replicates)
        same = [n for n in nones if all(replicate_of(n, replicates).get(k, v) == v for k, v in mine.items())]
        if not same:
            return "unpaired: no `none` trial at " + ", ".join(f"{k}={v}" for k, v in sorted(mine.items()))
        params = named_params(row)
        return max(same, key=lambda n: sum(params.get(k) == v for k, v in named_params(n).items()))

    return find


def configuration_groups(rows: list[dict[str, Any]], replicates: tuple[str, ...]) -> dict[tuple[Any, ...], list[dict[str, Any]]]:
    """The rows by configuration, in first-seen order: the key is (label, every parameter but the replicates, as
    ``(name, repr(value))`` sorted); the value the rows of its replicates. A row with no replicate parameter is a
    configuration of its own (two trials of one setting are not draws). The one grouping of frontiers and ``pick``."""
    groups: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for row in rows:
        params = named_params(row)
        if not any(is_replicate(k, replicates) for k in params):
            groups[(row.get("label"), ("trial", row.get("trial"), id(row)))] = [row]
            continue
        config = tuple(sorted((k, repr(v)) for k, v in params.items() if not is_replicate(k, replicates)))
        groups.setdefault((row.get("label"), config), []).append(row)
    return groups


def per_configuration(rows: list[dict[str, Any]], metrics: tuple[str, ...], replicates: tuple[str, ...]) -> list[dict[str, Any]]:
    """One row per configuration (every parameter but the replicates): each metric's mean over its replicates.

    Each row keeps ``label``, ``trials`` (the trial numbers it averages), ``n`` and, per metric, ``{m}_spread``
    (the range over replicates, min to max). Rows without every metric are left out.
    """
    groups = configuration_groups([r for r in rows if all(isinstance(r.get(m), (int, float)) for m in metrics)], replicates)
    out = []
    for (label, _), members in groups.items():
        merged: dict[str, Any] = {"label": label, "trials": sorted(int(r["trial"]) for r in members), "n": len(members)}
        for m in metrics:
            values = [float(r[m]) for r in members]
            merged[m] = statistics.fmean(values)
            merged[f"{m}_spread"] = (min(values), max(values))
        merged["trial"] = merged["trials"][0]
        out.append(merged)
    return out
