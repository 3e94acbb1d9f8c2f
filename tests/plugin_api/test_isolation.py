"""Trials cannot damage each other: the shared tokenizer, the per-trial GPU peak."""

from __future__ import annotations

import copy

import pytest

from paretolab import Method
from paretolab.records import StagePlan, TrialSettings
from paretolab.study.trial import run_trial


class GrowTokenizer(Method):
    """A careless tokenizer method: adds a token to the tokenizer it was handed, in place."""

    name = "grow_tokenizer"
    kind = "tokenizer"

    def transform(self, subject, params, ctx):
        subject.tokenizer.add_tokens(["<careless>"])
        return subject


class PadInPlace(Method):
    name = "pad_in_place"
    kind = "tokenizer"

    def transform(self, subject, params, ctx):
        subject.tokenizer.padding_side = "left"
        return subject


class GrowACopy(Method):
    """The right way: replace the subject's tokenizer with a changed copy."""

    name = "grow_a_copy"
    kind = "tokenizer"

    def transform(self, subject, params, ctx):
        subject.tokenizer = copy.deepcopy(subject.tokenizer)
        subject.tokenizer.add_tokens(["<careful>"])
        return subject


@pytest.fixture
def registered():
    from paretolab.plugin_api import manager as plugin_manager

    methods = plugin_manager.registries().methods
    for method in (GrowTokenizer(), PadInPlace(), GrowACopy()):
        methods.register(method, owner="tests")
    yield
    plugin_manager.reset()


SETTINGS = TrialSettings("iso", "perplexity", {"max_tokens": 64, "context": 32, "stride": 32}, {"params": {}}, seed=0)


@pytest.mark.parametrize("culprit", ["grow_tokenizer", "pad_in_place"])
def test_a_method_that_mutates_the_shared_tokenizer_fails_and_the_next_trial_is_unharmed(tiny, registered, culprit):
    size, side = len(tiny.tokenizer), tiny.tokenizer.padding_side
    bad = run_trial(tiny, [StagePlan("stage0", culprit, {})], SETTINGS, number=0)
    assert bad.failed and f"method {culprit!r} changed the shared tokenizer in place" in bad.error
    assert "\n" not in bad.error
    # the base the worker keeps is back to what it was: the next trial, of an unrelated method, sees the original
    assert (len(tiny.tokenizer), tiny.tokenizer.padding_side) == (size, side)
    good = run_trial(tiny, [StagePlan("stage0", "none", {})], SETTINGS, number=1)
    assert not good.failed, good.error
    assert (len(tiny.tokenizer), tiny.tokenizer.padding_side) == (size, side)


def test_a_method_that_replaces_the_tokenizer_with_a_copy_is_fine(tiny, registered):
    size = len(tiny.tokenizer)
    result = run_trial(tiny, [StagePlan("stage0", "grow_a_copy", {})], SETTINGS, number=0)
    assert not result.failed, result.error
    assert len(tiny.tokenizer) == size


def test_peak_gpu_memory_is_reset_for_each_trial(tiny, monkeypatch):
    import torch

    calls = []
    peaks = iter([3 * 2**20, 1 * 2**20])  # the first trial peaks at 3 MiB, the second at 1 MiB
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda *a, **k: calls.append("reset"))
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda *a, **k: calls.append("read") or next(peaks))
    first = run_trial(tiny, [StagePlan("stage0", "none", {})], SETTINGS, number=0)
    second = run_trial(tiny, [StagePlan("stage0", "none", {})], SETTINGS, number=1)
    assert calls == ["reset", "read", "reset", "read"]
    assert (first.metrics["peak_gpu_mb"], second.metrics["peak_gpu_mb"]) == (3.0, 1.0)
