"""Data files by name, offline first: the data dirs searched, the cache dir, jsonl task files.

A named data set is looked for in ``$PARETOLAB_DATA_DIR`` (the layout of the project's shared data
folder: ``wikitext2/wiki.test.raw``, ``mc/*.jsonl``, ...), then in the ``shared/data`` folder inside
or beside paretolab's checkout (never one that merely sits above the working directory), then
downloaded from its usual source into the cache (which needs a network).
"""

from __future__ import annotations

import fcntl
import json
import os
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from paretolab.errors import ConfigError

DATA_ENV = "PARETOLAB_DATA_DIR"


# The repository this module runs from when paretolab is a checkout (an editable install); None otherwise.
_ROOT = Path(__file__).resolve().parents[2]


CHECKOUT: Path | None = _ROOT if (_ROOT / "pyproject.toml").is_file() else None


# Where the usual sources keep the files we read, relative to a data dir, and their URLs.
KNOWN_FILES: dict[str, tuple[str, str]] = {
    "wikitext2": (
        "wikitext2/wiki.test.raw",
        "https://huggingface.co/datasets/Salesforce/wikitext/resolve/main/wikitext-2-raw-v1/test-00000-of-00001.parquet",
    ),
    "gsm8k": (
        "gsm8k/test.jsonl",
        "https://raw.githubusercontent.com/openai/grade-school-math/3101c7d5/grade_school_math/data/test.jsonl",
    ),
}


def cache_dir() -> Path:
    """Where paretolab keeps converted models and downloaded data (``$PARETOLAB_CACHE``)."""
    root = os.environ.get("PARETOLAB_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "paretolab"
    )
    path = Path(root)
    path.mkdir(parents=True, exist_ok=True)
    return path


@contextmanager
def file_lock(path: Path) -> Iterator[float]:
    """Hold an exclusive ``fcntl`` lock on ``path`` (created if missing) while the block runs; yields the seconds waited.

    The kernel drops it when the process dies, so a killed holder never leaves it taken. Used to let
    one process of several (Ray workers, test processes) do a one-time job such as a model conversion.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as handle:
        start = time.perf_counter()
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield time.perf_counter() - start
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def data_dirs() -> list[Path]:
    """Folders searched for named data sets, in order."""
    dirs = []
    if os.environ.get(DATA_ENV):
        dirs.append(Path(os.environ[DATA_ENV]))
    if CHECKOUT is not None:
        for candidate in (CHECKOUT / "shared" / "data", CHECKOUT.parent / "shared" / "data"):
            if candidate.is_dir() and candidate not in dirs:
                dirs.append(candidate)
    dirs.append(cache_dir() / "data")
    return dirs


def find_data_file(relative: str, *, url: str | None = None) -> Path:
    """A data file by its path under a data dir; downloaded into the cache if a URL is known."""
    for folder in data_dirs():
        path = folder / relative
        if path.is_file():
            return path
    if url is None:
        raise ConfigError(
            f"data file {relative!r} not found in {', '.join(str(d) for d in data_dirs())}; "
            f"set {DATA_ENV} to a folder that has it, or give a path"
        )
    target = cache_dir() / "data" / relative
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        with urllib.request.urlopen(url, timeout=60) as response:  # noqa: S310 (fixed https URLs)
            payload = response.read()
    except OSError as exc:
        raise ConfigError(
            f"data file {relative!r} is not on this machine and could not be downloaded from {url} ({exc}); "
            f"set {DATA_ENV} to a folder that has it"
        ) from exc
    if url.endswith(".parquet"):  # a Hugging Face data set: one line of text per row
        import io

        import pyarrow.parquet as pq

        payload = "".join(pq.read_table(io.BytesIO(payload)).column("text").to_pylist()).encode("utf-8")
    tmp = target.with_suffix(".part")
    tmp.write_bytes(payload)
    tmp.replace(target)
    return target


def read_jsonl(name_or_path: str, *, folder: str = "mc") -> list[dict[str, Any]]:
    """Rows of a jsonl file: a path, or a data set name looked up as ``<folder>/<name>.jsonl``."""
    path = Path(name_or_path).expanduser()
    if not path.is_file():
        known = KNOWN_FILES.get(name_or_path)
        path = find_data_file(known[0], url=known[1]) if known else find_data_file(f"{folder}/{name_or_path}.jsonl")
    rows = []
    with path.open(encoding="utf-8") as handle:
        for line_no, line in enumerate(handle, 1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as exc:
                    raise ConfigError(f"{path}:{line_no}: not valid JSON ({exc.msg})") from exc
    return rows
