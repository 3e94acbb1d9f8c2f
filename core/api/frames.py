"""``paretolab.load_study(NAME)``: a stored study as pandas data frames (trials, frontier, verdicts).

    s = paretolab.load_study("demo")
    s.trials      # one row per complete trial: number, method, params (one column each), every logged metric, feasible
    s.frontier    # the non-dominated feasible trials on the study's objectives, in the order `paretolab frontier` prints
    s.verdicts    # one row per claim and setting: verdict, difference and its 95 % interval, pairs
    s.objectives  # [(metric, direction), ...]

The rows come from the same readers as ``paretolab frontier`` and ``paretolab report``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from paretolab.stores.locations import Stores


@dataclass
class StudyFrames:
    name: str
    objectives: list[tuple[str, str]]
    trials: Any  # pandas.DataFrame
    frontier: Any
    verdicts: Any
    pipeline: dict[str, Any]

    def __repr__(self) -> str:
        return (f"StudyFrames({self.name!r}: {len(self.trials)} complete trial(s), {len(self.frontier)} on the frontier, "
                f"{len(self.verdicts)} verdict(s); objectives {self.objectives})")


def load_study(name: str, *, home: str | None = None, stores: Stores | None = None, bundle: str | Path | list[str | Path] | None = None) -> StudyFrames:
    """Study ``name`` from the stores (``home``: a store folder, as ``--home``; default as the CLI resolves it), or from
    ``bundle`` (a bundle file, a folder of them, or a list of either; see ``paretolab bundle``) without any store."""
    import pandas as pd

    from paretolab.results.read import load_study as optuna_study
    from paretolab.results.read import trial_table
    from paretolab.results.source import BundleSource, source_of
    from paretolab.results.verdicts import COLUMNS, pipeline_claims, verdicts_of
    from paretolab.stores.locations import resolve_stores

    if bundle is not None:
        source = BundleSource(bundle if isinstance(bundle, list) else [bundle])
    else:
        source = source_of(stores or resolve_stores(home=home, create=False))
    pipeline = optuna_study(name, source).user_attrs.get("pipeline") or {}
    objectives, rows = trial_table(name, source)
    trials = pd.DataFrame([_flat(r) for r in rows])
    frontier = _frontier(trials, objectives)
    verdicts = pd.DataFrame(verdicts_of(pipeline_claims(pipeline), pipeline, rows, source), columns=COLUMNS)  # as `report` judges
    return StudyFrames(name, [tuple(o) for o in objectives], trials, frontier, verdicts, pipeline)


def _flat(row: dict[str, Any]) -> dict[str, Any]:
    out = {"trial": row["trial"], "method": row["method"], "run_id": row["run_id"], "simulated_by": row.get("simulated_by", "")}
    out.update({f"param:{k}": v for k, v in row["params"].items()})
    out.update({k: v for k, v in row.items() if k not in out and k not in ("params", "run_params")})
    return out


def _frontier(trials: Any, objectives: list[tuple[str, str]]) -> Any:
    from paretolab.results.frontier import pareto_indices

    if trials.empty or not objectives:
        return trials.iloc[0:0]
    trials = trials[trials["feasible"].astype(bool)] if "feasible" in trials else trials  # under the study's constraints
    metrics = [m for m, _ in objectives]
    keep = pareto_indices(trials[metrics].to_numpy().tolist(), [d for _, d in objectives])
    return trials.iloc[sorted(keep)].sort_values(metrics[0]).reset_index(drop=True)
