"""Output paths checked before any work starts (export, report, bundles): writable, not under a file, not the working or
home directory, and not a folder that another process is writing. Each refusal is one line naming the flag and the fix."""

from __future__ import annotations

import fcntl
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from paretolab.errors import ConfigError


def normalized(path: str | Path) -> Path:
    """``path`` absolute with ``..`` and ``.`` folded away as written (``d/inner/..`` is ``d``), ``~`` expanded."""
    return Path(os.path.abspath(os.path.expanduser(str(path))))


def check_writable_parent(path: Path, flag: str) -> None:
    """The folder ``path`` would be written into can be written: its nearest existing ancestor is a folder we can write."""
    parent = path.parent
    while not parent.exists():
        if parent.is_symlink():
            raise ConfigError(f"{flag} {path}: {parent} is a broken link; point {flag} at a real folder")
        parent = parent.parent
    if not parent.is_dir():
        raise ConfigError(f"{flag} {path}: {parent} is a file, not a folder; point {flag} somewhere else")
    try:
        fd, probe = tempfile.mkstemp(prefix=".paretolab-probe-", dir=parent)
    except OSError as exc:
        raise ConfigError(f"{flag} {path}: cannot write in {parent} ({exc.strerror or exc}); point {flag} at a folder you can write") from None
    os.close(fd)
    os.unlink(probe)


def check_file_output(path: str | Path, flag: str) -> Path:
    """A file ``flag`` will write: not a folder, its folder writable (created when missing)."""
    out = normalized(path)
    if out.is_dir():
        raise ConfigError(f"{flag} {out}: is a folder; give a file name (e.g. {out / 'results.md'})")
    check_writable_parent(out, flag)
    return out


def check_export_dir(path: str | Path, *, force: bool, record: str, flag: str = "--out") -> Path:
    """The directory an export writes: refused before the work when it cannot be written or must not be replaced."""
    out = normalized(path)
    protected = {Path("/"), normalized(Path.home()), normalized(os.getcwd())}
    if out in protected or normalized(os.getcwd()).is_relative_to(out):
        raise ConfigError(f"{flag} {out}: is the working directory, the home directory or a folder above them; "
                          f"give a new directory for the export (e.g. {flag} {out / 'export'})")
    if out.exists() or out.is_symlink():
        if not force:
            raise ConfigError(f"{flag} {out}: exists; pick a new directory or pass --force to replace an earlier export")
        if out.is_symlink() or not out.is_dir():
            raise ConfigError(f"{flag} {out}: is {'a link' if out.is_symlink() else 'a file'}, not an earlier export; "
                              "--force replaces only a directory an export wrote; pick a new directory")
        if not (out / record).is_file():
            raise ConfigError(f"{flag} {out}: has no {record}, so it is not an earlier export; --force replaces only those "
                              "(move its contents away or pick a new directory)")
    check_writable_parent(out, flag)
    return out


@contextmanager
def writing(out: Path, flag: str = "--out") -> Iterator[None]:
    """Held while ``out`` is written: a second process writing the same target is refused; the lock file goes at the end."""
    lock = out.with_name(f".{out.name}.lock")
    lock.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise ConfigError(f"{flag} {out}: another export is writing it now; wait for it to finish or pick another directory") from None
    try:
        yield
    finally:
        try:
            os.unlink(lock)
        except OSError:
            pass
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def write_text(path: Path, text: str, flag: str) -> None:
    """Write ``text`` to ``path`` whole or not at all (a temporary file beside it, renamed into place; removed on failure)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.replace(tmp, path)
    except OSError as exc:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise ConfigError(f"{flag} {path}: writing it failed ({exc.strerror or exc}); nothing was written there: free some space or "
                          f"point {flag} elsewhere") from None
