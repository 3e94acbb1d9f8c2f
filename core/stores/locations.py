"""Where studies live: the Optuna storage URL and the MLflow tracking URI, from flags, environment or config.

Flags win over environment variables, which win over a config file (``PARETOLAB_CONFIG``, else
``paretolab.yaml`` in the working directory), which wins over SQLite files under ``.paretolab/``.
On a cluster: Optuna on PostgreSQL (any SQLAlchemy URL) and an MLflow tracking server. A password
may sit in a URL, or come from libpq's own PGPASSWORD / ~/.pgpass; paretolab prints URLs redacted.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from paretolab.errors import ConfigError

STORE_DIR_ENV = "PARETOLAB_HOME"
OPTUNA_ENV = "PARETOLAB_OPTUNA_STORAGE"
TRACKING_ENV = "PARETOLAB_TRACKING_URI"
ARTIFACT_ENV = "PARETOLAB_ARTIFACT_ROOT"
CONFIG_ENV = "PARETOLAB_CONFIG"
CONFIG_FILE = "paretolab.yaml"
CONFIG_KEYS = ("home", "optuna_storage", "tracking_uri", "artifact_root")
MAX_CONFIG_BYTES = 64 * 1024  # four URLs and a folder


@dataclass(frozen=True)
class Stores:
    """The two stores of a study: search state in Optuna, results in MLflow."""

    optuna_url: str
    tracking_uri: str
    artifact_root: str | None

    def redacted(self) -> Stores:
        """The same URLs with any password replaced, for printing and logging."""
        return Stores(redact(self.optuna_url), redact(self.tracking_uri), self.artifact_root and redact(self.artifact_root))


def resolve_stores(*, home: str | None = None, optuna_url: str | None = None, tracking_uri: str | None = None, create: bool = True) -> Stores:
    """Flags win over environment, then the config file, then the default SQLite files under ``.paretolab/``.

    ``create=False`` (the read-only commands) leaves a missing home folder missing.
    """
    config = read_config()
    root = Path(home or os.environ.get(STORE_DIR_ENV) or config.get("home") or ".paretolab").expanduser().resolve()
    optuna_url = optuna_url or os.environ.get(OPTUNA_ENV) or config.get("optuna_storage")
    tracking_uri = tracking_uri or os.environ.get(TRACKING_ENV) or os.environ.get("MLFLOW_TRACKING_URI") or config.get("tracking_uri")
    artifact_root = os.environ.get(ARTIFACT_ENV) or config.get("artifact_root")
    if (not optuna_url or not tracking_uri) and create:
        _make_home(root)
    elif (not optuna_url or not tracking_uri) and root.exists() and not root.is_dir():  # read-only commands too: not "no studies yet"
        raise ConfigError(f"--home {root}: is a file, not a folder; point --home (or {STORE_DIR_ENV}) at a folder")
    if not optuna_url:
        optuna_url = f"sqlite:///{root / 'optuna.db'}"
    if not tracking_uri:
        tracking_uri = f"sqlite:///{root / 'mlflow.db'}"
        artifact_root = artifact_root or (root / "artifacts").as_uri()
    return Stores(optuna_url=optuna_url, tracking_uri=tracking_uri, artifact_root=artifact_root)


def _make_home(root: Path) -> None:
    """Create the home folder, or say in one line why it can't be used."""
    if root.exists() and not root.is_dir():
        raise ConfigError(f"--home {root}: is a file, not a folder; point --home (or {STORE_DIR_ENV}) at a folder")
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"--home {root}: cannot create it ({exc.strerror}); point --home (or {STORE_DIR_ENV}) at a folder you can write") from None
    if not os.access(root, os.W_OK | os.X_OK):
        raise ConfigError(f"--home {root}: not writable; point --home (or {STORE_DIR_ENV}) at a folder you can write, or fix its permissions")


def read_config() -> dict[str, str]:
    """The ``stores:`` mapping of the config file, if there is one."""
    from paretolab.data.yaml_read import read_yaml_file

    named = os.environ.get(CONFIG_ENV)
    path = Path(named).expanduser() if named else Path(CONFIG_FILE)
    if not path.exists():
        if named:
            raise ConfigError(f"{CONFIG_ENV}: no file at {path}; unset it or point it at a YAML file with a `stores:` mapping")
        return {}
    raw: Any = read_yaml_file(path, "store config", MAX_CONFIG_BYTES) or {}
    stores = raw.get("stores", {}) if isinstance(raw, dict) else None
    if not isinstance(stores, dict):
        raise ConfigError(f"{path}: `stores` must be a mapping with keys {', '.join(CONFIG_KEYS)}")
    unknown = sorted(set(stores) - set(CONFIG_KEYS))
    if unknown:
        raise ConfigError(f"{path}: unknown key(s) stores.{', stores.'.join(unknown)}; expected {', '.join(CONFIG_KEYS)}")
    return {k: str(v) for k, v in stores.items() if v}


PASSWORD_KEYS = ("password", "passwd", "pwd")  # query parameters libpq and the drivers read as a password
# In free text (an error of SQLAlchemy, MLflow, requests or a driver that quotes the URL it was given): the user info of
# any URL (``scheme://user:secret@``, greedy up to the last @ of the word: a password may hold @ or /) and any
# ``password=...`` (a URL's query, a libpq DSN).
_USERINFO_IN_TEXT = re.compile(r"(?P<head>[A-Za-z][A-Za-z0-9+.\-]*://[^\s/@:'\"<>]*):(?P<secret>[^\s'\"<>]*)@")
_PASSWORD_IN_TEXT = re.compile(r"(?i)(?P<head>\b(?:" + "|".join(PASSWORD_KEYS) + r")\s*=\s*)(?P<secret>[^&\s'\",;)]+)")


def has_password(url: str) -> bool:
    """Whether ``url`` carries a password (user info or a ``password=`` query parameter)."""
    return redact(url) != url


def redact(url: str) -> str:
    """``postgresql://user:secret@host/db`` -> ``postgresql://user:***@host/db`` (also ``?password=``), parsed as
    SQLAlchemy parses it (so ``u:se/cret@h`` and ``:secret@h`` are caught); text without a password comes back unchanged."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        parsed = make_url(url)
    except ArgumentError:  # not a URL at all (a path, `databricks`, ...)
        return url
    except ValueError:  # URL-shaped but broken (a bad port): hide all user info rather than guess
        return re.sub(r"(://).*@", r"\1***@", url)  # greedy: up to the last @, a / in the password included
    secret_keys = [k for k in parsed.query if k.lower() in PASSWORD_KEYS]
    if parsed.password is None and not secret_keys:
        return url
    if parsed.host and "@" in parsed.host:  # `u:a@b@h`: SQLAlchemy splits at the first @; hide up to the last
        parsed = parsed.set(host=parsed.host.rsplit("@", 1)[1])
    shown = parsed.set(query={}).render_as_string(hide_password=True)
    if "?" in url:  # the query as written (SQLAlchemy would sort it), its password parameters masked
        query = url.split("?", 1)[1]
        for key in secret_keys:
            query = re.sub(rf"(^|&)({re.escape(key)})=[^&]*", r"\1\2=***", query)
        shown += "?" + query
    return shown


def redact_text(text: object) -> str:
    """``text`` with the password of every URL in it masked (``http://user:***@host``, ``password=***``): for any message
    or log line that may quote a store's URL (an error from SQLAlchemy, MLflow, requests or a database driver)."""
    text = str(text)
    if "@" not in text and "=" not in text:
        return text
    text = _USERINFO_IN_TEXT.sub(lambda m: f"{m['head']}:***@" if m["secret"] != "***" else m[0], text)
    return _PASSWORD_IN_TEXT.sub(lambda m: f"{m['head']}***", text)


def _redact_record(record: Any) -> None:
    """A log record, its message and any traceback it carries, with passwords masked (in place)."""
    try:
        message = record.getMessage()
    except Exception:  # noqa: BLE001 - a record whose arguments do not format: logging reports that itself
        return
    clean = redact_text(message)
    if clean != message:
        record.msg, record.args = clean, None
    if record.exc_info and record.exc_info[1] is not None and not record.exc_text:
        import traceback

        shown = "".join(traceback.format_exception(*record.exc_info)).rstrip("\n")
        if redact_text(shown) != shown:
            record.exc_text = redact_text(shown)


class RedactingFilter:
    """A logging filter that masks passwords in every record it sees (attached to a logger or a handler)."""

    def filter(self, record: Any) -> bool:
        _redact_record(record)
        return True


_installed = False


def install_redaction(loggers: tuple[str, ...] = ("paretolab", "mlflow", "optuna", "sqlalchemy", "alembic", "urllib3")) -> None:
    """From now on, no log line, warning or uncaught traceback of this process shows a password given in a URL.

    Every log record is redacted as it is made (a record factory: MLflow's loggers and their handlers included,
    whenever they were configured), a filter guards the named loggers and their handlers as well, warnings are
    formatted redacted, and an uncaught exception's traceback is printed redacted. Idempotent."""
    global _installed
    import logging
    import sys
    import warnings

    for name in loggers:
        logger = logging.getLogger(name)
        for target in (logger, *logger.handlers):
            if not any(isinstance(f, RedactingFilter) for f in target.filters):
                target.addFilter(RedactingFilter())
    if _installed:
        return
    _installed = True
    make_record = logging.getLogRecordFactory()

    def redacted_record(*args: Any, **kwargs: Any) -> logging.LogRecord:
        record = make_record(*args, **kwargs)
        _redact_record(record)
        return record

    logging.setLogRecordFactory(redacted_record)
    format_warning = warnings.formatwarning
    warnings.formatwarning = lambda *args, **kwargs: redact_text(format_warning(*args, **kwargs))  # type: ignore[assignment]
    if sys.excepthook is sys.__excepthook__:
        def redacted_hook(kind: Any, value: Any, tb: Any) -> None:
            import traceback

            sys.stderr.write(redact_text("".join(traceback.format_exception(kind, value, tb))))

        sys.excepthook = redacted_hook
