"""A new SQLite MLflow store starts as a copy of an empty, migrated schema kept in the cache.

MLflow builds a new SQLite store by replaying every Alembic migration since its first schema: 2.5-4.5 s on
two cores, paid by each new home (each project folder, each test). Done once per MLflow version, kept under
``$PARETOLAB_CACHE/mlflow-schema/``; a store seeded from it is the schema MLflow itself wrote, with no
experiment in it (MLflow adds its Default experiment, with this store's own artifact root, when it opens the copy).
"""

from __future__ import annotations

import logging
import os
import shutil
import sqlite3
from pathlib import Path

from paretolab.errors import ConfigError

log = logging.getLogger(__name__)


def seed_sqlite_store(path: Path) -> bool:
    """Create the MLflow store file ``path`` from the cached empty schema (made first if missing); False if ``path`` exists.

    Call it under ``creating_stores`` of the store's URL: the copy lands by rename, but two creators must not race.
    """
    if path.exists():
        return False
    template = _template()
    path.parent.mkdir(parents=True, exist_ok=True)
    part = path.with_name(f"{path.name}.{os.getpid()}.part")
    try:
        shutil.copyfile(template, part)
        os.replace(part, path)
    except OSError as exc:
        part.unlink(missing_ok=True)  # never left behind: a failed creation leaves the folder as it was
        raise ConfigError(f"cannot create the MLflow store {path} ({exc.strerror or exc}); free some space or point --home / "
                          "--tracking-uri at a folder you can write") from None
    return True


def _template() -> Path:
    import mlflow

    from paretolab.data import cache_dir

    path = cache_dir() / "mlflow-schema" / f"mlflow-{mlflow.__version__}.db"
    if path.is_file():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    part = path.with_name(f"{path.name}.{os.getpid()}.part")
    part.unlink(missing_ok=True)
    log.info("making MLflow %s's empty SQLite schema once (%s)", mlflow.__version__, path)
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

    try:
        store = SqlAlchemyStore(f"sqlite:///{part}", str(path.parent / "unused-artifacts"))  # runs every migration
        store.engine.dispose()
        with sqlite3.connect(part) as conn:  # the schema only: each store gets its own Default experiment on first open
            conn.execute("DELETE FROM experiments")
        os.replace(part, path)  # atomic: a concurrent maker's copy is the same schema
    except Exception as exc:
        part.unlink(missing_ok=True)
        if isinstance(exc, (OSError, sqlite3.Error)) or "disk" in str(exc).lower():
            raise ConfigError(f"cannot make MLflow's empty schema in {path.parent} ({' '.join(str(exc).split())[:160]}); free some space "
                              "or point PARETOLAB_CACHE at a folder you can write") from None
        raise
    return path
