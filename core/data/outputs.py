"""Output paths checked before any work starts (export, report, bundles): writable, not under a file, not the working or
home directory, and not a folder that another process is writing. Each refusal is one line naming the flag and the fix.

And how they are written: ``write_atomic`` (a temporary file beside the target, one ``os.replace``, the user's umask),
``replace_dir`` (a finished folder put in place in one step), ``manifest`` (what an export lists, for ``--force``)."""

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
        problem = manifest_problem(out, record)
        if problem:  # a file of that name proves nothing: the export's record lists every file it wrote
            raise ConfigError(f"{flag} {out}: {problem}, so it is not an earlier export as written; --force replaces only those "
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


def file_mode(folder: bool = False) -> int:
    """The mode a plain ``open()`` (or ``mkdir``) gives under the user's umask: what every file paretolab writes gets."""
    try:
        with open("/proc/self/status", encoding="ascii") as status:  # read without changing it (os.umask is process-wide)
            umask = next(int(line.split()[1], 8) for line in status if line.startswith("Umask:"))
    except (OSError, StopIteration, ValueError):
        umask = os.umask(0o022)
        os.umask(umask)
    return (0o777 if folder else 0o666) & ~umask


def write_atomic(path: Path, data: str | bytes) -> None:
    """Write ``data`` to ``path`` whole or not at all: a temporary file beside it, then one ``os.replace``.

    The file gets the user's umask (mkstemp's are private). On any failure (a full disk, a file-size limit: EFBIG,
    an interrupt) the temporary file is removed and ``path`` keeps what it held; the OSError is raised as it came.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    _sweep_temporaries(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.p{os.getpid()}-", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data.encode("utf-8") if isinstance(data, str) else data)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, file_mode())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def _sweep_temporaries(path: Path) -> None:
    """Remove the temporary files of ``path`` that a killed writer left (its process id is in the name, and it is gone)."""
    prefix = f".{path.name}.p"
    try:
        siblings = [p for p in path.parent.iterdir() if p.name.startswith(prefix) and p.name.endswith(".tmp")]
    except OSError:
        return
    for sibling in siblings:
        pid = sibling.name[len(prefix):].split("-", 1)[0]
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            sibling.unlink(missing_ok=True)
        except OSError:  # alive, another user's
            pass


def follow_umask(folder: Path) -> None:
    """Give ``folder`` and everything under it the modes the user's umask gives (a library's mkstemp makes files 0600)."""
    files, folders = file_mode(), file_mode(folder=True)
    os.chmod(folder, folders)
    for root, dirs, names in os.walk(folder):
        for name in dirs:
            if not os.path.islink(os.path.join(root, name)):
                os.chmod(os.path.join(root, name), folders)
        for name in names:
            if not os.path.islink(os.path.join(root, name)):
                os.chmod(os.path.join(root, name), files)


def manifest(folder: Path, skip: str = "") -> dict[str, dict[str, int | str]]:
    """Each file under ``folder`` (but ``skip``) by its relative path: its size and sha256 (an export's proof of what it holds)."""
    import hashlib

    out: dict[str, dict[str, int | str]] = {}
    for path in sorted(folder.rglob("*")):
        rel = path.relative_to(folder).as_posix()
        if rel == skip or (path.is_dir() and not path.is_symlink()):
            continue
        if path.is_symlink() or not path.is_file():  # never in an export: listed so that it never matches one
            out[rel] = {"bytes": -1, "sha256": "not a plain file"}
            continue
        digest = hashlib.sha256()
        with open(path, "rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
        out[rel] = {"bytes": path.stat().st_size, "sha256": digest.hexdigest()}
    return out


def manifest_problem(folder: Path, record: str) -> str:
    """Why ``folder`` is not what its ``record`` says an export wrote ("" when every file it lists is there, unchanged, and no other)."""
    import json

    try:
        listed = json.loads((folder / record).read_text(encoding="utf-8")).get("files")
    except (OSError, UnicodeError, ValueError, AttributeError):
        return f"its {record} is not an export's record"
    if not isinstance(listed, dict) or not listed:
        return f"its {record} lists no files"
    found = manifest(folder, skip=record)
    extra, missing = sorted(set(found) - set(listed)), sorted(set(listed) - set(found))
    if extra:
        return f"it holds {extra[0]!r}, which its {record} does not list"
    if missing:
        return f"{missing[0]!r}, listed in its {record}, is missing"
    changed = sorted(k for k in found if found[k] != listed[k])
    if changed:
        return f"{changed[0]!r} differs from what its {record} lists"
    return ""


def replace_dir(new: Path, out: Path) -> None:
    """Put the finished folder ``new`` at ``out`` in one step; an earlier ``out`` is removed after.

    Absent ``out``: one rename. Present: exchanged with ``new`` in one ``renameat2(RENAME_EXCHANGE)`` (Linux), so at no
    moment is ``out`` missing or half-written; elsewhere two renames, the earlier folder put back when the second fails.
    """
    import shutil

    if not (out.exists() or out.is_symlink()):
        os.rename(new, out)
        return
    if _exchange(new, out):
        shutil.rmtree(new, ignore_errors=True)  # it now holds the earlier folder
        return
    earlier = out.with_name(out.name + ".replaced")
    shutil.rmtree(earlier, ignore_errors=True)
    os.rename(out, earlier)
    try:
        os.rename(new, out)
    except OSError:
        os.rename(earlier, out)
        raise
    shutil.rmtree(earlier, ignore_errors=True)


def _exchange(a: Path, b: Path) -> bool:
    """Swap two paths atomically (Linux renameat2 with RENAME_EXCHANGE); False where the system cannot."""
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        return False
    at_fdcwd, rename_exchange = -100, 2
    if renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0:
        return True
    err = ctypes.get_errno()
    if err in (22, 38, 95):  # EINVAL, ENOSYS, EOPNOTSUPP: a file system or kernel without it
        return False
    raise OSError(err, os.strerror(err), str(b))


def write_text(path: Path, text: str, flag: str) -> None:
    """Write ``text`` to ``path`` whole or not at all (``write_atomic``); a failure is one line naming ``flag``."""
    try:
        write_atomic(path, text)
    except OSError as exc:
        raise ConfigError(f"{flag} {path}: writing it failed ({exc.strerror or exc}); nothing was written there: free some space or "
                          f"point {flag} elsewhere") from None
