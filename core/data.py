"""Evaluation and training data: the built-in corpora, WikiText-2, plain text files and jsonl task files.

Offline first. A named data set is looked for in ``$PARETOLAB_DATA_DIR`` (the layout of the
project's shared data folder: ``wikitext2/wiki.test.raw``, ``mc/*.jsonl``, ...), then in the
``shared/data`` folder inside or beside paretolab's checkout (never one that merely sits above
the working directory), then downloaded from its usual source into the cache (which needs a
network).
"""

from __future__ import annotations

import hashlib
import json
import os
import urllib.request
import warnings
from functools import lru_cache
from pathlib import Path
from typing import Any

from paretolab.errors import ConfigError

DATA_ENV = "PARETOLAB_DATA_DIR"
# The repository this module runs from when paretolab is a checkout (an editable install); None otherwise.
_ROOT = Path(__file__).resolve().parents[1]
CHECKOUT: Path | None = _ROOT if (_ROOT / "pyproject.toml").is_file() else None

# sha256 of the joined pydoc_data.topics prose, by Python minor version: the corpus is
# pinned so that perplexities are comparable across machines running the same Python.
PYDOC_SHA256: dict[str, str] = {
    "3.11": "d9dc35bce5ab1a24ed7f4c3c9b7c22450410e9d68279e3426db458c6be371621",
}

# sha256 of the pystdlib corpora (the standard library's own .py sources, see pystdlib_files), by
# Python minor version: another patch release or a distribution's patched stdlib warns, not fails.
PYSTDLIB_SHA256: dict[str, dict[str, str]] = {
    "3.11": {"pystdlib-train": "a8d25cfbf0b3a0ce31fecbec98067eee6b8cac090a9173ed579e70d9d6bf2aff",
              "pystdlib-val": "7909979fa648e35f313ffc49c6e7555212ba4e0e161b12f22fcc6b8a96ae7d36"},
}
PYSTDLIB_CORPORA = ("pystdlib-train", "pystdlib-val")
# Synthetic corpora, generated (seeded) by the module named: its corpus_text(name) returns the text.
SYNTHETIC_CORPORA: dict[str, str] = {"assoc-recall-train": "paretolab.tasks.assoc_recall", "assoc-recall-val": "paretolab.tasks.assoc_recall",
                                     "arith-train": "paretolab.tasks.arith_corpus", "arith-val": "paretolab.tasks.arith_corpus",
                                     "moe-mix-train": "paretolab.plugins.moe.corpus", "moe-mix-val": "paretolab.plugins.moe.corpus",
                                     "moe-mix-calib": "paretolab.plugins.moe.corpus",
                                     "addition-train": "paretolab.training.arithmetic", "addition-val": "paretolab.training.arithmetic",
                                     "numeric-train": "paretolab.training.arithmetic", "numeric-val": "paretolab.training.arithmetic"}
BUILTIN_CORPORA = ("pydoc", *PYSTDLIB_CORPORA, *SYNTHETIC_CORPORA)  # built here: no data dir or network needed
PYSTDLIB_VAL_PERCENT = 3  # a file is held out when sha256(its relative path) mod 100 < this
# Left out: tests (code about code, much of it deliberately odd), IDLE, and pydoc_data (the
# prose of the `pydoc` corpus, kept unseen so it stays an out-of-distribution evaluation).
PYSTDLIB_EXCLUDED_DIRS = frozenset({"site-packages", "dist-packages", "test", "tests", "idlelib", "pydoc_data"})

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


def pydoc_text() -> str:
    """The built-in corpus: the Python reference manual's prose from ``pydoc_data.topics``."""
    from pydoc_data.topics import topics

    return "\n\n".join(topics[key].strip() for key in sorted(topics))


def python_version() -> str:
    import sys

    return f"{sys.version_info.major}.{sys.version_info.minor}"


def pystdlib_files() -> list[tuple[str, Path]]:
    """(relative posix path, file) of every standard-library .py source in the corpus, sorted by relative path."""
    import sysconfig

    root = Path(sysconfig.get_paths()["stdlib"])
    files = []
    for path in root.rglob("*.py"):
        relative = path.relative_to(root)
        if not PYSTDLIB_EXCLUDED_DIRS.intersection(relative.parts[:-1]):
            files.append((relative.as_posix(), path))
    return sorted(files)


def pystdlib_split(relative: str) -> str:
    """``"pystdlib-val"`` or ``"pystdlib-train"``: fixed by the sha256 of the file's relative path, not by chance."""
    bucket = int.from_bytes(hashlib.sha256(relative.encode("utf-8")).digest()[:8], "big") % 100
    return "pystdlib-val" if bucket < PYSTDLIB_VAL_PERCENT else "pystdlib-train"


def pystdlib_text(name: str) -> str:
    """One split of the standard-library corpus: its files in path order, each under a ``# file:`` line."""
    parts = [f"# file: {relative}\n{path.read_text(encoding='utf-8')}" for relative, path in pystdlib_files() if pystdlib_split(relative) == name]
    return "\n\n".join(parts)


def _warn_unpinned(name: str, digest: str, pinned: str | None) -> None:
    if pinned and pinned != digest:
        warnings.warn(
            f"corpus {name!r} on this Python differs from the pinned text ({digest[:12]} != {pinned[:12]}); "
            "perplexities and trained models are not comparable with runs on other machines",
            stacklevel=3,
        )


def sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


@lru_cache(maxsize=8)
def load_corpus(name: str) -> tuple[str, str]:
    """(text, sha256) of a corpus: ``pydoc``, ``pystdlib-train``, ``pystdlib-val``, a synthetic one (``assoc-recall-train``/``-val``, ``arith-train``/``-val``, ``addition-train``/``-val``, ``moe-mix-*``),
    ``wikitext2``, or a path to a UTF-8 text file."""
    if name == "pydoc":
        text = pydoc_text()
        digest = sha256_text(text)
        _warn_unpinned(name, digest, PYDOC_SHA256.get(python_version()))
        return text, digest
    if name in PYSTDLIB_CORPORA:
        text = pystdlib_text(name)
        digest = sha256_text(text)
        _warn_unpinned(name, digest, PYSTDLIB_SHA256.get(python_version(), {}).get(name))
        return text, digest
    if name in SYNTHETIC_CORPORA:
        import importlib

        text = importlib.import_module(SYNTHETIC_CORPORA[name]).corpus_text(name)
        return text, sha256_text(text)
    if name in KNOWN_FILES:
        relative, url = KNOWN_FILES[name]
        text = find_data_file(relative, url=url).read_text(encoding="utf-8")
        return text, sha256_text(text)
    path = Path(name).expanduser()
    if path.is_file():
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError as exc:
            raise ConfigError(f"corpus {name!r} is not UTF-8 text ({exc})") from exc
        return text, sha256_text(text)
    raise ConfigError(
        f"corpus {name!r} is neither a built-in corpus ({', '.join(BUILTIN_CORPORA + tuple(KNOWN_FILES))}) nor a readable file"
    )


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


def calibration_ids(tokenizer: Any, *, corpus: str = "pydoc", n_samples: int = 16, seq_len: int = 256, seed: int = 0) -> Any:
    """(n_samples, seq_len) token ids cut at seeded random offsets from a corpus, for calibration."""
    import torch

    ids, starts = _calibration_windows(tokenizer, corpus, n_samples, seq_len, seed)
    return torch.stack([ids[s : s + seq_len] for s in starts.tolist()])


def heldout_calibration_ids(tokenizer: Any, *, corpus: str = "pydoc", n_samples: int = 16, seq_len: int = 256, seed: int = 0,
                            n_heldout: int = 1) -> Any:
    """(n_heldout, seq_len) windows of the corpus sharing no token with ``calibration_ids`` of the same arguments.

    For scores reported as held-out (e.g. an SQNR): they are measured on tokens the fit never saw.
    """
    import torch

    ids, starts = _calibration_windows(tokenizer, corpus, n_samples, seq_len, seed)
    candidates = torch.arange(0, ids.numel() - seq_len + 1, device="cpu")
    free = ((candidates[:, None] - starts[None, :]).abs() >= seq_len).all(dim=1)  # no overlap with any fit window
    choices = candidates[free]
    if choices.numel() < n_heldout:
        raise ConfigError(f"corpus {corpus!r} has no room for {n_heldout} held-out window(s) of {seq_len} tokens beside "
                          f"{n_samples} calibration windows; lower calib_samples or calib_seq_len")
    gen = torch.Generator(device="cpu").manual_seed(seed + 1)
    picked = choices[torch.randperm(choices.numel(), generator=gen, device="cpu")[:n_heldout]]
    return torch.stack([ids[s : s + seq_len] for s in picked.tolist()])


def _calibration_windows(tokenizer: Any, corpus: str, n_samples: int, seq_len: int, seed: int) -> tuple[Any, Any]:
    """(every token id of ``corpus``, the seeded start of each calibration window)."""
    import torch

    text, _ = load_corpus(corpus)
    ids = torch.tensor(encode(tokenizer, text), dtype=torch.long, device="cpu")  # callers move the batch to the model
    if ids.numel() <= seq_len:
        raise ConfigError(f"corpus {corpus!r} has {ids.numel()} tokens, fewer than seq_len={seq_len}")
    gen = torch.Generator(device="cpu").manual_seed(seed)
    return ids, torch.randint(0, ids.numel() - seq_len, (n_samples,), generator=gen, device="cpu")


def encode(tokenizer: Any, text: str) -> list[int]:
    """Token ids of ``text`` without special tokens, for any HF-style tokenizer."""
    try:
        return list(tokenizer.encode(text, add_special_tokens=False))
    except TypeError:
        return list(tokenizer.encode(text))
