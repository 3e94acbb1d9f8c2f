"""A compact form that falls back from compressed-tensors to paretolab's own layout says why (output and paretolab.json)."""

from __future__ import annotations

import pytest

import paretolab
from paretolab.api import compact
from paretolab.data import compressed


@pytest.fixture
def quantized(tiny):
    return paretolab.apply(tiny.model, "rtn", tokenizer=tiny.tokenizer, bits=8, group_size=32).subject


def write(subject, tmp_path):
    why: list[str] = []
    formats = compact.write(subject, compact.dense_twin(subject), tmp_path / "compact", why)
    return formats, why


def test_without_compressed_tensors_the_fallback_says_so(quantized, tmp_path, monkeypatch):
    monkeypatch.setattr(compressed, "available", lambda: False)
    formats, why = write(quantized, tmp_path)
    assert set(formats.values()) == {"int8"} and why == ["compressed-tensors is not installed (pip install compressed-tensors)"]


@pytest.mark.skipif(not compressed.available(), reason="compressed-tensors is not installed here")
def test_a_reload_that_differs_says_by_how_much(quantized, tmp_path, monkeypatch):
    monkeypatch.setattr(compressed, "logit_gap", lambda *a: 0.5)
    formats, why = write(quantized, tmp_path)
    assert set(formats.values()) == {"int8"} and "differs from the trial's model by 0.5" in why[0] and "int8 groups of 32" in why[0]


@pytest.mark.skipif(not compressed.available(), reason="compressed-tensors is not installed here")
def test_a_scheme_compressed_tensors_refuses_says_its_error(quantized, tmp_path, monkeypatch):
    def refuse(*a, **k):
        raise ValueError("group size 32 not supported for int8")

    monkeypatch.setattr("compressed_tensors.quantization.apply_quantization_config", refuse)
    _, why = write(quantized, tmp_path)
    assert why == ["compressed-tensors refused it: ValueError: group size 32 not supported for int8"]


def test_the_export_prints_the_reason(tmp_path):
    from paretolab.api.export import Exported

    done = Exported(out=tmp_path, study="s", trial=1, compact={"w": "int8"}, compact_fallback="compressed-tensors is not installed")
    assert "  compact/ is paretolab's own layout, not compressed-tensors: compressed-tensors is not installed" in done.lines()
