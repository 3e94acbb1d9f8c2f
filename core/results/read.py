"""Reading studies back from the stores: frontiers, per-method tables, summaries and failure reasons
(used by the CLI and the results document; the dashboard reads through its own cache).

A study with ``constraints:`` has its frontiers drawn over the feasible complete trials only; a trial
without a verdict (an older or unconstrained study) counts as feasible. Pruned trials are never complete.
"""

from __future__ import annotations

import datetime as dt
import statistics
from collections import Counter
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from paretolab.data.names import printable
from paretolab.errors import ConfigError
from paretolab.plugin_api.numbers import metric_value, params_text
from paretolab.results.frontier import CONSTRAINTS, is_feasible, pareto_indices
from paretolab.results.engines import gap_cell
from paretolab.results.noise import QUALITY, engine_ppl_gaps, mark_indistinguishable
from paretolab.results.replicates import configuration_groups, is_replicate, report_replicates
from paretolab.results.source import Source, source_of
from paretolab.stores.locations import Stores
from paretolab.stores.open import exists, guarded, optuna_storage, sqlite_file
from paretolab.study.constraints import REASON, reason_text
from paretolab.study.attrs import QUALITY_NOTE

if TYPE_CHECKING:
    import optuna


class FrontierRows(list):  # type: ignore[type-arg]
    """``frontier_rows``' answer: a plain list (JSON as ever) that also knows the study's constraints in words."""

    constraints: list[str] = []


def load_study(name: str, stores: Stores | Source) -> optuna.Study:
    """Study ``name``, read only: a missing store is an error, never created; from bundles when given a BundleSource."""
    return source_of(stores).study(name)


def frontier_rows(name: str, stores: Stores | Source) -> FrontierRows:
    """The non-dominated feasible complete trials with their objective values and parameters (``feasible: true``),
    then the infeasible trials that the frontier would have without the constraints (``feasible: false`` and
    ``infeasible_because``). ``.constraints``: the study's bounds in words ([] without constraints).

    A study that repeats configurations over replicates (seeds, calibration draws: the pipeline's claims' ``replicates``,
    else the usual names) places each configuration at its replicates' mean: one row per frontier configuration, its
    ``trials`` and each objective's ``spread`` (min, max over them); a luckier draw gives a method no second chance."""
    study = source_of(stores).stored_study(name)
    objectives = study.user_attrs.get("objectives") or [[f"objective{i}", d] for i, d in enumerate(study.directions)]
    directions = [d for _, d in objectives]
    trials = study.complete
    ok = [t for t in trials if is_feasible(t.user_attrs)]
    replicates = report_replicates(study.user_attrs.get("pipeline") or {})
    configs = _configurations(ok, replicates)
    if any(len(c) > 1 for c in configs):
        means = [[statistics.fmean(t.values[i] for t in c) for i in range(len(objectives))] for c in configs]
        front_configs = sorted((configs[i] for i in pareto_indices(means, directions)), key=lambda c: statistics.fmean(t.values[0] for t in c))
        rows = FrontierRows(_configuration_row(c, objectives, replicates) for c in front_configs)
    else:
        front = [ok[i] for i in pareto_indices([t.values for t in ok], directions)]
        rows = FrontierRows(_frontier_row(t, objectives) for t in sorted(front, key=lambda t: t.values[0]))
        for row, noise in zip(rows, frontier_noise(rows, [m for m, _ in objectives], stores)):  # neighbours along the feasible frontier only
            if noise is not None:
                row["noise"] = noise
    left_off = [trials[i] for i in pareto_indices([t.values for t in trials], directions) if not is_feasible(trials[i].user_attrs)]
    rows.extend({**_frontier_row(t, objectives), "feasible": False, REASON: reason_text(t.user_attrs.get(REASON) or "no reason recorded")}
                for t in sorted(left_off, key=lambda t: t.values[0]))
    if "engine" in ((study.user_attrs.get("pipeline") or {}).get("measures") or {}):  # else no engine figures: nothing more to read
        _add_engines(rows, {t.number: t for t in trials}, stores)
    rows.constraints = [reason_text(c) for c in study.user_attrs.get(CONSTRAINTS) or []]
    return rows


def _configurations(trials: list[Any], replicates: tuple[str, ...]) -> list[list[Any]]:
    """Optuna trials grouped by configuration: the same value of every parameter that is no replicate, in first-seen order;
    a trial with no replicate parameter is a configuration of its own (two trials of one setting are not draws)."""
    groups: dict[tuple[Any, ...], list[Any]] = {}
    for t in trials:
        if not any(is_replicate(k, replicates) for k in t.params):
            groups[("trial", t.number)] = [t]
            continue
        groups.setdefault(tuple(sorted((k, repr(v)) for k, v in t.params.items() if not is_replicate(k, replicates))), []).append(t)
    return list(groups.values())


def _configuration_row(trials: list[Any], objectives: list[list[str]], replicates: tuple[str, ...]) -> dict[str, Any]:
    """A configuration's frontier row: each objective's mean over its replicates and its ``spread``; ``trial`` the first;
    ``params`` without the replicates (the row is no one draw)."""
    row = _frontier_row(trials[0], objectives)
    row["params"] = {k: v for k, v in row["params"].items() if not is_replicate(k, replicates)}
    row.update({metric: statistics.fmean(t.values[i] for t in trials) for i, (metric, _) in enumerate(objectives)})
    row["trials"] = sorted(t.number for t in trials)
    row["spread"] = {metric: [min(t.values[i] for t in trials), max(t.values[i] for t in trials)] for i, (metric, _) in enumerate(objectives)}
    return row


def _frontier_row(trial: Any, objectives: list[list[str]]) -> dict[str, Any]:
    row: dict[str, Any] = {"trial": trial.number}
    row.update({metric: value for (metric, _), value in zip(objectives, trial.values)})
    row["params"] = dict(trial.params)
    row["mlflow_run_id"] = trial.user_attrs.get("mlflow_run_id", "")
    row["feasible"] = True
    return row


def _add_engines(rows: list[dict[str, Any]], trials: dict[int, optuna.trial.FrozenTrial], stores: Stores | Source) -> None:
    """Where the study ran the engine measure: each row's ``engine`` figures and labels and ``engine_ppl``, per engine its
    perplexity against the trial's, within noise or beyond (:func:`paretolab.results.noise.engine_ppl_gaps`)."""
    from paretolab.study.recording import ENGINE, engine_attrs

    for row in rows:
        trial = trials.get(row["trial"])
        engine = dict(trial.user_attrs.get(ENGINE) or {}) if trial is not None else {}
        if not engine and row.get("mlflow_run_id"):  # a trial recorded before Optuna kept them: MLflow's copy
            engine = engine_attrs(source_of(stores).run_metrics(row["mlflow_run_id"]), {})
        if engine:
            row["engine"] = engine
            row["engine_ppl"] = engine_ppl_gaps(engine)


def study_quality_note(name: str, stores: Stores | Source) -> str:
    """The warning for a study whose model makes its quality numbers meaningless (tiny-llama), or ""."""
    attrs = source_of(stores).stored_study(name).user_attrs
    if QUALITY_NOTE in attrs:  # recorded when the study was created: no plugin loaded to read it back
        return str(attrs[QUALITY_NOTE])
    from paretolab.models import quality_note  # an older study: ask the model registry (loads every plugin)

    return quality_note(str(attrs.get("model", "")), attrs.get("pipeline") or {})


def frontier_noise(rows: list[dict[str, Any]], metrics: list[str], stores: Stores | Source) -> list[str | None]:
    """The one "within noise" of every surface (``frontier``, the dashboard's frontier): for frontier rows sorted along
    it (each with ``trial``, ``mlflow_run_id`` and its values), the neighbours whose quality metric is within noise of
    the row's, e.g. ``ppl ≈ trial 3``. Paired on the runs' per-example scores where both have them, else unpaired on the
    intervals the runs logged (read from the source, whatever columns the caller holds). None per row when no metric
    is a quality metric or there is no neighbour."""
    quality = [m for m in metrics if m in QUALITY]
    if not quality or len(rows) < 2:
        return [None] * len(rows)
    source = source_of(stores)
    views = []
    for row in rows:
        logged = source.run_metrics(str(row.get("mlflow_run_id") or ""))
        plain = {k: v for k, v in row.items() if k in ("trial", *quality)}
        views.append({**logged, **plain, "run_id": str(row.get("mlflow_run_id") or "")})
    mark_indistinguishable(views, quality, source.per_example())
    return [view["noise"] for view in views]


def print_frontier(name: str, rows: list[dict[str, Any]]) -> None:
    """The frontier as a table; under constraints, say so and list the infeasible trials it leaves off, with why."""
    if not rows:
        print(f"study {name!r} has no completed trials yet")
        return
    constraints = list(getattr(rows, "constraints", None) or [])
    under = f"; feasible frontier under: {printable('; '.join(constraints))}" if constraints else ""
    front = [r for r in rows if r.get("feasible", True)]
    left_off = [r for r in rows if not r.get("feasible", True)]
    if front:
        what = f"{len(front)} configuration(s), each at the mean over its replicates" if any("trials" in r for r in front) else f"{len(front)} trial(s)"
        print(f"Pareto set of study {name!r} ({what}){under}:")
        noise = ["within noise of"] if any(r.get("noise") for r in front) else []
        engines = ["engine ppl vs the trial's"] if any(r.get("engine_ppl") for r in front) else []
        _print_rows(front, noise + engines, lambda r: ([r.get("noise", "")] if noise else []) + ([gap_cell(r.get('engine_ppl') or {})] if engines else []))
    else:
        print(f"study {name!r} has no feasible complete trial{under}")
    if left_off:
        print(f"left off as infeasible ✗, {len(left_off)} trial(s) that would be on the frontier without the constraints:")
        _print_rows(left_off, ["infeasible because"], lambda r: [str(r.get(REASON, ""))], mark=" ✗")


def _print_rows(rows: list[dict[str, Any]], extra: list[str], cells: Any, mark: str = "") -> None:
    metrics = [k for k in rows[0] if k not in ("trial", "trials", "spread", "params", "mlflow_run_id", "noise", "feasible", REASON, "engine", "engine_ppl")]
    header = [printable(h) for h in ("trial" if not any("trials" in r for r in rows) else "trials (mean over replicates)", *metrics, *extra, "params")]
    lines = [[printable(cell) for cell in ("+".join(map(str, r.get("trials") or [r["trial"]])) + mark, *(_mean_cell(r, m) for m in metrics),
                                           *cells(r), _params(r["params"]))]
             for r in rows]
    widths = [max(len(h), *(len(line[i]) for line in lines)) for i, h in enumerate(header)]
    print("  ".join(h.ljust(w) for h, w in zip(header, widths)))
    for line in lines:
        print("  ".join(v.ljust(w) for v, w in zip(line, widths)))


def _mean_cell(row: dict[str, Any], metric: str) -> str:
    """A metric's value, and for a configuration's mean over replicates its range: ``35.51 (34.9–36.3)``."""
    spread = (row.get("spread") or {}).get(metric)
    if not spread or len(row.get("trials") or ()) < 2:
        return metric_value(metric, row[metric])
    low, high = metric_value(metric, spread[0]), metric_value(metric, spread[1])
    return f"{metric_value(metric, row[metric])} ({low}–{high})" if low != high else metric_value(metric, row[metric])


def study_summaries(stores: Stores) -> list[dict[str, Any]]:
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    if not exists(stores.optuna_url):
        return []  # nothing has run with these stores: nothing to list, and nothing is created
    storage = optuna_storage(stores, create=False)
    out = []
    for summary in guarded("Optuna", stores.optuna_url, lambda: optuna.get_all_study_summaries(storage, include_best_trial=False)):
        study = optuna.load_study(study_name=summary.study_name, storage=storage)
        trials = study.get_trials(deepcopy=False)
        count = {s: sum(1 for t in trials if t.state == s) for s in optuna.trial.TrialState}
        last = max((t.datetime_complete or t.datetime_start for t in trials if t.datetime_start), default=None)
        out.append({
            "study": summary.study_name,
            "complete": count[optuna.trial.TrialState.COMPLETE],
            "failed": count[optuna.trial.TrialState.FAIL],
            "pruned": count[optuna.trial.TrialState.PRUNED],
            "running": count[optuna.trial.TrialState.RUNNING],
            "objectives": ",".join(m for m, _ in study.user_attrs.get("objectives", [])),
            "last_update": last.isoformat(timespec="seconds") if isinstance(last, dt.datetime) else "",
            "failures": failure_reasons(trials),
        })
    return out


def failure_reasons(trials: Iterable[optuna.trial.FrozenTrial]) -> list[tuple[str, int]]:
    """(reason, count) over the failed trials, most frequent first; a reason is the first line the driver recorded."""
    import optuna

    reasons = Counter(
        ((t.user_attrs.get("fail_reason") or "").strip().splitlines() or ["no reason recorded"])[0][:200]
        for t in trials
        if t.state == optuna.trial.TrialState.FAIL
    )
    return reasons.most_common()


def print_failures(name: str, reasons: list[tuple[str, int]]) -> None:
    """One line per reason, with how many failed trials gave it."""
    if reasons:
        print(f"failed trials of {name!r} by reason:")
        for reason, count in reasons:
            print(f"  {count:>4} x {printable(reason)}")


def _params(params: dict[str, Any]) -> str:
    return params_text(params)


def trial_table(name: str, stores: Stores | Source) -> tuple[list[tuple[str, str]], list[dict[str, Any]]]:
    """(objectives, rows): every complete trial with its method label, all MLflow metrics, and its verdict
    (``feasible``, ``infeasible_because``: "" when feasible) under the study's constraints."""
    import optuna

    source = source_of(stores)
    study = source.study(name)
    objectives = [tuple(o) for o in study.user_attrs.get("objectives", [])]
    runs = source.trial_runs(name)
    rows = []
    for trial in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,)):
        run = runs.get(trial.number)
        metrics = dict(run.data.metrics) if run else {}
        metrics.update({m: v for (m, _), v in zip(objectives, trial.values)})
        rows.append({"trial": trial.number, "run_id": run.info.run_id if run else "", "method": method_label(run.data.params if run else {}), "params": dict(trial.params),
                     "run_params": dict(run.data.params) if run else {}, **metrics,
                     "simulated_by": run.data.tags.get("paretolab.simulated_by", "") if run else "",
                     "feasible": is_feasible(trial.user_attrs), REASON: reason_text(trial.user_attrs.get(REASON) or "")})
    return objectives, _without_common_training(rows)


def _without_common_training(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Drop ``train`` from the labels when every trial trained: the baseline is then the model trained
    with no method, labelled ``none`` like the unmodified model of a compression study."""
    if rows and all("train" in r["method"].split("+") for r in rows):
        for r in rows:
            r["method"] = "+".join(m for m in r["method"].split("+") if m != "train") or "none"
    return rows


def method_label(params: dict[str, str]) -> str:
    """'wanda+rtn' for a trial that ran wanda then rtn; 'none' for the unmodified model."""
    methods = [v for k, v in sorted(params.items()) if k.endswith(".method") and k.count(".") == 1 and v != "none"]
    return "+".join(methods) or "none"


def method_frontiers(name: str, stores: Stores | Source) -> list[dict[str, Any]]:
    """Each method's own Pareto set on the study's objectives, over its feasible trials (a configuration repeated over
    replicates at their mean): the cross-method comparison."""
    pipeline = source_of(stores).stored_study(name).user_attrs.get("pipeline") or {}
    return per_method(*trial_table(name, stores), frontier=True, replicates=report_replicates(pipeline))


def per_method(objectives: list[tuple[str, str]], rows: list[dict[str, Any]], *, frontier: bool,
               replicates: tuple[str, ...] = ()) -> list[dict[str, Any]]:
    """Rows grouped by method (sorted by the last objective); only each method's Pareto set of its feasible rows when
    ``frontier``. With ``replicates``, a configuration repeated over them is on its method's frontier when its mean over
    them is (every draw of it listed then): a luckier draw gives a method no second chance."""
    directions = [d for _, d in objectives]
    if frontier:
        rows = [r for r in rows if r.get("feasible", True)]
    out = []
    for label in sorted({r["method"] for r in rows}):
        mine = [r for r in rows if r["method"] == label]
        if frontier:
            mine = _front_of(mine, objectives, directions, replicates)
        out.extend(sorted(mine, key=lambda r: (r[objectives[-1][0]], r[objectives[0][0]])))
    return out


def _front_of(rows: list[dict[str, Any]], objectives: list[tuple[str, str]], directions: list[str], replicates: tuple[str, ...]) -> list[dict[str, Any]]:
    """The rows on their Pareto set: each row alone, or each configuration at its replicates' mean (all its rows kept)."""
    groups = list(configuration_groups(rows, replicates).values()) if replicates else [[r] for r in rows]
    means = [[statistics.fmean(float(r[m]) for r in g) for m, _ in objectives] for g in groups]
    return [r for i in pareto_indices(means, directions) for r in groups[i]]


