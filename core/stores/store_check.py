"""What is wrong with a SQLite store file, found read-only (``mode=ro``: nothing is created, migrated or locked).

One sentence per problem, naming the file and what to do; ``None`` for a store a read can use. Used by
``stores.open.check_readable`` on every read path (CLI commands, ``load_study``, ``export``, the dashboard).
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

HEADER = b"SQLite format 3\x00"
QUICK_CHECK_BYTES = 64 << 20  # ~0.2 s of reading; larger stores get the cheaper checks (header, tables, values) only
LOCK_TIMEOUT_S = 5.0  # how long a read waits for a writer that holds the file
_CHECKED: dict[tuple[str, int, int], str | None] = {}  # (file, size, mtime_ns) -> the answer: a dashboard reads often


def sqlite_problem(what: str, path: Path, tables: tuple[str, ...], flags: str) -> str | None:
    """Why the ``what`` store at ``path`` cannot be read (None: it can)."""
    try:
        stat = path.stat()
        if path.is_dir():
            return f"the {what} store {path} is a directory, not a database file; point {flags} at the folder that holds it"
        with path.open("rb") as handle:
            head = handle.read(len(HEADER))
    except OSError as exc:
        return f"cannot read the {what} store {path} ({exc.strerror or exc}); fix its permissions or point {flags} elsewhere"
    if stat.st_size == 0:
        return (f"the {what} store {path} is empty (0 bytes): nothing was ever recorded in it, or it was truncated; "
                f"restore it from a backup or move it away (the next `run` creates a new one)")
    if head != HEADER:
        return f"the {what} store {path} is not a SQLite database; move it away or point {flags} at another place"
    key = (str(path), stat.st_size, stat.st_mtime_ns)
    if key not in _CHECKED:
        _CHECKED[key] = _inspect(what, path, tables)
    return _CHECKED[key]


def _inspect(what: str, path: Path, tables: tuple[str, ...]) -> str | None:
    try:
        conn = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True, timeout=LOCK_TIMEOUT_S)
    except sqlite3.Error as exc:
        return f"cannot open the {what} store {path} ({exc}); fix its permissions or move it away"
    try:
        try:
            found = {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
            # quick_check reads every page under a shared lock: past QUICK_CHECK_BYTES it would hold off a running driver's writes
            check = [row[0] for row in conn.execute("PRAGMA quick_check(3)")] if path.stat().st_size <= QUICK_CHECK_BYTES else ["ok"]
        except sqlite3.DatabaseError as exc:
            return _sqlite_error(what, path, exc)
        if check != ["ok"]:
            return (f"the {what} store {path} is damaged (SQLite: {_flat('; '.join(map(str, check)))}); restore it from a backup, "
                    f"or salvage it with `sqlite3 {path} .recover | sqlite3 recovered.db` and point the stores there")
        missing = [t for t in tables if t not in found]
        if missing:
            return (f"the {what} store {path} is missing table(s) {', '.join(missing)}: it is not a complete {what} store "
                    f"(partly deleted, or another program's database); restore it from a backup or move it away")
        if what == "Optuna":
            return _complete_without_values(path, conn)
        return None
    except sqlite3.DatabaseError as exc:
        return _sqlite_error(what, path, exc)
    finally:
        conn.close()


def _complete_without_values(path: Path, conn: sqlite3.Connection) -> str | None:
    """A COMPLETE trial whose objective values were deleted: Optuna would hand it out with no values and every reader trips."""
    rows = conn.execute(
        "SELECT s.study_name, t.number, t.trial_id FROM trials t JOIN studies s ON s.study_id = t.study_id "
        "WHERE t.state = 'COMPLETE' AND NOT EXISTS (SELECT 1 FROM trial_values v WHERE v.trial_id = t.trial_id) "
        "ORDER BY t.trial_id LIMIT 6").fetchall()
    if not rows:
        return None
    shown = ", ".join(f"{study!r} #{number}" for study, number, _ in rows[:5]) + (" ..." if len(rows) > 5 else "")
    ids = ", ".join(str(trial_id) for _, _, trial_id in rows[:5])
    return (f"the Optuna store {path} is damaged: complete trial(s) {shown} have no objective values (rows deleted?); restore it "
            f"from a backup, or mark them failed: sqlite3 {path} \"UPDATE trials SET state = 'FAIL' WHERE trial_id IN ({ids})\"")


def _sqlite_error(what: str, path: Path, exc: sqlite3.Error) -> str:
    text = str(exc).lower()
    if "locked" in text or "busy" in text:
        return f"the {what} store {path} is locked by another process (a writer holds it); try again when it finishes"
    if "not a database" in text or "malformed" in text or "corrupt" in text:
        return (f"the {what} store {path} is damaged (SQLite: {_flat(str(exc))}); restore it from a backup, "
                f"or salvage it with `sqlite3 {path} .recover | sqlite3 recovered.db` and point the stores there")
    return f"cannot read the {what} store {path} (SQLite: {_flat(str(exc))}); restore it from a backup or move it away"


def _flat(text: str) -> str:
    """SQLite's report on one line, cut to a readable length."""
    words = " ".join(text.replace("*** in database main ***", "").split())
    return words if len(words) <= 160 else words[:157] + "..."
