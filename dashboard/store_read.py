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
from concurrent.futures import ThreadPoolExecutor
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import sqlalchemy as sa

from paretolab.study.constraints import FEASIBLE, REASON, reason_text
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
    low, high, count = fetch(conn, f"SELECT MIN(trial_id), MAX(trial_id), COUNT(*) FROM trials WHERE {where}")[0]
    of_study = f"trial_id IN (SELECT trial_id FROM trials WHERE {where})"
    if count and int(high) - int(low) + 1 == int(count):  # one run of ids (one driver at a time): a range, no subquery
        of_study = f"trial_id BETWEEN {int(low)} AND {int(high)}"
    kind = "CASE WHEN value IS NOT NULL THEN 0 WHEN value_type = 'INF_POS' THEN 1 WHEN value_type = 'INF_NEG' THEN 2 ELSE 0 END"
    keys = ", ".join(literal(conn, k) for k in TRIAL_ATTRS)
    with ThreadPoolExecutor(2) as others:  # values and params on connections of their own while the trials are read here
        values = others.submit(_on_a_connection_of_its_own, conn, read_columns, "trial_values", of_study,
                               [("trial_id", INT), ("objective", INT), ("value", FLOAT), (kind, INT)])
        params = others.submit(_on_a_connection_of_its_own, conn, _param_rows, of_study)
        ids, number, state, complete = read_columns(  # no start time: no page shows it
            conn, "trials", where, [("trial_id", INT), ("number", INT), ("state", TEXT), ("datetime_complete", STAMP)])
        attrs = fetch(conn, f"SELECT trial_id, key, value_json FROM trial_user_attributes WHERE {of_study} AND key IN ({keys})")
        order = np.argsort(number, kind="stable")
        ids = ids[order]
        id_order = np.argsort(ids)

        def rows_of(trial_ids: np.ndarray) -> np.ndarray:
            """Row (after sorting by number) of each trial id."""
            return id_order[np.searchsorted(ids, trial_ids.astype(np.int64), sorter=id_order)]

        n = len(ids)
        columns: dict[str, Any] = {
            "number": number[order],
            "state": state_names(state[order]),
            "datetime_complete": _datetimes(complete[order]),
        }
        columns.update(_objective_columns(values.result(), metrics, n, rows_of))
        columns.update(sorted(_param_columns(*params.result(), n, rows_of).items()))  # by name, as a merged table orders them
    columns.update(_attr_columns(attrs, n, rows_of))
    frame = pd.DataFrame(columns)
    frame["methods"], frame["simulated"] = trial_methods(frame, pipeline, methods_cost)
    return frame, ids


INT, FLOAT, TEXT, STAMP = "int", "float", "text", "stamp"  # STAMP: a text in which '' is read as missing
AGGREGATED = ("sqlite",)  # dialects whose columns are read as one aggregated string each (see read_columns)
_SEP = "\x1f"  # between the texts of one aggregated column (ASCII unit separator: in no state, name or timestamp)


def read_columns(conn: sa.Connection, table: str, where: str, columns: Sequence[tuple[str, str]]) -> list[np.ndarray]:
    """``SELECT <columns> FROM <table> WHERE <where>`` as one numpy array per column (INT: int64, FLOAT: float64 with
    NaN for NULL, TEXT: object, None for NULL).

    On SQLite each column comes back as one aggregated string that numpy parses in C (``group_concat``: every
    aggregate of one query walks the rows in the same order), so no Python object is made per row and value;
    floats are written with 17 significant digits, which read back exactly. Other databases fetch rows.
    """
    if conn.dialect.name not in AGGREGATED:
        rows = fetch(conn, f"SELECT {', '.join(expr for expr, _ in columns)} FROM {table} WHERE {where}")
        return [_typed(column, kind) for column, (_, kind) in zip(_columns(rows, len(columns)), columns)]
    texts = ", ".join(_aggregate(expr, kind) for expr, kind in columns)
    count, *joined = fetch(conn, f"SELECT COUNT(*), {texts} FROM {table} WHERE {where}")[0]
    out = [_parsed(text or "", kind) if count else _typed(np.array([], dtype=object), kind) for text, (_, kind) in zip(joined, columns)]
    if any(len(column) != count for column in out):  # a separator inside a text would shift every later row
        raise ValueError(f"{table}: a column did not split into its {count} rows ({[len(c) for c in out]})")
    return out


def _aggregate(expr: str, kind: str) -> str:
    if kind == INT:
        return f"group_concat(({expr}), ',')"  # a NULL would be left out: only for columns that are never NULL
    if kind == FLOAT:
        # a whole number (a size, a categorical's index) as an integer: exact, shorter to write and to parse
        return (f"group_concat(CASE WHEN ({expr}) IS NULL THEN 'nan' WHEN ({expr}) = CAST(({expr}) AS INTEGER) "
                f"THEN CAST(({expr}) AS INTEGER) ELSE printf('%!.17g', ({expr})) END, ',')")
    if kind == STAMP:
        return f"group_concat(COALESCE(({expr}), ''), char(31))"
    return f"group_concat(COALESCE(({expr}) || 'x', ''), char(31))"  # 'x' marks a value: '' alone is NULL


def _parsed(text: str, kind: str) -> np.ndarray:
    if kind == INT:
        return np.fromstring(text, sep=",", dtype=np.int64)
    if kind == FLOAT:
        return np.fromstring(text, sep=",", dtype=np.float64)
    column = np.empty(text.count(_SEP) + 1, dtype=object)
    column[:] = text.split(_SEP) if kind == STAMP else [part[:-1] if part else None for part in text.split(_SEP)]
    return column


def _typed(column: np.ndarray, kind: str) -> np.ndarray:
    if kind == INT:
        return column.astype(np.int64)
    if kind == FLOAT:
        return column.astype(np.float64)  # None -> NaN
    return column


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


def _objective_columns(values: list[np.ndarray], metrics: Sequence[str], n: int, rows_of: Any) -> dict[str, np.ndarray]:
    """One column per objective; ``values`` are trial_id, objective, value (NaN for NULL) and its kind (1: +inf,
    2: -inf, as Optuna stores an infinite value: NULL with its kind)."""
    ids, objective, number, kind = values
    out = {metric: np.full(n, np.nan) for metric in metrics}
    number = number.copy()
    number[kind == 1] = np.inf
    number[kind == 2] = -np.inf
    rows = rows_of(ids)
    for i, metric in enumerate(metrics):
        mine = objective == i
        out[metric][rows[mine]] = number[mine]
    return out


def _on_a_connection_of_its_own(conn: sa.Connection, read: Any, *args: Any) -> Any:
    """``read(connection, *args)`` on a second connection to the same database: the database works without the
    GIL, so a read there overlaps the parsing of another (measured: ~0.2 s of ~1 s at 100k trials). Only stores on
    disk or on a server get here: an in-memory SQLite URL opens an empty database of its own and lists no study."""
    with conn.engine.connect() as own:
        return read(own, *args)


def _param_rows(conn: sa.Connection, of_study: str) -> tuple[list[tuple[str, str]], list[np.ndarray]]:
    """The study's parameter names, each with one of its distributions, and the rows: trial_id, the stored (internal)
    value and the number of the row's name. The names come from the index; Optuna refuses, within a study, a
    parameter whose distribution changes kind or categorical choices, so any of a name's distributions converts
    all of its values."""
    names = [name for (name,) in fetch(conn, f"SELECT DISTINCT param_name FROM trial_params WHERE {of_study}")]
    if not names:
        return [], []
    pairs = [(name, fetch(conn, f"SELECT distribution_json FROM trial_params WHERE param_name = {literal(conn, name)} "
                                f"AND {of_study} LIMIT 1")[0][0]) for name in names]
    code = " ".join(f"WHEN param_name = {literal(conn, name)} THEN {i}" for i, name in enumerate(names))
    return pairs, read_columns(conn, "trial_params", of_study, [("trial_id", INT), ("param_value", FLOAT), (f"CASE {code} END", INT)])


def _param_columns(pairs: list[tuple[str, str]], rows: list[np.ndarray], n: int, rows_of: Any) -> dict[str, np.ndarray]:
    """``param:<name>`` per parameter, as the trial saw it; object dtype keeps a categorical int an int next to
    trials that lack the parameter (None there, no NaN upcast). One conversion per name."""
    if not pairs:
        return {}
    ids, internal, groups = rows
    at = rows_of(ids)
    out: dict[str, np.ndarray] = {}
    for i, (name, dist_json) in enumerate(pairs):
        mine = groups == i
        column = out.setdefault(f"param:{name}", np.full(n, None, dtype=object))
        column[at[mine]] = _external_many(str(dist_json), internal[mine])
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
    out[REASON] = np.array([reason_text(v) if v else v for v in out[REASON]], dtype=object)  # older code's e-notation, in the metric's unit
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
