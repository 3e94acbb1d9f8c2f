"""The dashboard's data path: studies and trials read from the Optuna store, frontiers, a cache.

Rendering lives elsewhere (``plots.py``, ``views.py``); everything here is plain data so that
the benchmark, the tests and both plot backends share it (Optuna's ``_get_pareto_front_info``
is the model).

The Optuna tables are read with SQLAlchemy directly, read-only, in one query per table for a
whole study: ``study.get_trials`` builds a ``FrozenTrial`` per trial and takes seconds for
10,000 trials, and opening ``RDBStorage`` on a store would create or migrate tables (a write).
A study's table is cached under its *version* (trial count and the newest start and completion
times, one cheap aggregate query), so a repaint of an unchanged study reads nothing else.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import sqlalchemy as sa

from paretolab.results.frontier import CONSTRAINTS, pareto_indices
from paretolab.study.constraints import FEASIBLE, REASON
from paretolab.study.optuna_study import PRUNED_AT

STATES = ("COMPLETE", "FAIL", "RUNNING", "WAITING", "PRUNED")
NONE_METHOD = "none"
TRIAL_ATTRS = {"mlflow_run_id": "", "fail_reason": "", FEASIBLE: True, REASON: "", PRUNED_AT: None}  # user attr -> value when absent


class EmptyStoreError(LookupError):
    """The Optuna store does not exist yet or holds no studies."""


@dataclass(frozen=True)
class StudyInfo:
    """One study as the Studies page lists it."""

    name: str
    study_id: int
    objectives: list[tuple[str, str]]  # (metric, direction), from the study's user attrs
    counts: dict[str, int]  # trial state -> count
    planned: int  # search.trials of the pipeline (at least the trials it holds)
    last_update: pd.Timestamp | None
    model: str
    methods: list[str]
    pipeline: dict[str, Any]
    constraints: tuple[str, ...] = ()  # the pipeline's bounds in words (a trial must meet them to be on a frontier)

    @property
    def finished(self) -> int:
        return self.counts.get("COMPLETE", 0) + self.counts.get("FAIL", 0) + self.counts.get("PRUNED", 0)

    @property
    def total(self) -> int:
        return sum(self.counts.values())


@dataclass
class TrialTable:
    """Every trial of one study: one row per trial, objectives and params as columns.

    Columns: ``number``, ``state``, ``datetime_start``, ``datetime_complete``, one column per
    objective metric, ``param:<name>`` per Optuna parameter, ``methods`` (the label of the
    trial's method combination, e.g. ``magnitude+rtn``), ``simulated`` (methods whose cost
    saving is simulated, comma-separated), ``mlflow_run_id``, ``fail_reason``, ``feasible`` (False only
    for a trial that breaks the study's constraints), ``infeasible_because`` and ``pruned_at_step`` (None
    unless the pruner stopped the trial).
    """

    study: StudyInfo
    frame: pd.DataFrame
    version: tuple[Any, ...]
    _fronts: dict[tuple[Any, ...], np.ndarray] = field(default_factory=dict, repr=False)
    _memo: dict[tuple[Any, ...], Any] = field(default_factory=dict, repr=False)

    def memo(self, key: tuple[Any, ...], make: Callable[[], Any]) -> Any:
        """``make()`` once per ``key`` for this version of the study (plot data, figures)."""
        if key not in self._memo:
            if len(self._memo) > 64:
                self._memo.clear()
            self._memo[key] = make()
        return self._memo[key]

    @property
    def objectives(self) -> list[tuple[str, str]]:
        return self.study.objectives

    @property
    def param_columns(self) -> list[str]:
        return [c for c in self.frame.columns if c.startswith("param:")]

    def complete(self) -> pd.DataFrame:
        return self.frame[self.frame["state"] == "COMPLETE"]

    def feasible(self) -> pd.DataFrame:
        """The complete trials that meet the study's constraints: the only ones a frontier is drawn over."""
        return feasible_rows(self.complete())

    def frontier(self, metrics: Sequence[str], directions: Sequence[str], *, by: str | None = None) -> np.ndarray:
        """Trial numbers on the Pareto frontier of ``metrics`` over the feasible trials (per group of column ``by``), cached."""
        key = (tuple(metrics), tuple(directions), by)
        if key not in self._fronts:
            self._fronts[key] = frontier_numbers(self.feasible(), list(metrics), list(directions), by)
        return self._fronts[key]


def feasible_rows(frame: pd.DataFrame) -> pd.DataFrame:
    return frame[frame["feasible"].astype(bool)] if FEASIBLE in frame else frame


def frontier_numbers(done: pd.DataFrame, metrics: list[str], directions: list[str], by: str | None = None) -> np.ndarray:
    """Trial numbers of the non-dominated rows of ``done`` on ``metrics`` (within each group of ``by``)."""
    if done.empty or any(m not in done.columns for m in metrics):
        return np.array([], dtype=int)
    usable = done.dropna(subset=metrics)
    groups = [usable] if by is None else [g for _, g in usable.groupby(by, sort=False)]
    numbers: list[int] = []
    for group in groups:
        points = group[metrics].to_numpy(dtype=float).tolist()
        front = pareto_indices(points, directions)
        numbers.extend(group["number"].to_numpy()[front].tolist())
    return np.array(sorted(numbers), dtype=int)


# ---- engines and SQL -------------------------------------------------------------------------


def sqlite_path(url: str) -> Path | None:
    """The file behind a ``sqlite:///`` URL (None for other databases or in-memory SQLite)."""
    u = sa.engine.make_url(url)
    if u.get_backend_name() != "sqlite" or not u.database or u.database == ":memory:":
        return None
    return Path(u.database)


@lru_cache(maxsize=8)
def engine(url: str) -> sa.engine.Engine:
    """A read-only engine: SQLite files opened with ``mode=ro`` so the dashboard cannot write."""
    path = sqlite_path(url)
    if path is not None:
        return sa.create_engine(f"sqlite:///file:{path}?mode=ro&uri=true")
    return sa.create_engine(url, pool_pre_ping=True)


def store_exists(url: str) -> bool:
    """False for a SQLite store that was never created (reading it must not create it)."""
    path = sqlite_path(url)
    return path is None or path.is_file()


def list_studies(url: str) -> list[StudyInfo]:
    """Every study in the Optuna store, with trial counts by state; [] for an empty store."""
    if not store_exists(url):
        return []
    with engine(url).connect() as conn:
        if not sa.inspect(conn).has_table("studies"):
            return []
        studies = conn.execute(sa.text("SELECT study_id, study_name FROM studies ORDER BY study_id")).all()
        counts = conn.execute(sa.text("SELECT study_id, state, COUNT(*) FROM trials GROUP BY study_id, state")).all()
        last = conn.execute(sa.text(
            "SELECT study_id, MAX(COALESCE(datetime_complete, datetime_start)) FROM trials GROUP BY study_id"
        )).all()
        attrs = conn.execute(sa.text("SELECT study_id, key, value_json FROM study_user_attributes")).all()
        directions = conn.execute(sa.text("SELECT study_id, objective, direction FROM study_directions ORDER BY objective")).all()
    by_study: dict[int, dict[str, int]] = {}
    for sid, state, n in counts:
        by_study.setdefault(sid, {})[_state_name(state)] = int(n)
    last_by = {sid: _timestamp(t) for sid, t in last}
    attrs_by: dict[int, dict[str, Any]] = {}
    for sid, key, value in attrs:
        attrs_by.setdefault(sid, {})[key] = json.loads(value)
    dirs_by: dict[int, list[str]] = {}
    for sid, _, direction in directions:
        dirs_by.setdefault(sid, []).append(_state_name(direction).lower())
    return [_study_info(sid, name, by_study.get(sid, {}), last_by.get(sid), attrs_by.get(sid, {}), dirs_by.get(sid, []))
            for sid, name in studies]


def _study_info(sid: int, name: str, counts: dict[str, int], last: pd.Timestamp | None, attrs: dict[str, Any], dirs: list[str]) -> StudyInfo:
    objectives = [(str(m), str(d)) for m, d in attrs.get("objectives") or []]
    if not objectives:
        objectives = [(f"objective{i}", d) for i, d in enumerate(dirs)]
    pipeline = attrs.get("pipeline") or {}
    planned = int((pipeline.get("search") or {}).get("trials") or 0)
    return StudyInfo(
        name=name, study_id=sid, objectives=objectives, counts=counts, planned=max(planned, sum(counts.values())),
        last_update=last, model=str(attrs.get("model", "")), methods=list(attrs.get("methods") or []), pipeline=pipeline,
        constraints=tuple(str(c) for c in attrs.get(CONSTRAINTS) or []),
    )


def study_version(url: str, study_id: int) -> tuple[Any, ...]:
    """What changes whenever a trial is added or finishes: (count, newest start, newest completion)."""
    with engine(url).connect() as conn:
        row = conn.execute(sa.text(
            "SELECT COUNT(*), MAX(datetime_start), MAX(datetime_complete) FROM trials WHERE study_id = :sid"
        ), {"sid": study_id}).one()
    return tuple(str(v) for v in row)


# ---- the cache -------------------------------------------------------------------------------

_CACHE: OrderedDict[tuple[str, str], TrialTable] = OrderedDict()
_CACHE_SIZE = 8
_LOCK = threading.Lock()


def load_trials(url: str, name: str, *, methods_cost: dict[str, str] | None = None) -> TrialTable:
    """The trials of study ``name``, from cache when its version has not changed.

    ``methods_cost`` maps method name -> ``real``/``simulated`` (the registry's ``cost_is``),
    used to mark trials whose cost saving is simulated.
    """
    studies = {s.name: s for s in list_studies(url)}
    if name not in studies:
        raise KeyError(name)
    info = studies[name]
    version = study_version(url, info.study_id)
    with _LOCK:
        hit = _CACHE.get((url, name))
        if hit is not None and hit.version == version:
            _CACHE.move_to_end((url, name))
            return hit
    table = TrialTable(info, read_trials(url, info, methods_cost or {}), version)
    with _LOCK:
        _CACHE[(url, name)] = table
        while len(_CACHE) > _CACHE_SIZE:
            _CACHE.popitem(last=False)
    return table


def cached_trials(url: str, name: str) -> TrialTable | None:
    """The cached table if the study is unchanged since it was read (two small queries, no trial read)."""
    with _LOCK:
        hit = _CACHE.get((url, name))
    if hit is None or study_version(url, hit.study.study_id) != hit.version:
        return None
    return hit


def clear_cache() -> None:
    with _LOCK:
        _CACHE.clear()


# ---- reading one study's trials --------------------------------------------------------------


def read_trials(url: str, info: StudyInfo, methods_cost: dict[str, str]) -> pd.DataFrame:
    """One query per table (trials, values, params, user attrs) for the whole study, turned into columns with numpy.

    Rows are fetched through the DB-API cursor: SQLAlchemy's Row objects cost more than the
    query itself at 10k trials. ``study_id`` is an integer from our own query, so it is
    inlined (parameter styles differ between drivers).
    """
    sid = int(info.study_id)
    with engine(url).connect() as conn:
        trials = _fetch(conn, f"SELECT trial_id, number, state, datetime_start, datetime_complete FROM trials WHERE study_id = {sid} ORDER BY number")
        values = _fetch(conn, "SELECT v.trial_id, v.objective, v.value, v.value_type FROM trial_values v "
                              f"JOIN trials t ON t.trial_id = v.trial_id WHERE t.study_id = {sid}")
        params = _fetch(conn, "SELECT p.trial_id, p.param_name, p.param_value, p.distribution_json FROM trial_params p "
                              f"JOIN trials t ON t.trial_id = p.trial_id WHERE t.study_id = {sid}")
        attrs = _fetch(conn, "SELECT a.trial_id, a.key, a.value_json FROM trial_user_attributes a "
                             f"JOIN trials t ON t.trial_id = a.trial_id WHERE t.study_id = {sid} "
                             f"AND a.key IN ({', '.join(repr(k) for k in TRIAL_ATTRS)})")
    n = len(trials)
    ids = np.fromiter((r[0] for r in trials), dtype=np.int64, count=n)
    order = np.argsort(ids)

    def rows_of(trial_ids: list[int]) -> np.ndarray:
        """Row index in ``trials`` of each trial id."""
        return order[np.searchsorted(ids, np.asarray(trial_ids, dtype=np.int64), sorter=order)]

    columns: dict[str, Any] = {
        "number": np.fromiter((r[1] for r in trials), dtype=int, count=n),
        "state": pd.Series([r[2] for r in trials], dtype=object).map(_state_name),
        "datetime_start": pd.to_datetime(pd.Series([r[3] for r in trials], dtype=object)),
        "datetime_complete": pd.to_datetime(pd.Series([r[4] for r in trials], dtype=object)),
    }
    metrics = [m for m, _ in info.objectives]
    if values:
        v_ids, v_obj, v_val, v_type = zip(*values)
        v_rows = rows_of(list(v_ids))
        v_obj_a = np.asarray(v_obj, dtype=int)
        v_val_a = np.asarray([np.nan if x is None else x for x in v_val], dtype=float)
        kinds = pd.Series(v_type, dtype=object).map(_state_name).to_numpy()
        v_val_a[kinds == "INF_POS"] = np.inf
        v_val_a[kinds == "INF_NEG"] = -np.inf
    for i, metric in enumerate(metrics):
        column = np.full(n, np.nan)
        if values:
            mine = v_obj_a == i
            column[v_rows[mine]] = v_val_a[mine]
        columns[metric] = column

    if params:
        frame = pd.DataFrame(params, columns=["trial_id", "name", "value", "dist"])
        frame["row"] = rows_of(frame["trial_id"].tolist())
        for (name, dist_json), group in frame.groupby(["name", "dist"], sort=False):
            column_name = f"param:{name}"
            # object dtype keeps a categorical int an int next to trials that lack the parameter (no NaN upcast)
            column = columns.setdefault(column_name, np.full(n, None, dtype=object))
            column[group["row"].to_numpy()] = _external_many(str(dist_json), group["value"].to_numpy(dtype=float))

    found = {key: np.full(n, default, dtype=object) for key, default in TRIAL_ATTRS.items()}
    if attrs:
        a_ids, a_keys, a_values = zip(*attrs)
        for row, key, value in zip(rows_of(list(a_ids)), a_keys, a_values):
            found[key][row] = json.loads(value)
    columns.update(found)
    columns[FEASIBLE] = np.fromiter((v is not False for v in found[FEASIBLE]), dtype=bool, count=n)  # no verdict: feasible
    table = pd.DataFrame(columns)
    labels, simulated = trial_methods(table, info.pipeline, methods_cost)
    table["methods"] = labels
    table["simulated"] = simulated
    return table


def _fetch(conn: sa.Connection, sql: str) -> list[tuple[Any, ...]]:
    cursor = conn.connection.cursor()
    try:
        cursor.execute(sql)
        return list(cursor.fetchall())
    finally:
        cursor.close()


def _external_many(dist_json: str, internal: np.ndarray) -> np.ndarray:
    """Optuna's stored (internal) parameter values -> the values the trial saw, for one distribution."""
    from optuna.distributions import CategoricalDistribution, IntDistribution

    dist = _distribution(dist_json)
    out = np.empty(len(internal), dtype=object)
    if isinstance(dist, CategoricalDistribution):
        choices = np.asarray(dist.choices + (None,), dtype=object)
        index = internal.astype(int)
        out[:] = choices[np.where((index >= 0) & (index < len(dist.choices)), index, len(dist.choices))]
    elif isinstance(dist, IntDistribution):
        out[:] = [int(round(v)) for v in internal]
    else:
        out[:] = internal.tolist()
    return out


def trial_methods(frame: pd.DataFrame, pipeline: dict[str, Any], methods_cost: dict[str, str]) -> tuple[list[str], list[str]]:
    """Each trial's method combination (``none`` when the model is left as is) and its simulated methods.

    Fixed stages come from the pipeline, chosen ones from the ``stageN.method`` parameters.
    """
    n = len(frame)
    per_trial: list[list[str]] = [[] for _ in range(n)]
    for index, stage in enumerate(pipeline.get("stages") or []):
        if not isinstance(stage, dict):
            continue
        stage_id = str(stage.get("id", f"stage{index}"))
        if "choice" in stage:
            column = frame.get(f"param:{stage_id}.method")
            chosen = list(column) if column is not None else [None] * n
            for i, method in enumerate(chosen):
                if isinstance(method, str):
                    per_trial[i].append(method)
        elif "method" in stage:
            for methods in per_trial:
                methods.append(str(stage["method"]))
    labels, simulated = [], []
    for methods in per_trial:
        real = [m for m in methods if m != NONE_METHOD]
        labels.append("+".join(real) if real else NONE_METHOD)
        simulated.append(",".join(m for m in real if methods_cost.get(m) == "simulated"))
    return labels, simulated


@lru_cache(maxsize=4096)
def _distribution(dist_json: str) -> Any:
    from optuna.distributions import json_to_distribution

    return json_to_distribution(dist_json)


def _state_name(value: Any) -> str:
    """Enum columns come back as names ('COMPLETE') or, on some backends, as enum members."""
    return str(getattr(value, "name", value)).upper()


def _timestamp(value: Any) -> pd.Timestamp | None:
    return None if value is None else pd.Timestamp(value)
