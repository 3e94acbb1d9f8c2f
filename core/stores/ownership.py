"""One driver per study, and store creation one process at a time: locks that die with their holder.

SQLite: an OS file lock (``flock``) on a file beside the database. The kernel drops it the
moment the holder's process ends, however it ends, so there is no heartbeat to tune and no stale
owner to time out; a SQLite store lives on one machine anyway (SQLite over a network file system
is not safe), so a local lock covers every driver that can reach it. The file also holds the
owner's host, pid and start time for the refusal message.

PostgreSQL: a session-level advisory lock on a connection the driver keeps open. The server
drops it when that connection ends (the driver exiting, being killed, or its machine vanishing
once TCP gives up). The owner is read back from ``pg_locks`` and ``pg_stat_activity``: the
connection's ``application_name`` carries host and pid, ``backend_start`` the time.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
import socket
from pathlib import Path
from typing import Any

from paretolab.errors import ParetolabError


class StudyOwnedError(ParetolabError):
    """Another live driver owns the study."""


class Lock:
    """A held lock; ``release()`` (or the holder's death) frees it."""

    def __init__(self, release: Any = None) -> None:
        self._release = release

    def release(self) -> None:
        if self._release is not None:
            self._release()
            self._release = None

    def __enter__(self) -> Lock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def own_study(url: str, study: str) -> Lock:
    """Take ``study`` for this process, or raise StudyOwnedError naming the live owner."""
    name = f"study:{study}"
    lock = _try_lock(url, name, wait=False)
    if lock is None:
        owner = _owner(url, name)
        raise StudyOwnedError(
            f"study {study!r} is being run by another driver ({owner}); wait for it to end, or stop it "
            "(`paretolab jobs stop ID` for a submitted job, else end that process) and run again with --resume"
        )
    return lock


def study_owner(url: str, study: str) -> str | None:
    """Who runs ``study`` now ('host H, pid P, since T'), or None when no live driver does (the lock is tried, not kept)."""
    name = f"study:{study}"
    lock = _try_lock(url, name, wait=False)
    if lock is None:
        return _owner(url, name)
    lock.release()
    return None


def creating_stores(url: str) -> Lock:
    """Wait for, then hold, the lock under which one process at a time creates or migrates a store's schema."""
    return _try_lock(url, "create", wait=True) or Lock()


def _try_lock(url: str, name: str, wait: bool) -> Lock | None:
    from sqlalchemy.engine import make_url

    try:
        parsed = make_url(url)
    except Exception:  # noqa: BLE001 - not a database URL (an MLflow server migrates its own store)
        return Lock()
    if parsed.get_backend_name() == "sqlite":
        path = _sqlite_path(parsed.database)
        return _file_lock(path.with_name(f"{path.name}.{_safe(name)}.lock"), wait) if path else Lock()
    if parsed.get_backend_name() == "postgresql":
        return _advisory_lock(url, name, wait)
    return Lock()  # other databases: no lock (paretolab supports SQLite and PostgreSQL stores)


def _sqlite_path(database: str | None) -> Path | None:
    if not database or database == ":memory:" or database.startswith("file:"):
        return None
    return Path(database).expanduser().resolve()


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "._-" else "_" for c in name)


def _file_lock(path: Path, wait: bool) -> Lock | None:
    import fcntl

    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError:
        return Lock()  # a folder we can't write: opening the store itself will say so in one line
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
    except BlockingIOError:
        os.close(fd)
        return None
    os.ftruncate(fd, 0)  # only now: the owner's record is written while holding the lock
    os.write(fd, json.dumps(_me()).encode())

    def release() -> None:
        os.ftruncate(fd, 0)
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)

    return Lock(release)


def _advisory_key(name: str) -> int:
    return int.from_bytes(hashlib.blake2b(f"paretolab:{name}".encode(), digest_size=8).digest(), "big", signed=True)


def _advisory_lock(url: str, name: str, wait: bool) -> Lock | None:
    import sqlalchemy as sa

    me = _me()
    engine = sa.create_engine(url, poolclass=sa.pool.NullPool,
                              connect_args={"application_name": f"paretolab pid={me['pid']} host={me['host']}"[:63]})
    conn = engine.connect()
    key = _advisory_key(name)
    if wait:
        conn.execute(sa.text("SELECT pg_advisory_lock(:k)"), {"k": key})
    elif not conn.execute(sa.text("SELECT pg_try_advisory_lock(:k)"), {"k": key}).scalar():
        conn.close()
        engine.dispose()
        return None
    conn.commit()  # end the implicit transaction; the session-level lock stays with the connection

    def release() -> None:
        try:
            conn.execute(sa.text("SELECT pg_advisory_unlock(:k)"), {"k": key})
        finally:
            conn.close()
            engine.dispose()

    return Lock(release)


def _owner(url: str, name: str) -> str:
    """Who holds ``name``, as 'host H, pid P, since T' (best effort: the lock is what counts)."""
    from sqlalchemy.engine import make_url

    parsed = make_url(url)
    info: dict[str, Any] = {}
    try:
        if parsed.get_backend_name() == "sqlite":
            path = _sqlite_path(parsed.database)
            if path:
                info = json.loads(path.with_name(f"{path.name}.{_safe(name)}.lock").read_text() or "{}")
        else:
            info = _pg_owner(url, name)
    except Exception:  # noqa: BLE001 - the refusal stands even when the owner can't be described
        pass
    if not info:
        return "owner unknown"
    return f"host {info.get('host', '?')}, pid {info.get('pid', '?')}, since {info.get('since', '?')}"


def _pg_owner(url: str, name: str) -> dict[str, Any]:
    import sqlalchemy as sa

    key = _advisory_key(name) & 0xFFFFFFFFFFFFFFFF
    engine = sa.create_engine(url, poolclass=sa.pool.NullPool)
    try:
        with engine.connect() as conn:
            row = conn.execute(sa.text(
                "SELECT a.application_name, a.client_addr, a.backend_start FROM pg_locks l "
                "JOIN pg_stat_activity a ON a.pid = l.pid WHERE l.locktype = 'advisory' AND l.granted "
                "AND l.classid = :hi AND l.objid = :lo AND l.objsubid = 1"
            ), {"hi": key >> 32, "lo": key & 0xFFFFFFFF}).first()
    finally:
        engine.dispose()
    if row is None:
        return {}
    fields = dict(part.split("=", 1) for part in (row[0] or "").split()[1:] if "=" in part)
    since = row[2].astimezone(dt.timezone.utc).isoformat(timespec="seconds") if row[2] else "?"
    return {"host": fields.get("host", row[1] or "?"), "pid": fields.get("pid", "?"), "since": since}


def _me() -> dict[str, Any]:
    since = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    return {"host": socket.gethostname(), "pid": os.getpid(), "since": since}
