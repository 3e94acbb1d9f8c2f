"""What run_trial hands a method in its TrialContext."""

from __future__ import annotations

import torch

from paretolab.plugin_api.manager import registries
from paretolab.records import StagePlan, TrialSettings
from paretolab.study.trial import run_trial


def test_ctx_device_is_the_subjects_device(tiny, monkeypatch):
    """A method reads ctx.device to place new tensors; it is where the model lives, not always the CPU."""
    seen = []

    def record(subject, params, ctx):
        seen.append(ctx.device)
        raise RuntimeError("stop after the transform")

    monkeypatch.setattr(registries().methods.get("none"), "transform", record)
    tiny.model.to("meta")  # a device other than the CPU that exists everywhere
    settings = TrialSettings("ctx", "perplexity", {"max_tokens": 64, "context": 32, "stride": 32}, {}, seed=0)
    result = run_trial(tiny, [StagePlan("stage0", "none", {})], settings, number=3)
    assert "stop after the transform" in result.error
    assert seen == [torch.device("meta")]
