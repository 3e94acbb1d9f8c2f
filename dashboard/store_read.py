"""Optuna's RDB tables read straight into columns, read-only: no ``RDBStorage``, no ``FrozenTrial``, no ORM rows.

The schema is Optuna's (``optuna/storages/_rdb/models.py``): ``trials`` (trial_id, number, study_id,
state, datetime_start, datetime_complete), ``trial_values`` (trial_id, objective, value, value_type),
``trial_params`` (trial_id, param_name, param_value: the internal float, distribution_json) and
``trial_user_attributes`` (trial_id, key, value_json). ``study.get_trials`` builds a ``FrozenTrial``
per trial (seconds for 10,000 trials) and opening ``RDBStorage`` would create or migrate tables (a
write), so the dashboard issues one query per table for a whole study, or for a few of its trials
(a repaint reads only the new ones and those still running, see ``data.py``), fetched through the
DB-API cursor (SQLAlchemy's Row objects cost more than the query) and turned into columns with numpy:
no Python loop runs once per trial.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import sqlalchemy as sa

from paretolab.study.constraints import FEASIBLE, REASON
from paretolab.study.optuna_study import PRUNED_AT

NONE_METHOD = "none"
OPEN_STATES = ("RUNNING", "WAITING")  # a trial in these states can still change; every other state is final in Optuna
TRIAL_ATTRS = {"mlflow_run_id": "", "fail_reason": "", FEASIBLE: True, REASON: "", PRUNED_AT: None}  # user attr -> value when absent


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


def fetch(conn: sa.Connection, sql: str) -> list[tuple[Any, ...]]:
    """Rows as plain tuples from the DB-API cursor. Every value put into ``sql`` is an integer of ours or a
    literal rendered by :func:`literal`, so the SQL carries no parameters (their styles differ between drivers)."""
    cursor = conn.connection.cursor()
    try:
        cursor.execute(sql)
        return list(cursor.fetchall())
    finally:
        cursor.close()


def literal(conn: sa.Connection, value: str) -> str:
    """``value`` as a quoted SQL string literal of the connection's dialect."""
    return str(sa.literal(value, sa.String()).compile(dialect=conn.dialect, compile_kwargs={"literal_binds": True}))


def state_names(values: Sequence[Any]) -> np.ndarray:
    """Enum columns come back as names ('COMPLETE') or, on some backends, as enum members: names, upper case."""
    codes, uniques = pd.factorize(pd.Series(values, dtype=object), use_na_sentinel=False)
    return np.array([state_name(u) for u in uniques], dtype=object)[codes] if len(codes) else np.array([], dtype=object)


def state_name(value: Any) -> str:
    return str(getattr(value, "name", value)).upper()


def study_trials(conn: sa.Connection, study_id: int, metrics: Sequence[str], pipeline: dict[str, Any], methods_cost: dict[str, str],
                 *, after: int | None = None, also: Sequence[int] = ()) -> tuple[pd.DataFrame, np.ndarray]:
    """The trials of study ``study_id`` as a frame sorted by number, and their trial ids (row for row).

    All of them, or with ``after`` only those whose trial_id is above it plus the trial ids in ``also``.
    Columns: see ``data.TrialTable``.
    """
    where = f"study_id = {int(study_id)}"
    if after is not None:
        picked = f"trial_id > {int(after)}" + (f" OR trial_id IN ({', '.join(str(int(i)) for i in also)})" if len(also) else "")
        where = f"{where} AND ({picked})"
    of_study = f"trial_id IN (SELECT trial_id FROM trials WHERE {where})"
    trials = fetch(conn, f"SELECT trial_id, number, state, datetime_start, datetime_complete FROM trials WHERE {where}")
    values = fetch(conn, f"SELECT trial_id, objective, value, value_type FROM trial_values WHERE {of_study}")
    params = fetch(conn, f"SELECT trial_id, param_name, param_value, distribution_json FROM trial_params WHERE {of_study}")
    keys = ", ".join(literal(conn, k) for k in TRIAL_ATTRS)
    attrs = fetch(conn, f"SELECT trial_id, key, value_json FROM trial_user_attributes WHERE {of_study} AND key IN ({keys})")

    ids, number, state, start, complete = _columns(trials, 5)
    order = np.argsort(number.astype(np.int64), kind="stable")
    ids = ids.astype(np.int64)[order]
    id_order = np.argsort(ids)

    def rows_of(trial_ids: np.ndarray) -> np.ndarray:
        """Row (after sorting by number) of each trial id."""
        return id_order[np.searchsorted(ids, trial_ids.astype(np.int64), sorter=id_order)]

    n = len(ids)
    columns: dict[str, Any] = {
        "number": number.astype(np.int64)[order],
        "state": state_names(state[order]),
        "datetime_start": _datetimes(start[order]),
        "datetime_complete": _datetimes(complete[order]),
    }
    columns.update(_objective_columns(values, metrics, n, rows_of))
    columns.update(sorted(_param_columns(params, n, rows_of).items()))  # by name, as a merged table orders them
    columns.update(_attr_columns(attrs, n, rows_of))
    frame = pd.DataFrame(columns)
    frame["methods"], frame["simulated"] = trial_methods(frame, pipeline, methods_cost)
    return frame, ids


def _columns(rows: list[tuple[Any, ...]], width: int) -> list[np.ndarray]:
    """The rows' columns as object arrays (numpy reads the tuples in one C pass)."""
    if not rows:
        return [np.array([], dtype=object) for _ in range(width)]
    table = np.empty((len(rows), width), dtype=object)
    table[:] = rows
    return [table[:, i] for i in range(width)]


def combinations(columns: Sequence[np.ndarray]) -> tuple[np.ndarray, list[tuple[Any, ...]]]:
    """Codes of each row's combination of values across ``columns`` (None is a value too), and the combinations."""
    code = np.zeros(len(columns[0]) if columns else 0, dtype=np.int64)
    for column in columns:
        c, uniques = pd.factorize(pd.Series(column, dtype=object), use_na_sentinel=False)
        code = code * max(len(uniques), 1) + c
    _, first, codes = np.unique(code, return_index=True, return_inverse=True)
    return codes.reshape(-1), [tuple(column[i] for column in columns) for i in first]


def _datetimes(values: np.ndarray) -> pd.Series:
    """SQLite keeps datetimes as ISO text, other backends hand back datetime objects: one vectorised parse either way."""
    return pd.Series(pd.to_datetime(values, format="ISO8601") if len(values) else pd.to_datetime(values))


def _objective_columns(values: list[tuple[Any, ...]], metrics: Sequence[str], n: int, rows_of: Any) -> dict[str, np.ndarray]:
    out = {metric: np.full(n, np.nan) for metric in metrics}
    if not values:
        return out
    ids, objective, value, kind = _columns(values, 4)
    rows, objective = rows_of(ids), objective.astype(np.int64)
    number = value.astype(float)  # None (an infinite value is stored as NULL with its kind) -> NaN
    kinds = state_names(kind)
    number[kinds == "INF_POS"] = np.inf
    number[kinds == "INF_NEG"] = -np.inf
    for i, metric in enumerate(metrics):
        mine = objective == i
        out[metric][rows[mine]] = number[mine]
    return out


def _param_columns(params: list[tuple[Any, ...]], n: int, rows_of: Any) -> dict[str, np.ndarray]:
    """``param:<name>`` per parameter, as the trial saw it; object dtype keeps a categorical int an int next to
    trials that lack the parameter (None there, no NaN upcast). One conversion per (name, distribution)."""
    out: dict[str, np.ndarray] = {}
    if not params:
        return out
    ids, names, internal, dists = _columns(params, 4)
    rows, internal = rows_of(ids), internal.astype(float)
    groups, pairs = combinations([names, dists])
    for code, (name, dist_json) in enumerate(pairs):
        mine = groups == code
        column = out.setdefault(f"param:{name}", np.full(n, None, dtype=object))
        column[rows[mine]] = _external_many(str(dist_json), internal[mine])
    return out


def _attr_columns(attrs: list[tuple[Any, ...]], n: int, rows_of: Any) -> dict[str, np.ndarray]:
    """The user attrs the dashboard shows (``TRIAL_ATTRS``, their default where absent) and ``feasible``:
    False only for an explicit ``feasible: false`` verdict (no verdict: feasible)."""
    out = {key: np.full(n, default, dtype=object) for key, default in TRIAL_ATTRS.items()}
    if attrs:
        ids, keys, values = _columns(attrs, 3)
        rows = rows_of(ids)
        for key, column in out.items():
            mine = keys == key
            if mine.any():  # one JSON parse per key: the values joined into one array
                parsed = np.empty(int(mine.sum()), dtype=object)
                parsed[:] = json.loads("[" + ",".join(values[mine]) + "]")
                column[rows[mine]] = parsed
    out[FEASIBLE] = np.array([v is not False for v in out[FEASIBLE]], dtype=bool) if n else np.array([], dtype=bool)
    return out


def _external_many(dist_json: str, internal: np.ndarray) -> np.ndarray:
    """Optuna's stored (internal) parameter values -> the values the trial saw, for one distribution."""
    from optuna.distributions import CategoricalDistribution, IntDistribution

    dist = _distribution(dist_json)
    if isinstance(dist, CategoricalDistribution):
        choices = np.empty(len(dist.choices) + 1, dtype=object)
        choices[:] = [*dist.choices, None]
        index = internal.astype(int)
        return choices[np.where((index >= 0) & (index < len(dist.choices)), index, len(dist.choices))]
    if isinstance(dist, IntDistribution):
        return np.rint(internal).astype(np.int64).astype(object)
    return internal.astype(object)


@lru_cache(maxsize=4096)
def _distribution(dist_json: str) -> Any:
    from optuna.distributions import json_to_distribution

    return json_to_distribution(dist_json)


def trial_methods(frame: pd.DataFrame, pipeline: dict[str, Any], methods_cost: dict[str, str]) -> tuple[np.ndarray, np.ndarray]:
    """Each trial's method combination (``none`` when the model is left as is) and its simulated methods.

    Fixed stages come from the pipeline, chosen ones from the ``stageN.method`` parameters; the label is
    worked out once per distinct combination of choices, not once per trial.
    """
    n = len(frame)
    stages: list[np.ndarray | str] = []
    for index, stage in enumerate(pipeline.get("stages") or []):
        if not isinstance(stage, dict):
            continue
        stage_id = str(stage.get("id", f"stage{index}"))
        if "choice" in stage:
            column = frame.get(f"param:{stage_id}.method")
            stages.append(np.full(n, None, dtype=object) if column is None else column.to_numpy(dtype=object))
        elif "method" in stage:
            stages.append(str(stage["method"]))
    chosen = [s for s in stages if not isinstance(s, str)]
    codes, combos = combinations(chosen) if chosen else (np.zeros(n, dtype=np.int64), [()])
    labels, simulated = [], []
    for combo in combos:
        picks = iter(combo)
        methods = [s if isinstance(s, str) else next(picks) for s in stages]
        real = [m for m in methods if isinstance(m, str) and m != NONE_METHOD]
        labels.append("+".join(real) if real else NONE_METHOD)
        simulated.append(",".join(m for m in real if methods_cost.get(m) == "simulated"))
    return np.array(labels, dtype=object)[codes], np.array(simulated, dtype=object)[codes]
