"""The table file: a later process loads it instead of building; a damaged or stale one is rebuilt, never read."""

from __future__ import annotations

import os
import struct
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from paretolab.plugins.incremental_bpe import IncrementalBPE, _cache, _tokenizer, c_extension_available
from paretolab.plugins.incremental_bpe._vocab import bpe_by_merging, build_tables, bytes_to_unicode

SAMPLE = "Hello world, it's 2026: <|im_start|>user\n naïve 漢字 😀 -- qwertyuiopasdfghjkl\n\n"

pytestmark = pytest.mark.skipif(not c_extension_available(), reason="the table file belongs to the C engine")


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("PARETOLAB_CACHE", str(tmp_path))
    monkeypatch.delenv(_cache.ENV_DISABLE, raising=False)
    return tmp_path / "incremental_bpe"


def _no_build(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: Any) -> Any:
        raise AssertionError("the engine was built, not loaded from its table file")

    monkeypatch.setattr(_tokenizer, "_c_engine", refuse)


def _the_file(cache: Path) -> Path:
    files = [p for p in cache.iterdir() if p.suffix == ".ibpe"]
    assert len(files) == 1, files
    return files[0]


def _payload_section(data: bytes | bytearray, k: int) -> int:
    """Absolute file offset of the C dump's section ``k`` (0 node_token ... 3 states ... 6 classes)."""
    payload_at = _cache.PREFIX.unpack_from(data)[4]
    return payload_at + struct.unpack_from("<7q", data, payload_at + 48)[k]


def _rewrite(path: Path, data: bytearray, *, fix_crc: bool) -> None:
    if fix_crc:  # a damage the checksum cannot see: only the C checks stand between it and the encoder
        fields = list(_cache.PREFIX.unpack_from(data))
        fields[-1] = zlib.crc32(bytes(data[_cache.PREFIX.size :]))
        _cache.PREFIX.pack_into(data, 0, *fields)
    path.write_bytes(bytes(data))


def test_a_second_process_loads_the_file_and_builds_nothing(cache: Path, hf: Any, hf_ids: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    first = IncrementalBPE.from_hf(hf)
    path = _the_file(cache)
    assert [p.name for p in cache.iterdir()] == [path.name]  # no temporary file left behind
    _no_build(monkeypatch)
    again = IncrementalBPE.from_hf(hf)
    assert again.backend == "c" and again._tables is None  # nothing read into Python
    assert again.encode(SAMPLE) == first.encode(SAMPLE) == hf_ids(SAMPLE)
    assert again.tables.token_bytes == first.tables.token_bytes  # read on first use


@pytest.mark.parametrize("damage", ["flipped class byte", "truncated", "empty", "other layout"])
def test_a_damaged_file_is_refused_and_rebuilt(damage: str, cache: Path, hf: Any, hf_ids: Any) -> None:
    IncrementalBPE.from_hf(hf)
    path = _the_file(cache)
    data = bytearray(path.read_bytes())
    if damage == "flipped class byte":  # 'a' becomes a NUMBER: still a valid class, so only the CRC sees it
        data[_payload_section(data, 6) + ord("a")] = 2
    elif damage == "truncated":
        data = data[: len(data) - 4096]
    elif damage == "empty":
        data = bytearray()
    else:  # the C tables of another build of _fast (the prefix is outside the CRC)
        fields = list(_cache.PREFIX.unpack_from(data))
        fields[2] += 1
        _cache.PREFIX.pack_into(data, 0, *fields)
    path.write_bytes(bytes(data))
    assert _cache.load(path.stem) is None and _cache.last_refusal
    tok = IncrementalBPE.from_hf(hf)
    assert tok.encode(SAMPLE) == hf_ids(SAMPLE)
    assert _cache.load(path.stem) is not None  # rewritten sound


def _fail_past_the_table(data: bytearray, at: int) -> None:
    struct.pack_into("<i", data, at + 8, 1 << 30)


def _another_shallow_row(data: bytearray, at: int) -> None:
    data[at + 15] ^= 1  # the chain field's top byte: the shallow row the state steps by


@pytest.mark.parametrize(("damage", "refusal"), [(_fail_past_the_table, "fails to"), (_another_shallow_row, "wrong shallow row")])
def test_a_bad_state_behind_a_good_checksum_is_refused_by_the_c_checks(
    damage: Callable[[bytearray, int], None], refusal: str, cache: Path, hf: Any, hf_ids: Any
) -> None:
    IncrementalBPE.from_hf(hf)
    path = _the_file(cache)
    data = bytearray(path.read_bytes())
    states = _payload_section(data, 3)
    state_size = 32
    for s in range(1, 200):  # the first used state after the root
        if struct.unpack_from("<i", data, states + s * state_size + 4)[0] != -1:
            damage(data, states + s * state_size)
            break
    _rewrite(path, data, fix_crc=True)
    assert _cache.load(path.stem) is None
    assert refusal in str(_cache.last_refusal)
    assert IncrementalBPE.from_hf(hf).encode(SAMPLE) == hf_ids(SAMPLE)


def test_a_stale_file_under_this_vocabularys_name_is_rebuilt(cache: Path, hf: Any) -> None:
    b2u = bytes_to_unicode()
    vocab = {b2u[b]: b for b in range(256)}
    merges = [("a", "b"), ("ab", "c"), ("c", "c"), ("abc", "cc")]
    for a, b in merges:
        vocab[a + b] = len(vocab)
    small = build_tables(vocab, merges)
    IncrementalBPE.from_hf(hf)  # SmolLM2's file ...
    smol = _the_file(cache)
    key = _cache.tables_key(small)
    os.replace(smol, _cache.path_for(key))  # ... planted under the small vocabulary's name: a sound file, for another vocabulary
    assert _cache.load(key) is None and "another vocabulary" in str(_cache.last_refusal)
    tok = IncrementalBPE(small)
    text = "abccabcabcccab"
    assert tok.encode(text) == bpe_by_merging(small, text.encode())
    hit = _cache.load(key)
    assert hit is not None and hit[0].encode_text(text) == tok.encode(text)


def test_the_key_follows_the_merges_not_just_the_tokens() -> None:
    b2u = bytes_to_unicode()
    vocab = {b2u[b]: b for b in range(256)} | {"ab": 256, "bc": 257}
    one = build_tables(vocab, [("a", "b"), ("b", "c")])
    other = build_tables(vocab, [("b", "c"), ("a", "b")])  # same tokens, merges in the other order
    assert _cache.tables_key(one) != _cache.tables_key(other)
    spec = '{"model": {"merges": ["a b", "b c"]}}'
    assert _cache.spec_key(spec) != _cache.spec_key(spec.replace('"a b", "b c"', '"b c", "a b"'))


def test_an_unwritable_folder_only_costs_the_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, hf: Any, hf_ids: Any) -> None:
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")
    monkeypatch.setattr(_cache, "cache_folder", lambda: blocker / "incremental_bpe")
    tok = IncrementalBPE.from_hf(hf)
    assert tok.backend == "c" and tok.encode(SAMPLE) == hf_ids(SAMPLE)
    assert _cache.load(_cache.spec_key("x")) is None


def test_fresh_comes_from_the_same_file_with_an_empty_word_cache(cache: Path, hf: Any, hf_ids: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    IncrementalBPE.from_hf(hf)
    loaded = IncrementalBPE.from_hf(hf)
    _no_build(monkeypatch)
    fresh = loaded.fresh()
    assert fresh._engine is not loaded._engine and fresh._tables is None
    assert fresh.encode(SAMPLE) == hf_ids(SAMPLE)
