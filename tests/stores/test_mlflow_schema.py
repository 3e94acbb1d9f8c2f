"""A new SQLite MLflow store is a copy of the cached empty schema: MLflow's migrations run once per cache, not per home."""

from __future__ import annotations

import sqlite3

import mlflow.store.db.utils as mlflow_db

from paretolab.stores import resolve_stores
from paretolab.stores.tracking import Tracker


def _schema(path) -> tuple[dict, list]:
    """Each table's columns and indexes, and the Alembic version (the CREATE text itself lists CHECKs in a varying order)."""
    with sqlite3.connect(path) as conn:
        tables = [row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")]
        shape = {t: (conn.execute(f'PRAGMA table_info("{t}")').fetchall(), sorted(row[1:] for row in conn.execute(f'PRAGMA index_list("{t}")')))
                 for t in tables}
        return shape, conn.execute("SELECT version_num FROM alembic_version").fetchall()


def test_new_stores_copy_the_migrated_schema_once_and_keep_their_own_default_experiment(tmp_path, monkeypatch):
    monkeypatch.setenv("PARETOLAB_CACHE", str(tmp_path / "cache"))
    migrations = []
    real = mlflow_db._initialize_tables
    monkeypatch.setattr(mlflow_db, "_initialize_tables", lambda engine: (migrations.append(engine.url), real(engine))[1])
    trackers = []
    for home in ("a", "b", "c"):
        monkeypatch.chdir(tmp_path)
        trackers.append(Tracker(resolve_stores(home=str(tmp_path / home)), f"study-{home}"))
    assert len(migrations) == 1 and "mlflow-schema" in str(migrations[0])  # the cached schema, once; never a home's store

    monkeypatch.setattr(mlflow_db, "_initialize_tables", real)
    from mlflow.tracking import MlflowClient

    MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'plain.db'}").search_experiments()  # a store MLflow makes itself
    assert _schema(tmp_path / "b" / "mlflow.db") == _schema(tmp_path / "plain.db")
    for home, tracker in zip("abc", trackers):
        default = tracker.client.get_experiment("0")
        assert default.name == "Default" and default.artifact_location == str(tmp_path / "mlruns" / "0")  # as MLflow sets it
        assert [e.name for e in tracker.client.search_experiments()] == [f"study-{home}", "Default"]
        run = tracker.client.create_run(tracker.experiment_id)
        tracker.client.log_metric(run.info.run_id, "ppl", 12.5)
        assert tracker.client.get_run(run.info.run_id).data.metrics == {"ppl": 12.5}
