"""The pystdlib corpora (fixed split by path hash, sizes, pinned text) and the BPE tokenizer trained on them."""

from __future__ import annotations

import warnings

import pytest

from paretolab.data import (
    calibration_ids,
    load_corpus,
    pystdlib_files,
    pystdlib_split,
    python_version,
)
from paretolab.data.corpora import PYSTDLIB_SHA256
from paretolab.errors import ConfigError
from paretolab.plugin_api.options import parse_options
from paretolab.tasks.perplexity import PerplexityOptions
from paretolab.training import tokenizer as tok


def test_split_is_disjoint_complete_and_fixed_by_path():
    files = [relative for relative, _ in pystdlib_files()]
    train = {r for r in files if pystdlib_split(r) == "pystdlib-train"}
    val = {r for r in files if pystdlib_split(r) == "pystdlib-val"}
    assert train.isdisjoint(val) and train | val == set(files)
    assert files == sorted(files) and not any(part in ("test", "tests", "idlelib", "site-packages", "pydoc_data")
                                              for r in files for part in r.split("/")[:-1])
    # the same files every time: the split depends on the relative path only (these hold on any Python)
    assert [pystdlib_split(r) for r in ("fnmatch.py", "pprint.py", "unittest/mock.py", "os.py", "json/decoder.py")] == \
        ["pystdlib-val"] * 3 + ["pystdlib-train"] * 2
    assert 0.01 < len(val) / len(files) < 0.06


def test_corpora_sizes_and_each_file_under_its_header():
    train, train_sha = load_corpus("pystdlib-train")
    val, val_sha = load_corpus("pystdlib-val")
    assert len(train.encode()) > 9_000_000 and 150_000 < len(val.encode()) < 1_500_000
    assert "# file: fnmatch.py\n" in val and "# file: fnmatch.py\n" not in train and "# file: os.py\n" in train
    assert train_sha != val_sha


@pytest.mark.skipif(python_version() not in PYSTDLIB_SHA256, reason="the corpora are pinned for Python 3.11 only")
def test_text_is_pinned_for_this_python_without_a_warning():
    load_corpus.cache_clear()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a differing stdlib warns; the pinned one must not
        for name in ("pystdlib-train", "pystdlib-val"):
            assert load_corpus(name)[1] == PYSTDLIB_SHA256[python_version()][name]


def test_names_pass_task_validation_and_calibration():
    assert parse_options(PerplexityOptions, {"corpus": "pystdlib-val"}, where="task").corpus == "pystdlib-val"
    with pytest.raises(ConfigError, match="pystdlib-train, pystdlib-val"):
        parse_options(PerplexityOptions, {"corpus": "pystdlib"}, where="task")
    ids = calibration_ids(tok.pystdlib_tokenizer(), corpus="pystdlib-val", n_samples=3, seq_len=32)
    assert tuple(ids.shape) == (3, 32) and int(ids.max()) < tok.VOCAB_SIZE


def test_tokenizer_is_cached_by_corpus_sha_and_loads_without_training(monkeypatch):
    path = tok.ensure_tokenizer()
    assert path.parent.name == "tokenizers" and load_corpus("pystdlib-train")[1][:16] in path.name
    monkeypatch.setattr(tok, "train_bpe", lambda *a, **k: pytest.fail("trained again despite the cache"))
    tokenizer = tok.pystdlib_tokenizer()
    assert len(tokenizer) == tok.VOCAB_SIZE <= 8192
    assert (tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id) == (0, 1, 2)
    val, _ = load_corpus("pystdlib-val")
    ids = tokenizer.encode(val, add_special_tokens=False)
    assert tokenizer.decode(ids) == val  # byte-level: every text round-trips
    assert 3.0 < len(val.encode()) / len(ids) < 4.0  # 3.36 bytes/token on CPython 3.11.7


def test_training_is_deterministic():
    text = load_corpus("pystdlib-train")[0][:300_000]
    first, second = tok.train_bpe(text, 1024), tok.train_bpe(text, 1024)
    assert first.to_str() == second.to_str() and first.get_vocab_size() == 1024
