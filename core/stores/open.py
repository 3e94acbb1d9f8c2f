"""Opening the stores: created (one process at a time) by `run`, only read by everything else.

Every failure a user can meet here (an unwritable folder, a file that is not a database, a
schema from an older Optuna or MLflow, a PostgreSQL that does not answer) becomes one ConfigError
line that names the store, with any password redacted, and says what to do.
"""

from __future__ import annotations

import os
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

from paretolab.errors import ConfigError, ParetolabError
from paretolab.stores import Stores, redact
from paretolab.stores.locations import install_redaction, redact_text
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
    engine = engine_kwargs(url)
    if create:
        with guarded("Optuna", url, lambda: creating_stores(url)), waiting("Optuna", url):
            return guarded("Optuna", url, lambda: optuna.storages.RDBStorage(url, heartbeat_interval=None, engine_kwargs=engine))
    if not exists(url):
        raise ConfigError(f"no Optuna store at {sqlite_file(url)}: no study has run with these stores yet "
                          "(check --home / --storage, or run a pipeline first)")
    check_readable(stores)
    with waiting("Optuna", url):
        return guarded("Optuna", url, lambda: optuna.storages.RDBStorage(url, skip_table_creation=True, engine_kwargs=engine))


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
    """Run ``action`` on a store; its failures become one line naming the store and the fix.

    A store on a server is first checked once per process (``require_server``): its database driver installed, and
    something answering at its address within ``connect_timeout_s()``; every line printed has its password masked."""
    install_redaction()
    require_server(what, url)
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
    if isinstance(exc, ImportError) and (driver := missing_driver(url, exc)):
        return driver
    if _is_connection_error(exc, low):
        return f"cannot reach the {what} store {shown}: {redact_text(_first_line(text))}; check the host, port, user and that the server runs"
    return None


# Database drivers SQLAlchemy imports by module name -> the package that installs it.
DRIVER_PACKAGES = {
    "psycopg": '"psycopg[binary]"', "psycopg2": "psycopg2-binary", "pg8000": "pg8000", "asyncpg": "asyncpg",
    "MySQLdb": "mysqlclient", "pymysql": "PyMySQL", "mysql": "mysql-connector-python", "mariadb": "mariadb",
    "pyodbc": "pyodbc", "pymssql": "pymssql", "oracledb": "oracledb", "cx_Oracle": "cx_Oracle",
}
CONNECT_TIMEOUT_ENV = "PARETOLAB_CONNECT_TIMEOUT_S"
CONNECT_TIMEOUT_S = 10.0  # how long a store on a server may take to answer at all before we say it does not
WAIT_NOTICE_S = 1.0  # a store slower than this to answer gets a line saying what is being waited for
DEFAULT_PORTS = {"postgresql": 5432, "mysql": 3306, "mariadb": 3306, "mssql": 1433, "oracle": 1521}
_answered: set[str] = set()
_waiting: list[str] = []  # the waits under way (one notice for nested ones)


def connect_timeout_s() -> float:
    """Seconds a store on a server has to answer (``PARETOLAB_CONNECT_TIMEOUT_S``, default 10)."""
    raw = os.environ.get(CONNECT_TIMEOUT_ENV, "")
    try:
        value = float(raw) if raw else CONNECT_TIMEOUT_S
    except ValueError:
        value = float("nan")
    if not 0 < value <= 3600:  # NaN included
        raise ConfigError(f"{CONNECT_TIMEOUT_ENV}={raw!r}: give a number of seconds from 0 to 3600 (default {CONNECT_TIMEOUT_S:g})")
    return value


def missing_driver(url: str, exc: ImportError) -> str | None:
    """One line naming the database driver a server store's URL needs and the package that installs it."""
    module = getattr(exc, "name", None)
    if not module:
        return None
    root = module.split(".")[0]
    package = DRIVER_PACKAGES.get(module) or DRIVER_PACKAGES.get(root)
    if package is None:
        return None  # not a database driver: the error stands as it is
    backend = url.split(":", 1)[0].split("+", 1)[0]
    return (f"the store {redact(url)} needs the database driver {root!r}, which is not installed here: `pip install {package}` "
            f"(into paretolab's environment), or name an installed driver in the URL ({backend}+DRIVER://...)")


def server_address(url: str) -> tuple[str, str, int] | None:
    """(scheme, host, port) of a store on a server (an MLflow http(s) server, a database with a host); None for files."""
    from urllib.parse import urlsplit

    if url.startswith(("http://", "https://")):
        parts = urlsplit(url)
        try:
            port = parts.port or (443 if parts.scheme == "https" else 80)
        except ValueError:
            raise ConfigError(f"the store URL {redact(url)}: its port is not a number from 0 to 65535") from None
        return (parts.scheme, parts.hostname, port) if parts.hostname else None
    if "://" not in url or url.startswith(("sqlite", "file:")):
        return None
    from sqlalchemy.engine import make_url

    try:
        parsed = make_url(url)
    except Exception:  # noqa: BLE001 - not a SQLAlchemy URL (databricks, a plugin's scheme): left to its own client
        return None
    backend = parsed.get_backend_name()
    if not parsed.host or backend not in DEFAULT_PORTS:
        return None
    return backend, parsed.host, parsed.port or DEFAULT_PORTS[backend]


def require_server(what: str, url: str) -> None:
    """A store on a server, checked once per process before its client waits on it: its database driver is installed,
    and something answers at its address (an MLflow server: an HTTP reply) within ``connect_timeout_s()``. One line
    (password masked) otherwise, instead of a traceback or minutes of retries."""
    if url in _answered:
        return
    address = server_address(url)
    if address is None:
        return
    scheme, host, port = address
    if scheme not in ("http", "https"):
        from sqlalchemy.engine import make_url

        try:
            make_url(url).get_dialect().import_dbapi()
        except ImportError as exc:
            problem = missing_driver(url, exc)
            if problem:
                raise ConfigError(problem) from None
        except Exception:  # noqa: BLE001 - an unknown dialect and the like: SQLAlchemy's own error says it (guarded)
            pass
    limit = connect_timeout_s()
    with waiting(what, url, limit):
        why = _no_answer(scheme, host, port, limit)
    if why:
        raise ConfigError(f"cannot reach the {what} store {redact(url)}: {why}; check the host, port and that the server runs "
                          f"(waiting longer: {CONNECT_TIMEOUT_ENV})")
    _answered.add(url)


def _no_answer(scheme: str, host: str, port: int, limit: float) -> str | None:
    """Why nothing usable answers at host:port within ``limit`` seconds (None: it answers). An HTTP server must send
    a reply (any status: authentication is its client's business); a database must accept the connection."""
    deadline = time.monotonic() + limit
    try:
        sock = socket.create_connection((host, port), timeout=limit)
    except TimeoutError:
        return f"no answer at {host}:{port} in {limit:g} s"
    except OSError as exc:
        return f"{host}:{port}: {exc.strerror or type(exc).__name__}"
    try:
        if scheme not in ("http", "https"):
            return None  # the driver's own connect is bounded too (engine_kwargs: connect_timeout)
        sock.settimeout(max(0.1, deadline - time.monotonic()))
        if scheme == "https":
            import ssl

            context = ssl.create_default_context()
            context.check_hostname, context.verify_mode = False, ssl.CERT_NONE  # any TLS answer will do: MLflow checks the certificate
            try:
                sock = context.wrap_socket(sock, server_hostname=host)
            except ssl.SSLError:
                return None  # it answered, in TLS
        sock.sendall(f"GET /health HTTP/1.0\r\nHost: {host}\r\n\r\n".encode())
        if not sock.recv(1):
            return f"{host}:{port} accepted the connection and closed it without a reply (is it an MLflow server?)"
    except TimeoutError:
        return f"{host}:{port} accepted the connection but sent no reply in {limit:g} s (is it an MLflow server, and not overloaded?)"
    except OSError as exc:
        return f"{host}:{port}: {exc.strerror or type(exc).__name__}"
    finally:
        sock.close()
    return None


@contextmanager
def waiting(what: str, url: str, limit: float | None = None) -> Iterator[None]:
    """Say on stderr what is being waited for when a store on a server takes more than a second to answer."""
    if server_address(url) is None or _waiting:
        yield
        return
    limit = connect_timeout_s() if limit is None else limit
    stream = sys.stderr  # the stream of the caller's thread (a captured one in a test)

    def notice() -> None:
        print(f"waiting for {what} at {redact(url)} (up to {limit:g} s)", file=stream, flush=True)

    timer = threading.Timer(WAIT_NOTICE_S, notice)
    timer.daemon = True
    timer.start()
    _waiting.append(url)
    try:
        yield
    finally:
        _waiting.remove(url)
        timer.cancel()


def engine_kwargs(url: str) -> dict[str, Any] | None:
    """SQLAlchemy engine arguments bounding a database server's connect (libpq and the MySQL drivers wait forever on a
    server that accepts and never answers), unless the URL sets its own ``connect_timeout``."""
    address = server_address(url)
    if address is None or address[0] not in ("postgresql", "mysql", "mariadb"):
        return None
    from sqlalchemy.engine import make_url

    parsed = make_url(url)
    if "connect_timeout" in parsed.query or parsed.get_driver_name() not in ("psycopg", "psycopg2", "mysqldb", "pymysql"):
        return None
    return {"connect_args": {"connect_timeout": max(2, int(round(connect_timeout_s())))}}


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
