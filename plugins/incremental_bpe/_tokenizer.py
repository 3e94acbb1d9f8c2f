"""IncrementalBPE: the public tokenizer and its stream, over a C or a pure-Python engine."""

from __future__ import annotations

import warnings
from typing import Any, Protocol

from paretolab.errors import ConfigError
from paretolab.plugins.incremental_bpe._forest import build_forest
from paretolab.plugins.incremental_bpe._pretokenize import (
    END,
    Scanner,
    SpecialSplitter,
    char_classes,
    pretokenize,
)
from paretolab.plugins.incremental_bpe._reference import ReferenceBPE
from paretolab.plugins.incremental_bpe import _cache
from paretolab.plugins.incremental_bpe._vocab import BPETables, SpecialToken, hf_spec, tables_from_spec

BACKENDS = ("auto", "c", "python")


class _Word(Protocol):
    def push(self, data: bytes) -> list[int]: ...
    def finish(self) -> list[int]: ...


class _PythonEngine:
    """The reference path: pure-Python pre-tokenizer and incremental BPE."""

    name = "python"

    def __init__(self, tables: BPETables) -> None:
        self.bpe = ReferenceBPE(tables)

    def encode_text(self, text: str) -> list[int]:
        out: list[int] = []
        for word in pretokenize(text):
            out += self.bpe.encode_word(word.encode("utf-8"))
        return out

    def encode_word(self, word: bytes) -> list[int]:
        return self.bpe.encode_word(word)

    def eager_word(self) -> _Word:
        return self.bpe.eager_word()


def _c_engine(tables: BPETables) -> Any:
    from paretolab.plugins.incremental_bpe import _fast  # type: ignore[attr-defined]

    forest = build_forest(tables)
    return _fast.Engine(
        b"".join(tables.token_bytes),
        [len(b) for b in tables.token_bytes],
        forest.node_of,
        forest.token,
        forest.right_len,
        forest.lo,
        forest.hi,
        tables.byte_token,
        bytes(char_classes()),
    )


def _c_engine_cached(tables: BPETables, key: str | None = None) -> Any:
    """The C engine for ``tables``: from its table file when a sound one exists, else built and stored."""
    key = key or _cache.tables_key(tables)
    hit = _cache.load(key)
    if hit is not None:
        return hit[0]
    engine = _c_engine(tables)
    _cache.store(key, engine, tables.specials)
    return engine


def c_extension_available() -> bool:
    """Whether the compiled fast path (``_fast``) was built by ``pip install -e .``."""
    try:
        from paretolab.plugins.incremental_bpe import _fast  # type: ignore[attr-defined]  # noqa: F401
    except ImportError:
        return False
    return True


class IncrementalBPE:
    """Byte-level BPE with identical output to the Hugging Face tokenizer it was built from.

    ``encode(text)`` equals ``hf.encode(text, add_special_tokens=False)``; ``stream()`` takes
    text in arbitrary pieces and returns each token as soon as it is final.

    The C engine's tables are kept in a table file per vocabulary (``_cache.py``; ``cache=False``
    or ``PARETOLAB_IBPE_CACHE=0`` turns it off): a process that finds a sound one maps it in
    milliseconds instead of building for half a second, and ``tables`` is then read on first use.
    """

    def __init__(self, tables: BPETables, *, backend: str = "auto", cache: bool = True) -> None:
        if backend not in BACKENDS:
            raise ConfigError(f"IncrementalBPE: backend must be one of {', '.join(BACKENDS)}; got {backend!r}")
        engine: Any = None
        if backend == "c" or (backend == "auto" and c_extension_available()):
            try:
                engine = _c_engine_cached(tables) if cache and _cache.enabled() else _c_engine(tables)
            except ValueError as exc:  # a vocabulary past the C path's limits (a token over 255 bytes)
                if backend == "c":
                    raise ConfigError(f"IncrementalBPE: backend='c' cannot take this vocabulary: {exc}") from exc
                warnings.warn(f"IncrementalBPE: using the Python reference: {exc}", stacklevel=2)
        self._setup(tables, None, engine if engine is not None else _PythonEngine(tables), tables.specials)

    def _setup(self, tables: BPETables | None, spec: str | None, engine: Any, specials: list[SpecialToken], key: str | None = None) -> None:
        self._tables = tables
        self._spec = spec  # where ``tables`` comes from when the engine came from a table file
        self._key = key  # that file's key
        self.backend = "python" if isinstance(engine, _PythonEngine) else "c"
        self._engine = engine
        self._specials = SpecialSplitter(specials)
        # the C engine finds added tokens itself, in the bytes it reads anyway (no pass of a regex, no list joined)
        self._engine_finds_specials = self.backend == "c" and self._specials.active
        if self._engine_finds_specials:
            engine.set_specials([(s.content.encode("utf-8"), s.id) for s in specials if s.content])

    @property
    def tables(self) -> BPETables:
        """Token bytes and merges (read from the tokenizer's spec on first use after a table-file load)."""
        if self._tables is None:
            assert self._spec is not None
            self._tables = tables_from_spec(self._spec)
        return self._tables

    @classmethod
    def from_hf(cls, hf_tokenizer: Any, *, backend: str = "auto", cache: bool = True) -> IncrementalBPE:
        """Build from a `transformers` tokenizer (or a `tokenizers.Tokenizer`).

        With the C engine, the table file is keyed by the tokenizer's serialized spec: a process
        that finds it reads neither the vocabulary nor the merges into Python.
        """
        spec = hf_spec(hf_tokenizer)
        use_file = cache and _cache.enabled() and backend in ("auto", "c") and c_extension_available()
        key = _cache.spec_key(spec) if use_file else None
        hit = _cache.load(key) if key is not None else None
        if hit is not None:
            self = cls.__new__(cls)
            self._setup(None, spec, hit[0], hit[1], key)
            return self
        self = cls(tables_from_spec(spec), backend=backend, cache=False)
        if key is not None and self.backend == "c":
            _cache.store(key, self._engine, self.tables.specials)
        return self

    def fresh(self) -> IncrementalBPE:
        """A new tokenizer over the same vocabulary with an empty word cache (from the same table file when there is one)."""
        hit = _cache.load(self._key) if self._key is not None else None
        if hit is None:
            return IncrementalBPE(self.tables, backend=self.backend)
        other = IncrementalBPE.__new__(IncrementalBPE)
        other._setup(self._tables, self._spec, hit[0], hit[1], self._key)
        return other

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text``; added tokens written in the text are recognised, as in HF."""
        if self._engine_finds_specials or not self._specials.active:
            return self._engine.encode_text(text)
        out: list[int] = []
        for part in self._specials.split(text):
            if isinstance(part, int):
                out.append(part)
            else:
                out += self._engine.encode_text(part)
        return out

    def stream(self) -> BPEStream:
        """A new incremental encoder: ``feed(chunk)`` returns final tokens, ``finish()`` the rest."""
        return BPEStream(self)


class BPEStream:
    """Encodes text that arrives in pieces; a piece boundary may fall anywhere, even inside a char run."""

    def __init__(self, tokenizer: IncrementalBPE) -> None:
        self._specials = tokenizer._specials
        self._scanner = Scanner()
        self._engine = tokenizer._engine
        self._word = self._engine.eager_word()
        self._word_empty = True  # nothing pushed into _word since its last finish()
        self._pending = ""  # text that may still turn out to be an added token

    def feed(self, chunk: str) -> list[int]:
        """Append ``chunk``; return the tokens that no later text can change."""
        text = self._pending + chunk
        out: list[int] = []
        while True:
            start, end, special = self._specials.first(text)
            self._scan(text[:start], special is not None, out)
            if special is None:
                self._pending = text[start:]
                return out
            out.append(special)
            text = text[end:]

    def finish(self) -> list[int]:
        """The text ended: return the remaining tokens; the stream is then ready for a new text."""
        out: list[int] = []
        for part in self._specials.split(self._pending):
            if isinstance(part, int):
                self._scan("", True, out)
                out.append(part)
            else:
                self._scan(part, True, out)
        self._scan("", True, out)
        self._pending = ""
        return out

    def _scan(self, text: str, at_end: bool, out: list[int]) -> None:
        pieces = self._scanner.feed(text, at_end)
        word = self._word
        i = 0
        while i < len(pieces):
            piece = pieces[i]
            if piece is END:
                out += word.finish()
                self._word_empty = True
            elif self._word_empty and i + 1 < len(pieces) and pieces[i + 1] is END:
                out += self._engine.encode_word(piece.encode("utf-8"))  # a whole pre-token at once
                i += 1
            else:
                out += word.push(piece.encode("utf-8"))
                self._word_empty = False
            i += 1
