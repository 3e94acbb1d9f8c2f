"""A trial's MLflow run read straight from a SQLite tracking store with the standard library: its latest metrics
and its artifacts on a local ``file:`` root. Read only (the file is opened ``mode=ro``), and no MLflow import: the
client costs seconds to import and, on a SQLite URI, checks the schema's migrations when it opens.

Answers ``None`` where it cannot answer (not a SQLite file, another schema, an artifact root that is not a local
folder): the caller then asks ``MlflowClient``. The tables read are MLflow's own (``runs.artifact_uri``,
``latest_metrics (run_uuid, key, value, is_nan)``).
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from urllib.parse import unquote, urlparse

SQLITE_PREFIX = "sqlite:///"


def database_file(tracking_uri: str) -> Path | None:
    """The file behind a plain ``sqlite:///path`` tracking URI (no query string), else None."""
    if not tracking_uri.startswith(SQLITE_PREFIX) or "?" in tracking_uri:
        return None
    path = Path(tracking_uri[len(SQLITE_PREFIX):]).expanduser()
    if not tracking_uri[len(SQLITE_PREFIX):].startswith("/"):
        path = Path.cwd() / path
    return path if path.is_file() else None


def _query(path: Path, sql: str, args: tuple[str, ...]) -> list[tuple] | None:
    try:
        with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as conn:
            return conn.execute(sql, args).fetchall()
    except sqlite3.Error:  # locked, damaged, or not MLflow's schema: the client says what is wrong
        return None


def run_metrics(tracking_uri: str, run_id: str) -> dict[str, float] | None:
    """The run's latest value of every metric (NaN where MLflow stored one), or None when not answerable here."""
    path = database_file(tracking_uri)
    if path is None:
        return None
    rows = _query(path, "SELECT key, value, is_nan FROM latest_metrics WHERE run_uuid = ?", (run_id,))
    if rows is None:
        return None
    return {key: float("nan") if is_nan else float(value) for key, value, is_nan in rows}


def artifact_dir(tracking_uri: str, run_id: str) -> Path | None:
    """The local folder of the run's artifacts, or None (not SQLite, no such run, or a remote artifact root)."""
    path = database_file(tracking_uri)
    rows = _query(path, "SELECT artifact_uri FROM runs WHERE run_uuid = ?", (run_id,)) if path is not None else None
    if not rows or not rows[0][0]:
        return None
    uri = str(rows[0][0])
    if uri.startswith("file:"):
        return Path(unquote(urlparse(uri).path))
    return Path(uri) if "://" not in uri else None
