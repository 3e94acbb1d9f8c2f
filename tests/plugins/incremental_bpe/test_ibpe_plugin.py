"""The method plugin: registration, the tokenizer swap, and its cost metrics."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import torch

import paretolab
from paretolab.plugin_api.method import validate_method
from paretolab.plugins import incremental_bpe
from paretolab.plugins.incremental_bpe import (
    IncrementalBPEMethod,
    IncrementalBPETokenizer,
)


def _subject(hf: Any) -> paretolab.Subject:
    return paretolab.Subject(model=torch.nn.Linear(1, 1), tokenizer=hf, model_name="smollm2-135m")


def test_the_method_registers_with_its_metrics() -> None:
    methods: list[Any] = []
    metrics: list[Any] = []
    incremental_bpe.register_methods(methods.append)
    incremental_bpe.register_metrics(metrics.append)
    (method,) = methods
    validate_method(method, "paretolab.plugins.incremental_bpe")
    assert (method.name, method.kind, method.cost_is, method.search_space()) == ("incremental_bpe", "tokenizer", "real", {})
    assert "mtc-inc-bpe" in str(method.paper)
    assert {m.name for m in metrics} == {"tok_encode_mb_s", "tok_stream_p50_ms", "tok_stream_p99_ms", "tok_worst_ns_per_byte"}


def test_transform_swaps_in_a_tokenizer_with_identical_ids(hf: Any, tmp_path: Path) -> None:
    ctx = paretolab.TrialContext(seed=0, workdir=tmp_path)
    subject = IncrementalBPEMethod().transform(_subject(hf), {}, ctx)
    tok = subject.tokenizer
    assert isinstance(tok, IncrementalBPETokenizer)
    text = "Hello world! <|im_start|>user\n  x = 42\n"
    ids = tok.encode(text, add_special_tokens=False)
    assert ids == hf.encode(text, add_special_tokens=False)
    assert tok.decode(ids) == hf.decode(ids)
    assert (len(tok), tok.eos_token_id) == (len(hf), hf.eos_token_id)
    assert tok(text, return_tensors="pt")["input_ids"].tolist() == [ids]
    assert tok.name_or_path == hf.name_or_path  # the rest is the HF tokenizer's


def test_measure_reports_the_four_metrics_quickly(hf: Any, tmp_path: Path) -> None:
    ctx = paretolab.TrialContext(seed=0, workdir=tmp_path)
    method = IncrementalBPEMethod()
    subject = method.transform(_subject(hf), {}, ctx)
    start = time.perf_counter()
    metrics = method.measure(subject, ctx)
    assert time.perf_counter() - start < 5  # ~1 s on an idle machine
    assert set(metrics) == {"tok_encode_mb_s", "tok_stream_p50_ms", "tok_stream_p99_ms", "tok_worst_ns_per_byte"}
    assert all(v > 0 for v in metrics.values())
    assert metrics["tok_stream_p50_ms"] <= metrics["tok_stream_p99_ms"]


def test_throughput_is_timed_once_on_first_seen_text_and_the_worst_case_has_every_punctuation_run(hf: Any, monkeypatch: Any) -> None:
    import string

    from paretolab.plugins.incremental_bpe import (
        _PATHOLOGICAL,
        IncrementalBPE,
        measure_tokenizer,
    )

    calls: list[tuple[int, int]] = []  # (engine, text length) of every encode
    real = IncrementalBPE.encode

    def spy(self: IncrementalBPE, text: str) -> list[int]:
        calls.append((id(self), len(text)))
        return real(self, text)

    monkeypatch.setattr(IncrementalBPE, "encode", spy)
    given = IncrementalBPE.from_hf(hf)
    measure_tokenizer(given)
    first_engine, first_len = calls[0]
    assert first_engine != id(given), "a warm engine would time its word cache, not the text"
    assert first_len > 100_000 and [n for _, n in calls].count(first_len) == 1  # long, encoded once
    assert all(ch * 20_000 in _PATHOLOGICAL for ch in string.punctuation)
