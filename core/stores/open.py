"""Opening the stores: created (one process at a time) by `run`, only read by everything else.

Every failure a user can meet here (an unwritable folder, a file that is not a database, a
schema from an older Optuna or MLflow, a PostgreSQL that does not answer) becomes one ConfigError
line that names the store, with any password redacted, and says what to do.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from paretolab.errors import ConfigError, ParetolabError
from paretolab.stores import Stores, redact
from paretolab.stores.ownership import creating_stores

T = TypeVar("T")


def sqlite_file(url: str) -> Path | None:
    """The file behind a ``sqlite:///`` URL, else None."""
    if url.startswith("sqlite:///") and "?" not in url and "%" not in url:  # the usual store: no SQLAlchemy import (`frontier`)
        return Path(url[len("sqlite:///"):]).expanduser()
    from sqlalchemy.engine import make_url

    try:
        parsed = make_url(url)
    except Exception:  # noqa: BLE001 - not a SQLAlchemy URL (e.g. an MLflow http:// server)
        return None
    if parsed.get_backend_name() != "sqlite" or not parsed.database or parsed.database == ":memory:":
        return None
    return Path(parsed.database).expanduser()


def exists(url: str) -> bool:
    """False only for a SQLite store whose file is not there yet (a server store is assumed to exist)."""
    path = sqlite_file(url)
    return path is None or path.exists()


def optuna_storage(stores: Stores, *, create: bool) -> Any:
    """Optuna's RDBStorage on ``stores``; ``create=False`` never writes a schema (read-only commands)."""
    import optuna

    url = stores.optuna_url
    if create:
        with guarded("Optuna", url, lambda: creating_stores(url)):
            return guarded("Optuna", url, lambda: optuna.storages.RDBStorage(url, heartbeat_interval=None))
    if not exists(url):
        raise ConfigError(f"no Optuna store at {sqlite_file(url)}: no study has run with these stores yet "
                          "(check --home / --storage, or run a pipeline first)")
    check_readable(stores)
    return guarded("Optuna", url, lambda: optuna.storages.RDBStorage(url, skip_table_creation=True))


def check_readable(stores: Stores) -> None:
    """Refuse, in one line naming the file and the fix, a SQLite store that a read would have to create, migrate or
    trip over: empty, not SQLite, damaged, locked, missing its tables, or holding a complete trial without values.

    Read paths call it before any Optuna or MLflow code touches the file (both would create a schema in an empty one).
    A server store is left to its driver's errors (``guarded``).
    """
    from paretolab.stores.store_check import sqlite_problem

    for what, url, tables in (("Optuna", stores.optuna_url, OPTUNA_TABLES), ("MLflow", stores.tracking_uri, MLFLOW_TABLES)):
        path = sqlite_file(url)
        if path is not None and path.exists():
            problem = sqlite_problem(what, path, tables, "--home / --storage" if what == "Optuna" else "--home / --tracking-uri")
            if problem:
                raise ConfigError(problem)


OPTUNA_TABLES = ("studies", "trials", "trial_values", "trial_params", "version_info")
MLFLOW_TABLES = ("experiments", "runs", "metrics", "params", "tags", "alembic_version")


def guarded(what: str, url: str, action: Callable[[], T]) -> T:
    """Run ``action`` on a store; its failures become one line naming the store and the fix."""
    try:
        return action()
    except ParetolabError:
        raise
    except Exception as exc:  # noqa: BLE001 - SQLAlchemy, MLflow and driver errors alike; narrowed below
        problem = store_problem(what, url, exc)
        if problem is None:
            raise
        raise ConfigError(problem) from None


def store_problem(what: str, url: str, exc: BaseException) -> str | None:
    """One line for a store failure a user can fix, or None for anything else."""
    shown = redact(url)
    path = sqlite_file(url)
    text = _text(exc)
    low = (text + " " + str(exc)).lower()
    where = "--home / --storage" if what == "Optuna" else "--home / --tracking-uri"
    if "optuna storage upgrade" in low or "no longer compatible with the table schema" in low:
        return f"the Optuna store {shown} has an older schema; upgrade it with `optuna storage upgrade --storage URL` (back it up first)"
    if "out-of-date database schema" in low or "mlflow db upgrade" in low:
        return f"the MLflow store {shown} has an older schema; upgrade it with `mlflow db upgrade URL` (back it up first)"
    if "database or disk is full" in low or "no space left on device" in low or "disk quota exceeded" in low:
        return (f"the {what} store {path or shown} could not be written: the disk is full; nothing half-written was kept: free some "
                "space, then `paretolab run PIPELINE --resume` continues the study")
    if "disk i/o error" in low:
        return f"the {what} store {path or shown} could not be written (disk I/O error); check the disk, then `paretolab run PIPELINE --resume`"
    if "file is not a database" in low or "database disk image is malformed" in low:
        return f"the {what} store {path or shown} is not a SQLite database; move it away or point {where} at another place"
    if "readonly database" in low or "read-only" in low:
        return f"the {what} store {path or shown} is read-only; make it writable or point {where} at a folder you can write"
    if "unable to open database file" in low:
        return f"cannot open the {what} store {path or shown}: its folder is missing or not writable; point {where} elsewhere"
    if _is_connection_error(exc, low):
        return f"cannot reach the {what} store {shown}: {redact(_first_line(text))}; check the host, port, user and that the server runs"
    return None


def _is_connection_error(exc: BaseException, low: str) -> bool:
    import sqlalchemy.exc

    if isinstance(exc, sqlalchemy.exc.OperationalError):
        return True
    return any(m in low for m in ("connection refused", "could not connect", "could not translate host", "password authentication failed",
                                  "timeout expired", "name or service not known", "max retries exceeded"))


def _text(exc: BaseException) -> str:
    """The innermost cause's text: Optuna and SQLAlchemy wrap the driver's error (and add SQL and links)."""
    seen = []
    while exc is not None and exc not in seen:
        seen.append(exc)
        exc = getattr(exc, "orig", None) or exc.__cause__  # type: ignore[assignment]
    return str(seen[-1]) or type(seen[-1]).__name__


def _first_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[0] if lines else text
