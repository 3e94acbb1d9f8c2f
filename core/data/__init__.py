"""Data that needs no hub: corpora by name, data files (offline first), token windows, recorded model calls.

- :mod:`paretolab.data.files` — the data dirs searched, the cache dir, named files, jsonl rows.
- :mod:`paretolab.data.corpora` — corpora by name (built-in, synthetic, named files, paths), pinned by sha256.
- :mod:`paretolab.data.tokens` — seeded calibration windows and held-out windows of a corpus.
- :mod:`paretolab.data.recorded` — outputs of expensive model calls, recorded once under a content key.

This package imports nothing of paretolab's but :mod:`paretolab.errors`: everything above may use it.
"""

from paretolab.data.corpora import (
    BUILTIN_CORPORA,
    PYSTDLIB_CORPORA,
    SYNTHETIC_CORPORA,
    corpus_identity,
    load_corpus,
    pydoc_text,
    pystdlib_files,
    pystdlib_split,
    python_version,
    sha256_text,
)
from paretolab.data.files import (
    CHECKOUT,
    DATA_ENV,
    KNOWN_FILES,
    cache_dir,
    data_dirs,
    find_data_file,
    read_jsonl,
)
from paretolab.data.tokens import calibration_ids, encode, heldout_calibration_ids

__all__ = [
    "BUILTIN_CORPORA",
    "CHECKOUT",
    "DATA_ENV",
    "KNOWN_FILES",
    "PYSTDLIB_CORPORA",
    "SYNTHETIC_CORPORA",
    "cache_dir",
    "calibration_ids",
    "corpus_identity",
    "data_dirs",
    "encode",
    "find_data_file",
    "heldout_calibration_ids",
    "load_corpus",
    "pydoc_text",
    "pystdlib_files",
    "pystdlib_split",
    "python_version",
    "read_jsonl",
    "sha256_text",
]
