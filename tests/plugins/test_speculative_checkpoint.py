"""The EAGLE draft checkpoint loads with torch.load(weights_only=True): a crafted file runs no code."""

from __future__ import annotations

import pathlib

import pytest
import torch

from paretolab.errors import ConfigError
from paretolab.plugins.speculative.train import (
    TrainOptions,
    draft_finished,
    draft_path,
    load_draft,
    train_draft,
)


class _Planted:
    """Unpickling this touches a file: the stand-in for code a crafted checkpoint would run."""

    def __init__(self, marker: pathlib.Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (pathlib.Path.touch, (self.marker,))


def test_a_trained_draft_loads_weights_only_and_a_crafted_one_is_refused(tiny, tmp_path, monkeypatch):
    monkeypatch.setenv("PARETOLAB_CACHE", str(tmp_path / "cache"))
    options = TrainOptions(budget_min=0.005, max_tokens=512, seq_len=64, vocab=64)
    path = train_draft(tiny, options, log=lambda line: None, show_progress=False)
    assert load_draft("tiny-llama", tiny.model).meta["steps"] >= 1  # what train_draft saves loads with weights_only=True
    lines: list[str] = []
    train_draft(tiny, options, log=lines.append, show_progress=False)  # continuing reads it the same way
    assert any("continuing the draft" in line for line in lines)

    saved = torch.load(path, weights_only=True)
    marker = tmp_path / "code-ran"
    saved["meta"]["note"] = _Planted(marker)
    torch.save(saved, path)
    with pytest.raises(ConfigError, match="holds more than tensors and plain data, so it is not loaded"):
        load_draft("tiny-llama", tiny.model)
    with pytest.raises(ConfigError, match="draft train --fresh"):
        train_draft(tiny, options, log=lambda line: None, show_progress=False)
    assert not marker.exists() and path == draft_path("tiny-llama")


def test_a_checkpoint_cut_mid_budget_is_not_taken_for_a_finished_draft(tiny, tmp_path, monkeypatch):
    """`draft train --if-missing` (the results targets' prepare) skips only a draft whose run ended."""
    monkeypatch.setenv("PARETOLAB_CACHE", str(tmp_path / "cache"))
    assert not draft_finished("tiny-llama")
    path = train_draft(tiny, TrainOptions(budget_min=0.005, max_tokens=512, seq_len=64, vocab=64), log=lambda line: None, show_progress=False)
    assert draft_finished("tiny-llama")
    saved = torch.load(path, weights_only=True)
    saved["meta"]["curve"] = []  # what the per-minute save of a first run holds before its end
    torch.save(saved, path)
    assert not draft_finished("tiny-llama")
