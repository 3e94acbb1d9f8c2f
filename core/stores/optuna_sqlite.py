"""A study's complete trials read straight from a SQLite Optuna store with the standard library, read only.

``paretolab frontier`` needs a study's attributes and its complete trials' values, params and user attributes:
``optuna.load_study`` imports Optuna, SQLAlchemy and Alembic (about half a second of CPU) and checks the schema's
version before it reads a row. The tables read are Optuna's own (``optuna/storages/_rdb/models.py``): ``studies``,
``study_directions``, ``study_user_attributes``, ``trials``, ``trial_values``, ``trial_params`` (the internal float
and the distribution's JSON) and ``trial_user_attributes``.

Answers ``None`` wherever it cannot answer exactly (not a SQLite file, no such study, a schema or a distribution it
does not know): the caller then asks Optuna, which also words the errors.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import math
import re
import sqlite3
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SQLITE_PREFIX = "sqlite:///"
FLOATS = ("FloatDistribution", "UniformDistribution", "LogUniformDistribution", "DiscreteUniformDistribution")
INTS = ("IntDistribution", "IntUniformDistribution", "IntLogUniformDistribution")


@dataclass(frozen=True)
class StoredTrial:
    """What a reader of complete trials uses of Optuna's ``FrozenTrial``."""

    number: int
    values: list[float]
    params: dict[str, Any] = field(default_factory=dict)
    user_attrs: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class StoredStudy:
    name: str
    user_attrs: dict[str, Any]
    directions: list[str]  # "minimize" / "maximize", one per objective
    complete: list[StoredTrial]


def database_file(url: str) -> Path | None:
    """The file behind a plain ``sqlite:///path`` URL (no query string), when it exists."""
    if not url.startswith(SQLITE_PREFIX) or "?" in url:
        return None
    path = Path(url[len(SQLITE_PREFIX):]).expanduser()
    return path if path.is_file() else None


def read_study(url: str, name: str) -> StoredStudy | None:
    """Study ``name`` with its complete trials (by trial number), or None when this reader cannot answer exactly."""
    path = database_file(url)
    if path is None:
        return None
    try:
        with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as conn:
            return _read(conn, name)
    except (sqlite3.Error, ValueError, KeyError, IndexError, TypeError):  # locked, another schema, an unknown encoding
        return None


def _read(conn: sqlite3.Connection, name: str) -> StoredStudy | None:
    if [row[0] for row in conn.execute("SELECT version_num FROM alembic_version")] != [_schema_head()]:
        return None  # an older or newer schema than the installed Optuna's: Optuna reads it, or words why it cannot
    found = conn.execute("SELECT study_id FROM studies WHERE study_name = ?", (name,)).fetchall()
    if len(found) != 1:
        return None
    (sid,) = found[0]
    attrs = {k: json.loads(v) for k, v in conn.execute("SELECT key, value_json FROM study_user_attributes WHERE study_id = ?", (sid,))}
    directions = [str(d).lower() for (d,) in conn.execute("SELECT direction FROM study_directions WHERE study_id = ? ORDER BY objective", (sid,))]
    complete = "SELECT trial_id FROM trials WHERE study_id = ? AND state = 'COMPLETE'"
    numbers = dict(conn.execute("SELECT trial_id, number FROM trials WHERE study_id = ? AND state = 'COMPLETE'", (sid,)).fetchall())
    values: dict[int, dict[int, float]] = {}
    for tid, objective, value, kind in conn.execute(f"SELECT trial_id, objective, value, value_type FROM trial_values WHERE trial_id IN ({complete})", (sid,)):
        values.setdefault(tid, {})[objective] = _value(value, kind)
    params: dict[int, dict[str, Any]] = {}
    for tid, pname, internal, dist in conn.execute(
            f"SELECT trial_id, param_name, param_value, distribution_json FROM trial_params WHERE trial_id IN ({complete}) ORDER BY param_id", (sid,)):
        params.setdefault(tid, {})[pname] = _external(float(internal), json.loads(dist))
    user: dict[int, dict[str, Any]] = {}
    for tid, key, value in conn.execute(f"SELECT trial_id, key, value_json FROM trial_user_attributes WHERE trial_id IN ({complete})", (sid,)):
        user.setdefault(tid, {})[key] = json.loads(value)
    trials = [StoredTrial(numbers[t], [values.get(t, {})[i] for i in range(len(directions))], params.get(t, {}), user.get(t, {}))
              for t in sorted(numbers, key=numbers.__getitem__)]
    return StoredStudy(name, attrs, directions, trials)


@functools.lru_cache(maxsize=1)
def _schema_head() -> str | None:
    """The installed Optuna's newest schema revision, read from its Alembic scripts' text (Optuna is not imported)."""
    spec = importlib.util.find_spec("optuna")
    if spec is None or not spec.submodule_search_locations:
        return None
    versions = Path(next(iter(spec.submodule_search_locations))) / "storages" / "_rdb" / "alembic" / "versions"
    revisions, parents = set(), set()
    for script in versions.glob("*.py"):
        text = script.read_text(encoding="utf-8")
        revisions.update(re.findall(r'^revision\s*=\s*["\']([^"\']+)', text, re.M))
        parents.update(re.findall(r'^down_revision\s*=\s*["\']([^"\']+)', text, re.M))
    heads = revisions - parents
    return next(iter(heads)) if len(heads) == 1 else None


def _value(value: float | None, kind: str) -> float:
    if kind == "INF_POS":
        return math.inf
    if kind == "INF_NEG":
        return -math.inf
    return float(value) if value is not None else math.nan


def _external(internal: float, dist: dict[str, Any]) -> Any:
    """A parameter's value as Optuna hands it out: a categorical's choice, an int, or the float itself."""
    kind = dist["name"]
    if kind == "CategoricalDistribution":
        return dist["attributes"]["choices"][int(internal)]
    if kind in INTS:
        return int(internal)
    if kind in FLOATS:
        return internal
    raise ValueError(f"unknown distribution {kind!r}")
