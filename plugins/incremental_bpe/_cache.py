"""The C engine's tables on disk: built once per vocabulary, then memory-mapped by every process.

Building the automaton and the suffix forest takes about half a second of Python; loading them back
takes milliseconds. A table file lives under ``$PARETOLAB_CACHE/incremental_bpe/<key>.ibpe``, where
the key hashes the vocabulary and its merges (the tokenizer's whole serialized spec for
``from_hf``, the tables themselves otherwise) together with this file's format and the C layout
version, so another vocabulary or another build of ``_fast`` never finds this file under its name.

A file is written once, atomically (a temporary file in the same folder, then ``os.replace``), and
checked on every load: its magic, format, layout version, the sizes of its parts against the file's
size, a CRC-32 of everything after the fixed prefix, the key it says it was built for, and then, in
C, every index the encoder will follow (``_fast.load``). Anything that fails is rebuilt and
rewritten, never read: ``load`` returns None and says why in ``last_refusal``.
"""

from __future__ import annotations

import hashlib
import json
import mmap
import os
import struct
import tempfile
import zlib
from array import array
from pathlib import Path
from typing import Any

from paretolab.plugins.incremental_bpe._vocab import BPETables, SpecialToken

FORMAT = 1  # this file's own layout (prefix, metadata); the C tables carry _fast.LAYOUT_VERSION
MAGIC = b"IBPECACH"
PREFIX = struct.Struct("<8sIIQQQI4x")  # magic, format, layout, meta bytes, payload offset, payload bytes, crc32
PAGE = 4096  # the payload starts page-aligned, so the mapped tables keep their 64-byte alignment
ENV_DISABLE = "PARETOLAB_IBPE_CACHE"  # "0": neither read nor write table files

last_refusal: str | None = None  # why the latest load() found no usable file (tests read it)


def enabled() -> bool:
    return os.environ.get(ENV_DISABLE, "1") != "0"


def cache_folder() -> Path:
    from paretolab.data.files import cache_dir

    return cache_dir() / "incremental_bpe"


def path_for(key: str) -> Path:
    return cache_folder() / f"{key}.ibpe"


def _layout() -> int:
    from paretolab.plugins.incremental_bpe import _fast  # type: ignore[attr-defined]

    return int(_fast.LAYOUT_VERSION)


def _hasher(kind: str) -> Any:
    return hashlib.sha256(f"incremental_bpe tables, format {FORMAT}, layout {_layout()}, from {kind}\0".encode())


def spec_key(spec: str) -> str:
    """Key of a tokenizer's serialized spec (``Tokenizer.to_str()``: vocabulary, merges, added tokens, pipeline)."""
    h = _hasher("spec")
    h.update(spec.encode("utf-8"))
    return h.hexdigest()[:40]


def tables_key(tables: BPETables) -> str:
    """Key of the tables themselves: every token's bytes, the merges (rank, parts) and the added tokens."""
    h = _hasher("tables")
    h.update(array("q", [len(b) for b in tables.token_bytes]).tobytes())
    h.update(b"".join(tables.token_bytes))
    for column in (tables.rank, tables.left, tables.right, tables.byte_token, [int(r) for r in tables.reachable]):
        h.update(array("q", column).tobytes())
    h.update(json.dumps([[s.content, s.id] for s in tables.specials]).encode())
    return h.hexdigest()[:40]


def _refuse(why: str) -> None:
    global last_refusal
    last_refusal = why


def load(key: str) -> tuple[Any, list[SpecialToken]] | None:
    """The engine and added tokens stored under ``key``, or None (missing, damaged, stale: see ``last_refusal``)."""
    from paretolab.plugins.incremental_bpe import _fast  # type: ignore[attr-defined]

    _refuse(None)  # type: ignore[arg-type]
    path = path_for(key)
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size < PAGE:
                _refuse(f"{path.name}: {size} bytes, shorter than its header")
                return None
            flags = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)
            mm = mmap.mmap(f.fileno(), size, flags=flags, prot=mmap.PROT_READ)
    except FileNotFoundError:
        _refuse("no file")
        return None
    except OSError as exc:
        _refuse(f"{path.name}: {exc}")
        return None
    view = memoryview(mm)
    try:
        magic, fmt, layout, meta_len, payload_at, payload_len, crc = PREFIX.unpack_from(view)
        if magic != MAGIC or fmt != FORMAT or layout != _fast.LAYOUT_VERSION:
            _refuse(f"{path.name}: another format (magic {magic!r}, format {fmt}, layout {layout})")
            return None
        if payload_at % PAGE or PREFIX.size + meta_len > payload_at or payload_at + payload_len != size:
            _refuse(f"{path.name}: parts do not add up to its size ({size} bytes)")
            return None
        if zlib.crc32(view[PREFIX.size :]) != crc:
            _refuse(f"{path.name}: checksum mismatch")
            return None
        meta = json.loads(bytes(view[PREFIX.size : PREFIX.size + meta_len]))
        if meta.get("key") != key:
            _refuse(f"{path.name}: built for another vocabulary ({meta.get('key')})")
            return None
        specials = [SpecialToken(str(content), int(tid)) for content, tid in meta["specials"]]
        engine = _fast.load(view[payload_at:])  # keeps the mapping alive; checks every index it will follow
    except (ValueError, KeyError, TypeError, struct.error) as exc:  # json's errors are ValueErrors
        _refuse(f"{path.name}: {exc}")
        return None
    finally:
        view.release()  # the engine holds its own export of the mapping
    return engine, specials


def store(key: str, engine: Any, specials: list[SpecialToken]) -> Path | None:
    """Write ``engine``'s tables under ``key`` atomically; None when the folder cannot be written."""
    payload = engine.dump()
    meta = json.dumps({"key": key, "specials": [[s.content, s.id] for s in specials]}).encode()
    payload_at = -(-(PREFIX.size + len(meta)) // PAGE) * PAGE
    body = meta + bytes(payload_at - PREFIX.size - len(meta)) + payload
    prefix = PREFIX.pack(MAGIC, FORMAT, _layout(), len(meta), payload_at, len(payload), zlib.crc32(body))
    path = path_for(key)
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{key}.", suffix=".tmp")
        with os.fdopen(fd, "wb") as f:
            f.write(prefix)
            f.write(body)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        tmp = None
        return path
    except OSError:
        return None
    finally:
        if tmp is not None:
            try:
                os.unlink(tmp)
            except OSError:
                pass
