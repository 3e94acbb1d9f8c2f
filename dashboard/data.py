"""The dashboard's data path: studies and trials read from the Optuna store, frontiers, a cache.

Rendering lives elsewhere (``plots.py``, ``view_*.py``); everything here is plain data so that
the benchmark, the tests and both plot backends share it (Optuna's ``_get_pareto_front_info``
is the model). The tables are read by ``store_read`` (SQL, one query per table, read-only).

What a repaint costs is kept independent of the study's size. Optuna never changes a finished
trial (COMPLETE, FAIL and PRUNED are final; only RUNNING and WAITING trials change), and trial ids
only grow. So the store is followed by two lookups on the primary key: the trials above the
newest id seen, and the trials that were still open. A study's *version* is its newest trial id
and the states of its open trials; an unchanged study is a cache hit, and a changed one reads
only its new and formerly open trials into the cached table.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
import sqlalchemy as sa

from paretolab.dashboard.store_read import (
    NONE_METHOD,
    OPEN_STATES,
    TRIAL_ATTRS,
    engine,
    fetch,
    literal,
    state_name,
    store_exists,
    study_trials,
)
from paretolab.results.frontier import CONSTRAINTS, pareto_indices
from paretolab.study.constraints import FEASIBLE, reason_text
from paretolab.study.session import SESSION

__all__ = ["NONE_METHOD", "engine", "store_exists"]  # read here by runs.py, curves.py and plots.py


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
    session: dict[str, Any] = field(default_factory=dict)  # the driver's last session (paretolab.study.session)
    status: str = "finished"  # as `paretolab studies` says it: running, finished, interrupted (...)
    status_hint: str = ""  # for an interrupted study: why, and the command that resumes it

    @property
    def finished(self) -> int:
        return self.counts.get("COMPLETE", 0) + self.counts.get("FAIL", 0) + self.counts.get("PRUNED", 0)

    @property
    def total(self) -> int:
        return sum(self.counts.values())


@dataclass
class TrialTable:
    """Every trial of one study: one row per trial, objectives and params as columns.

    Columns: ``number``, ``state``, ``datetime_complete``, one column per
    objective metric, ``param:<name>`` per Optuna parameter, ``methods`` (the label of the
    trial's method combination, e.g. ``magnitude+rtn``), ``simulated`` (methods whose cost
    saving is simulated, comma-separated), ``mlflow_run_id``, ``fail_reason``, ``feasible`` (False only
    for a trial that breaks the study's constraints), ``infeasible_because`` and ``pruned_at_step`` (None
    unless the pruner stopped the trial).
    """

    study: StudyInfo
    frame: pd.DataFrame
    version: tuple[Any, ...]
    trial_ids: np.ndarray = field(default_factory=lambda: np.array([], dtype=np.int64), repr=False)  # row for row
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
        return self.memo(("complete",), lambda: self.frame[self.frame["state"] == "COMPLETE"])

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
        front = pareto_indices(group[metrics].to_numpy(dtype=float), directions)
        numbers.extend(group["number"].to_numpy()[front].tolist())
    return np.array(sorted(numbers), dtype=int)



# ---- the store, followed by trial id ---------------------------------------------------------


@dataclass
class _Followed:
    """What is known of one store's trials without reading them again: counts, newest ids, the open trials."""

    newest: int = 0  # the highest trial_id seen
    counts: dict[int, dict[str, int]] = field(default_factory=dict)  # study_id -> state -> trials
    study_newest: dict[int, int] = field(default_factory=dict)  # study_id -> its highest trial_id
    last: dict[int, Any] = field(default_factory=dict)  # study_id -> newest start or completion (as stored)
    open: dict[int, tuple[int, str]] = field(default_factory=dict)  # trial_id -> (study_id, state), RUNNING or WAITING

    def add(self, rows: list[tuple[Any, ...]]) -> None:
        """Trials (trial_id, study_id, state, newest time) not seen before, or open ones seen again."""
        for trial_id, study_id, state, when in rows:
            state = state_name(state)
            counts = self.counts.setdefault(study_id, {})
            before = self.open.pop(trial_id, None)
            if before is not None:
                counts[before[1]] -= 1
            counts[state] = counts.get(state, 0) + 1
            if state in OPEN_STATES:
                self.open[trial_id] = (study_id, state)
            self.newest = max(self.newest, trial_id)
            self.study_newest[study_id] = max(self.study_newest.get(study_id, 0), trial_id)
            if when is not None and (self.last.get(study_id) is None or str(when) > str(self.last[study_id])):
                self.last[study_id] = when

    def version(self, study_id: int) -> tuple[Any, ...]:
        """Changes whenever a trial is added to the study or one of its open trials changes state."""
        still_open = tuple(sorted((t, s) for t, (sid, s) in self.open.items() if sid == study_id))
        return self.study_newest.get(study_id, 0), still_open

    def open_ids(self, study_id: int) -> list[int]:
        return sorted(t for t, (sid, _) in self.open.items() if sid == study_id)


_FOLLOWED: dict[str, _Followed] = {}
_FOLLOW_LOCK = threading.Lock()
_ROW = "trial_id, study_id, state, COALESCE(datetime_complete, datetime_start)"


def _follow(conn: sa.Connection, url: str, study_ids: set[int]) -> _Followed:
    """The store's trials brought up to date: new trial ids and formerly open trials only (both by primary key);
    everything again when a study was deleted (its trial ids may be handed out again)."""
    known = _FOLLOWED.get(url)
    if known is not None and set(known.counts) <= study_ids:
        open_ids = sorted(known.open)
        seen = fetch(conn, f"SELECT {_ROW} FROM trials WHERE trial_id IN ({', '.join(map(str, open_ids))})") if open_ids else []
        if len(seen) == len(open_ids):
            known.add(fetch(conn, f"SELECT {_ROW} FROM trials WHERE trial_id > {int(known.newest)}") + seen)
            return known
    fresh = _Followed()
    states = ", ".join(literal(conn, s) for s in OPEN_STATES)
    for study_id, state, n, newest, last in fetch(conn, "SELECT study_id, state, COUNT(*), MAX(trial_id), "
                                                 "MAX(COALESCE(datetime_complete, datetime_start)) FROM trials GROUP BY study_id, state"):
        fresh.counts.setdefault(study_id, {})[state_name(state)] = int(n)
        fresh.newest = max(fresh.newest, newest)
        fresh.study_newest[study_id] = max(fresh.study_newest.get(study_id, 0), newest)
        if last is not None and (fresh.last.get(study_id) is None or str(last) > str(fresh.last[study_id])):
            fresh.last[study_id] = last
    for trial_id, study_id, state, _ in fetch(conn, f"SELECT {_ROW} FROM trials WHERE state IN ({states})"):
        fresh.open[trial_id] = (study_id, state_name(state))
    _FOLLOWED[url] = fresh
    return fresh


def list_studies(url: str) -> list[StudyInfo]:
    """Every study in the Optuna store, with trial counts by state and its status; [] for an empty store."""
    return [_with_status(info, url) for info, _ in _studies(url)]


def _with_status(info: StudyInfo, url: str) -> StudyInfo:
    """The status `paretolab studies` prints (one definition: ``study.session.study_status``).

    Whether a driver owns the study is asked only of a study whose session says it runs (its driver made the lock
    file): the page never creates a lock file beside a store.
    """
    from dataclasses import replace

    from paretolab.stores.ownership import study_owner
    from paretolab.study.session import study_status

    counts = {"complete": info.counts.get("COMPLETE", 0), "failed": info.counts.get("FAIL", 0), "running": info.counts.get("RUNNING", 0)}
    owned = info.session.get("state") == "running" and study_owner(url, info.name) is not None
    status, hint, _ = study_status({SESSION: info.session, "pipeline": info.pipeline}, counts, owned)
    return replace(info, status=status, status_hint=hint)


def _studies(url: str) -> list[tuple[StudyInfo, tuple[Any, ...]]]:
    """Each study with its version (see ``_Followed.version``)."""
    if not store_exists(url):
        return []
    with engine(url).connect() as conn:
        if not sa.inspect(conn).has_table("studies"):
            return []
        studies = fetch(conn, "SELECT study_id, study_name FROM studies ORDER BY study_id")
        attrs = fetch(conn, "SELECT study_id, key, value_json FROM study_user_attributes")
        directions = fetch(conn, "SELECT study_id, objective, direction FROM study_directions ORDER BY objective")
        with _FOLLOW_LOCK:
            followed = _follow(conn, url, {sid for sid, _ in studies})
            counts = {sid: {s: n for s, n in c.items() if n} for sid, c in followed.counts.items()}
            versions = {sid: followed.version(sid) for sid, _ in studies}
            last_by = {sid: _timestamp(t) for sid, t in followed.last.items()}
    attrs_by: dict[int, dict[str, Any]] = {}
    for sid, key, value in attrs:
        attrs_by.setdefault(sid, {})[key] = json.loads(value)
    dirs_by: dict[int, list[str]] = {}
    for sid, _, direction in directions:
        dirs_by.setdefault(sid, []).append(state_name(direction).lower())
    return [(_study_info(sid, name, counts.get(sid, {}), last_by.get(sid), attrs_by.get(sid, {}), dirs_by.get(sid, [])), versions[sid])
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
        constraints=tuple(reason_text(c) for c in attrs.get(CONSTRAINTS) or []), session=dict(attrs.get(SESSION) or {}),
    )


def study_version(url: str, study_id: int) -> tuple[Any, ...]:
    """What changes whenever a trial is added to the study or finishes (two primary-key lookups, see ``_follow``)."""
    for info, version in _studies(url):
        if info.study_id == study_id:
            return version
    return ()


def _timestamp(value: Any) -> pd.Timestamp | None:
    return None if value is None else pd.Timestamp(value)


# ---- the cache -------------------------------------------------------------------------------

_CACHE: OrderedDict[tuple[str, str], TrialTable] = OrderedDict()
_CACHE_SIZE = 8
_LOCK = threading.Lock()


def load_trials(url: str, name: str, *, methods_cost: dict[str, str] | None = None) -> TrialTable:
    """The trials of study ``name``: from cache when its version has not changed, else the cached table with
    its new and formerly open trials read (the whole study on a first read).

    ``methods_cost`` maps method name -> ``real``/``simulated`` (the registry's ``cost_is``),
    used to mark trials whose cost saving is simulated.
    """
    found = {info.name: (info, version) for info, version in _studies(url)}
    if name not in found:
        raise KeyError(name)
    info, version = found[name]
    with _LOCK:
        hit = _CACHE.get((url, name))
        if hit is not None:
            _CACHE.move_to_end((url, name))
    if hit is not None and hit.version == version and hit.study.study_id == info.study_id:
        return hit
    metrics, costs = [m for m, _ in info.objectives], methods_cost or {}
    with engine(url).connect() as conn:
        if hit is None or hit.study.study_id != info.study_id or hit.study.objectives != info.objectives:
            frame, ids = study_trials(conn, info.study_id, metrics, info.pipeline, costs)
        else:
            was_open = hit.trial_ids[hit.frame["state"].isin(OPEN_STATES).to_numpy()]  # as the table holds them
            delta, delta_ids = study_trials(conn, info.study_id, metrics, info.pipeline, costs,
                                            after=int(hit.trial_ids.max(initial=0)), also=was_open.tolist())
            keep = ~np.isin(hit.trial_ids, delta_ids)
            frame, ids = _merged(hit.frame[keep], delta), np.concatenate([hit.trial_ids[keep], delta_ids])
            order = np.argsort(frame["number"].to_numpy(), kind="stable")
            frame, ids = frame.iloc[order].reset_index(drop=True), ids[order]
    table = TrialTable(info, frame, version, ids)
    with _LOCK:
        _CACHE[(url, name)] = table
        while len(_CACHE) > _CACHE_SIZE:
            _CACHE.popitem(last=False)
    return table


def _merged(old: pd.DataFrame, new: pd.DataFrame) -> pd.DataFrame:
    """Rows of both; a parameter column one side lacks is None there (as a trial without the parameter reads)."""
    if new.empty:
        return old.reset_index(drop=True)
    old = old.assign(**{c: np.full(len(old), None, dtype=object) for c in new.columns.difference(old.columns)})
    new = new.assign(**{c: np.full(len(new), None, dtype=object) for c in old.columns.difference(new.columns)})
    rest = [c for c in old.columns if not c.startswith("param:")]
    at = rest.index(next(iter(TRIAL_ATTRS)))  # parameters sit before the user attrs, by name, as a full read orders them
    order = [*rest[:at], *sorted(c for c in old.columns if c.startswith("param:")), *rest[at:]]
    return pd.concat([old[order], new[order]], ignore_index=True)


def cached_trials(url: str, name: str) -> TrialTable | None:
    """The cached table if the study is unchanged since it was read (no trial read)."""
    with _LOCK:
        hit = _CACHE.get((url, name))
    if hit is None or study_version(url, hit.study.study_id) != hit.version:
        return None
    return hit


def clear_cache() -> None:
    """Forget every table and what is known of the stores: the next read starts from nothing."""
    with _LOCK:
        _CACHE.clear()
    with _FOLLOW_LOCK:
        _FOLLOWED.clear()
