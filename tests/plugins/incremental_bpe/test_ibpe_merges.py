"""The merge-structure facts the algorithm rests on: reachability and pair compatibility."""

from __future__ import annotations

import random
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from paretolab.plugins.incremental_bpe import IncrementalBPE
from paretolab.plugins.incremental_bpe._forest import build_forest
from paretolab.plugins.incremental_bpe._reference import ReferenceBPE
from paretolab.plugins.incremental_bpe._vocab import (
    BPETables,
    bpe_by_merging,
    build_tables,
    bytes_to_unicode,
)


def test_reachable_tokens_are_exactly_those_bpe_outputs_whole(tok_py: IncrementalBPE) -> None:
    tables = tok_py.tables
    for tid, data in enumerate(tables.token_bytes):
        if data:
            assert tables.reachable[tid] == (bpe_by_merging(tables, data) == [tid]), tid
    assert sum(tables.reachable) == 49135  # every merge result; only the 17 added tokens are not


def _pair_sample(tables: BPETables, n: int, seed: int) -> list[tuple[int, int]]:
    """Random pairs, plus pairs built to be tricky: a token with a piece of its own split."""
    rng = random.Random(seed)
    ids = [t for t in range(tables.vocab_size) if tables.reachable[t]]
    pairs = [(rng.choice(ids), rng.choice(ids)) for _ in range(n)]
    for _ in range(n):
        t = rng.choice([t for t in ids[:5000] if tables.rank[t] >= 0] or ids)
        pairs += [(tables.left[t], tables.right[t]), (t, tables.right[t]), (tables.left[t], t), (t, t)]
    return pairs


def test_compatible_means_the_pair_retokenizes_to_itself(tok_py: IncrementalBPE) -> None:
    tables = tok_py.tables
    disagree = []
    n_compatible = 0
    for a, b in _pair_sample(tables, 3000, seed=0):
        truth = bpe_by_merging(tables, tables.token_bytes[a] + tables.token_bytes[b]) == [a, b]
        n_compatible += truth
        if tables.compatible(a, b) != truth:
            disagree.append((a, b))
    assert not disagree
    assert 1000 < n_compatible < 14000  # the sample has both kinds


def _forest_disagreements(tables: BPETables, texts: list[bytes]) -> tuple[list[tuple[bytes, int]], int]:
    """Check the suffix forest's interval test against merging, for every token ending each text.

    The tokens that ever sit at the end of BPE(text) are the final last token ``f`` and its right
    spine (``right[f]``, ``right[right[f]]``, ...): the end only grows by merging with its left
    neighbour. The test must pass exactly for those, given the true last token of every prefix.
    """
    forest = build_forest(tables)
    reachable_by_bytes: dict[bytes, int] = {}
    for tid, data in enumerate(tables.token_bytes):
        if data and tables.reachable[tid]:
            reachable_by_bytes[data] = tid
    bad, n_pass = [], 0
    for text in texts:
        node_at = [0] + [forest.node_of[bpe_by_merging(tables, text[:j])[-1]] for j in range(1, len(text) + 1)]
        spine, t = set(), bpe_by_merging(tables, text)[-1]
        while t >= 0:
            spine.add(t)
            t = tables.right[t]
        for tid in (reachable_by_bytes.get(text[k:]) for k in range(len(text))):
            if tid is None:
                continue
            ok = forest.ends_here(forest.node_of[tid], node_at, len(text))
            n_pass += ok
            if ok != (tid in spine):
                bad.append((text, tid))
    return bad, n_pass


def test_forest_test_passes_exactly_for_the_tokens_that_reach_the_end(tok_py: IncrementalBPE) -> None:
    tables = tok_py.tables
    pairs = _pair_sample(tables, 300, seed=1)
    texts = [tables.token_bytes[a] + tables.token_bytes[b] for a, b in pairs]
    texts += [b"-" * n for n in range(1, 70)] + [b"nnn", b"aaaa", b"    x", b"<<<<", b"0000000"]
    bad, n_pass = _forest_disagreements(tables, texts)
    assert not bad, bad[:5]
    assert n_pass > len(texts)  # more than one token per text reached the end: spines were walked


# --- random small vocabularies: stress the seam rule far beyond one real vocabulary ---

_B2U = bytes_to_unicode()


def _random_tables(seed: int, n_merges: int, alphabet: str) -> BPETables:
    rng = random.Random(seed)
    vocab = {_B2U[b]: b for b in range(256)}
    made = list(alphabet)
    merges = []
    for _ in range(n_merges * 4):
        if len(merges) == n_merges:
            break
        a, b = rng.choice(made), rng.choice(made)
        if a + b in vocab or len(a + b) > 12:
            continue
        vocab[a + b] = len(vocab)
        merges.append((a, b))
        made.append(a + b)
    return build_tables(vocab, merges)


@settings(max_examples=50, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    n_merges=st.integers(1, 40),
    alphabet=st.sampled_from(["ab", "abc", "a"]),
    words=st.lists(st.text(alphabet="abc", max_size=30), min_size=1, max_size=4),
    cut_seed=st.integers(0, 1000),
)
def test_incremental_bpe_equals_merging_on_random_vocabularies(
    seed: int, n_merges: int, alphabet: str, words: list[str], cut_seed: int
) -> None:
    tables = _random_tables(seed, n_merges, alphabet)
    bpe = ReferenceBPE(tables)
    engine = _c_engine_or_none(tables)
    rng = random.Random(cut_seed)
    for text in words:
        word = text.encode()
        expected = bpe_by_merging(tables, word)
        assert bpe.encode_word(word) == expected
        for impl in [bpe] + ([engine] if engine else []):
            assert impl.encode_word(word) == expected
            eager = impl.eager_word()
            out: list[int] = []
            at = 0
            while at < len(word):
                step = rng.randint(1, 5)
                emitted = eager.push(word[at : at + step])
                at += step
                # what was emitted is final: every continuation keeps it
                for tail in (b"", rng.choice([b"a", b"b", b"c"]) * rng.randint(1, 6)):
                    full = bpe_by_merging(tables, word[:at] + tail)
                    assert full[: len(out) + len(emitted)] == out + emitted
                out += emitted
            assert out + eager.finish() == expected


def _c_engine_or_none(tables: BPETables) -> Any:
    from paretolab.plugins.incremental_bpe._tokenizer import (
        _c_engine,
        c_extension_available,
    )

    return _c_engine(tables) if c_extension_available() else None


def test_a_token_over_255_bytes_falls_back_to_the_python_path_and_says_so() -> None:
    import pytest

    from paretolab.errors import ConfigError
    from paretolab.plugins.incremental_bpe import c_extension_available

    vocab = {_B2U[b]: b for b in range(256)}
    merges, piece = [], "a"
    while len(piece) < 256:  # a, aa, aaaa, ..., a*256, then a*288
        merges.append((piece, piece))
        piece += piece
        vocab[piece] = len(vocab)
    merges.append((piece, "a" * 32))
    vocab[piece + "a" * 32] = len(vocab)
    tables = build_tables(vocab, merges)
    if not c_extension_available():
        pytest.fail("the C extension _fast is not built: run `pip install -e .`")
    with pytest.warns(UserWarning, match="256 bytes long; the C path keeps lengths in one byte"):
        tok = IncrementalBPE(tables)
    assert tok.backend == "python"
    assert tok.encode("a" * 700) == bpe_by_merging(tables, b"a" * 700)
    with pytest.raises(ConfigError, match="backend='c' cannot take this vocabulary"):
        IncrementalBPE(tables, backend="c")
