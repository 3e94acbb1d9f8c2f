"""Reading studies back: frontiers and summaries (used by the CLI; the dashboard has its own cache)."""

from __future__ import annotations

import datetime as dt
from typing import Any

import optuna

from paretolab.errors import ConfigError
from paretolab.frontier import pareto_indices
from paretolab.stores import Stores


def load_study(name: str, stores: Stores) -> optuna.Study:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        return optuna.load_study(study_name=name, storage=stores.optuna_url)
    except KeyError:
        names = [s.study_name for s in optuna.get_all_study_summaries(stores.optuna_url)]
        import difflib

        close = difflib.get_close_matches(name, names, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise ConfigError(f"no study {name!r} in {stores.redacted().optuna_url}{hint} (studies: {', '.join(names) or 'none'})") from None


def frontier_rows(name: str, stores: Stores) -> list[dict[str, Any]]:
    """The non-dominated complete trials with their objective values and parameters."""
    study = load_study(name, stores)
    objectives = study.user_attrs.get("objectives") or [[f"objective{i}", d.name.lower()] for i, d in enumerate(study.directions)]
    trials = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
    front = pareto_indices([t.values for t in trials], [d for _, d in objectives])
    rows = []
    for i in sorted(front, key=lambda i: trials[i].values[0]):
        t = trials[i]
        row: dict[str, Any] = {"trial": t.number}
        row.update({metric: value for (metric, _), value in zip(objectives, t.values)})
        row["params"] = dict(t.params)
        row["mlflow_run_id"] = t.user_attrs.get("mlflow_run_id", "")
        rows.append(row)
    return rows


def print_frontier(name: str, rows: list[dict[str, Any]]) -> None:
    if not rows:
        print(f"study {name!r} has no completed trials yet")
        return
    metrics = [k for k in rows[0] if k not in ("trial", "params", "mlflow_run_id")]
    print(f"Pareto set of study {name!r} ({len(rows)} trial(s)):")
    header = ["trial", *metrics, "params"]
    lines = [[str(r["trial"]), *(_num(r[m]) for m in metrics), _params(r["params"])] for r in rows]
    widths = [max(len(h), *(len(line[i]) for line in lines)) for i, h in enumerate(header)]
    print("  ".join(h.ljust(w) for h, w in zip(header, widths)))
    for line in lines:
        print("  ".join(v.ljust(w) for v, w in zip(line, widths)))


def study_summaries(stores: Stores) -> list[dict[str, Any]]:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    out = []
    for summary in optuna.get_all_study_summaries(stores.optuna_url, include_best_trial=False):
        study = optuna.load_study(study_name=summary.study_name, storage=stores.optuna_url)
        trials = study.get_trials(deepcopy=False)
        count = {s: sum(1 for t in trials if t.state == s) for s in optuna.trial.TrialState}
        last = max((t.datetime_complete or t.datetime_start for t in trials if t.datetime_start), default=None)
        out.append({
            "study": summary.study_name,
            "complete": count[optuna.trial.TrialState.COMPLETE],
            "failed": count[optuna.trial.TrialState.FAIL],
            "running": count[optuna.trial.TrialState.RUNNING],
            "objectives": ",".join(m for m, _ in study.user_attrs.get("objectives", [])),
            "last_update": last.isoformat(timespec="seconds") if isinstance(last, dt.datetime) else "",
        })
    return out


def _num(value: Any) -> str:
    return f"{value:.5g}" if isinstance(value, float) else str(value)


def _params(params: dict[str, Any]) -> str:
    return " ".join(f"{k}={_num(v)}" for k, v in params.items())
