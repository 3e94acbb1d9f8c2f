"""Reading trial results back from MLflow: metrics and tags of every trial run, one run in full.

A database-backed tracking URI (``sqlite:///…``, ``postgresql://…``) is read with SQLAlchemy,
read-only and one query per table for a whole study: ``MlflowClient`` on a SQLite URI creates
and migrates tables when it opens (a write), and pages through runs a thousand at a time. Any
other URI (an MLflow server, a file store) goes through ``MlflowClient``. Artifacts on a local
``file:`` root are read straight from disk.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote, urlparse

import pandas as pd
import sqlalchemy as sa

from paretolab.dashboard.data import engine, store_exists

if TYPE_CHECKING:
    from paretolab.training.curves import Curve

ROLE = "paretolab.role"
TRIAL = "paretolab.trial_number"
DB_SCHEMES = ("sqlite", "postgresql", "mysql", "mssql")


@dataclass
class RunDetail:
    """One trial's MLflow run: what the Trial page shows."""

    run_id: str
    status: str
    metrics: dict[str, float] = field(default_factory=dict)
    params: dict[str, str] = field(default_factory=dict)
    tags: dict[str, str] = field(default_factory=dict)
    artifact_uri: str = ""


def is_database(uri: str) -> bool:
    return uri.split(":", 1)[0].split("+", 1)[0] in DB_SCHEMES


def trial_metrics(uri: str, study: str) -> pd.DataFrame:
    """One row per trial run of ``study``: ``number``, every metric, and the paretolab tags.

    Empty (with a ``number`` column) when the store or the experiment does not exist.
    """
    if is_database(uri):
        rows = _sql_trial_runs(uri, study)
    else:
        rows = _client_trial_runs(uri, study)
    if not rows:
        return pd.DataFrame({"number": pd.Series(dtype=int)})
    frame = pd.DataFrame(rows)
    return frame.sort_values("number").drop_duplicates("number", keep="last").reset_index(drop=True)


def _sql_trial_runs(uri: str, study: str) -> list[dict[str, Any]]:
    if not store_exists(uri):
        return []
    with engine(uri).connect() as conn:
        if not sa.inspect(conn).has_table("runs"):
            return []
        runs = conn.execute(sa.text(
            "SELECT r.run_uuid, r.status FROM runs r JOIN experiments e ON e.experiment_id = r.experiment_id "
            "JOIN tags t ON t.run_uuid = r.run_uuid AND t.key = :role AND t.value = 'trial' "
            "WHERE e.name = :study AND r.lifecycle_stage = 'active'"
        ), {"role": ROLE, "study": study}).all()
        if not runs:
            return []
        scope = (
            "SELECT r.run_uuid FROM runs r JOIN experiments e ON e.experiment_id = r.experiment_id "
            "WHERE e.name = :study AND r.lifecycle_stage = 'active'"
        )
        metrics = conn.execute(sa.text(
            f"SELECT run_uuid, key, value, is_nan FROM latest_metrics WHERE run_uuid IN ({scope})"
        ), {"study": study}).all()
        tags = conn.execute(sa.text(
            f"SELECT run_uuid, key, value FROM tags WHERE key LIKE 'paretolab.%' AND run_uuid IN ({scope})"
        ), {"study": study}).all()
    rows: dict[str, dict[str, Any]] = {run_id: {"run_id": run_id, "run_status": status} for run_id, status in runs}
    for run_id, key, value, is_nan in metrics:
        if run_id in rows:
            rows[run_id][key] = float("nan") if is_nan else value
    for run_id, key, value in tags:
        if run_id in rows:
            rows[run_id][key] = value
    out = []
    for row in rows.values():
        try:
            row["number"] = int(row.pop(TRIAL))
        except (KeyError, ValueError):
            continue
        out.append(row)
    return out


def _client_trial_runs(uri: str, study: str) -> list[dict[str, Any]]:
    client = _client(uri)
    experiment = client.get_experiment_by_name(study)
    if experiment is None:
        return []
    out = []
    token = None
    while True:
        page = client.search_runs([experiment.experiment_id], f"tags.`{ROLE}` = 'trial'", max_results=1000, page_token=token)
        for run in page:
            tags = {k: v for k, v in run.data.tags.items() if k.startswith("paretolab.")}
            if TRIAL not in tags:
                continue
            row: dict[str, Any] = {"run_id": run.info.run_id, "run_status": run.info.status, **run.data.metrics, **tags}
            row["number"] = int(row.pop(TRIAL))
            out.append(row)
        token = page.token
        if not token:
            return out


def run_detail(uri: str, run_id: str) -> RunDetail | None:
    """Metrics, params and tags of one run; None if the run is not in the store."""
    if not run_id:
        return None
    if not is_database(uri):
        client = _client(uri)
        try:
            run = client.get_run(run_id)
        except Exception:
            return None
        return RunDetail(run_id, run.info.status, dict(run.data.metrics), dict(run.data.params), dict(run.data.tags), run.info.artifact_uri)
    if not store_exists(uri):
        return None
    with engine(uri).connect() as conn:
        head = conn.execute(sa.text("SELECT status, artifact_uri FROM runs WHERE run_uuid = :r"), {"r": run_id}).one_or_none()
        if head is None:
            return None
        metrics = conn.execute(sa.text("SELECT key, value, is_nan FROM latest_metrics WHERE run_uuid = :r"), {"r": run_id}).all()
        params = conn.execute(sa.text("SELECT key, value FROM params WHERE run_uuid = :r"), {"r": run_id}).all()
        tags = conn.execute(sa.text("SELECT key, value FROM tags WHERE run_uuid = :r"), {"r": run_id}).all()
    return RunDetail(
        run_id=run_id,
        status=str(head[0]),
        metrics={k: float("nan") if nan else float(v) for k, v, nan in metrics},
        params=dict(params),  # type: ignore[arg-type]
        tags=dict(tags),  # type: ignore[arg-type]
        artifact_uri=str(head[1] or ""),
    )


def list_artifacts(uri: str, detail: RunDetail) -> list[str]:
    """Relative paths of the run's artifacts (files only)."""
    local = _local_dir(detail.artifact_uri)
    if local is not None:
        if not local.is_dir():
            return []
        return sorted(str(p.relative_to(local)) for p in local.rglob("*") if p.is_file())
    client = _client(uri)

    def walk(path: str | None) -> list[str]:
        out = []
        for item in client.list_artifacts(detail.run_id, path):
            out.extend(walk(item.path) if item.is_dir else [item.path])
        return out

    try:
        return sorted(walk(None))
    except Exception:
        return []


def read_artifact(uri: str, detail: RunDetail, path: str) -> bytes:
    """The bytes of one artifact."""
    local = _local_dir(detail.artifact_uri)
    if local is not None:
        target = (local / path).resolve()
        if local.resolve() not in target.parents:
            raise ValueError(f"artifact path {path!r} leaves the run's artifact folder")
        return target.read_bytes()
    import tempfile

    client = _client(uri)
    with tempfile.TemporaryDirectory() as tmp:
        return Path(client.download_artifacts(detail.run_id, path, tmp)).read_bytes()


def metric_histories(uri: str, run_id: str, keys: tuple[str, ...]) -> dict[str, list[tuple[int, float]]]:
    """Every logged (step, value) of ``keys`` in one run, by step: one read-only query on a database store."""
    if not is_database(uri):
        client = _client(uri)
        return {key: [(m.step, m.value) for m in client.get_metric_history(run_id, key)] for key in keys}
    if not store_exists(uri):
        return {}
    with engine(uri).connect() as conn:
        rows = conn.execute(sa.text(
            "SELECT key, step, value, is_nan FROM metrics WHERE run_uuid = :r AND key IN :keys ORDER BY step, timestamp"
        ).bindparams(sa.bindparam("keys", expanding=True)), {"r": run_id, "keys": list(keys)}).all()
    out: dict[str, list[tuple[int, float]]] = {}
    for key, step, value, is_nan in rows:
        if not is_nan:
            out.setdefault(key, []).append((int(step), float(value)))
    return out


def learning_curve(uri: str, run_id: str) -> Curve | None:
    """A trial's learning curve: its ``learning_curve.json`` artifact, else its ``curve.*`` metric histories, else None."""
    from paretolab.training.curves import (  # the package imports torch: only when a curve is read
        ARTIFACT,
        HISTORIES,
        read_curve,
    )

    detail = run_detail(uri, run_id)
    if detail is None:
        return None
    return read_curve(lambda: read_artifact(uri, detail, ARTIFACT), lambda: metric_histories(uri, run_id, HISTORIES))


def _local_dir(artifact_uri: str) -> Path | None:
    if artifact_uri.startswith("file:"):
        return Path(unquote(urlparse(artifact_uri).path))
    if artifact_uri and "://" not in artifact_uri:
        return Path(artifact_uri)
    return None


def _client(uri: str) -> Any:
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=uri)


_RUNS_CACHE: dict[tuple[str, str], tuple[tuple[Any, ...], pd.DataFrame]] = {}


def trial_metrics_cached(uri: str, study: str, version: tuple[Any, ...]) -> pd.DataFrame:
    """``trial_metrics`` kept until the study's Optuna version changes (the driver logs to MLflow first)."""
    hit = _RUNS_CACHE.get((uri, study))
    if hit is not None and hit[0] == version:
        return hit[1]
    frame = trial_metrics(uri, study)
    _RUNS_CACHE[(uri, study)] = (version, frame)
    return frame
