"""A trial worker puts the base model on the trial's device: the GPU Ray assigned, or the CPU."""

from __future__ import annotations

import pytest
import torch

from paretolab.errors import ConfigError
from paretolab.records import StagePlan, TrialSettings
from paretolab.study.worker import TrialWorker, trial_device

SETTINGS = TrialSettings("device", "perplexity", {"max_tokens": 128, "context": 64, "stride": 64}, {"size": {}}, seed=0)


def test_a_cpu_trial_runs_on_the_cpu_and_says_so() -> None:
    worker = TrialWorker("tiny-llama", SETTINGS, gpus=0)
    result = worker.run([StagePlan("s", "none", {})], number=0)
    assert not result.failed, result.traceback
    assert result.info["device"] == "cpu"


def test_a_gpu_trial_without_cuda_is_refused_naming_the_field(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.delenv("PARETOLAB_SIMULATED_GPUS", raising=False)
    with pytest.raises(ConfigError, match=r"resources\.gpus: a trial asks for 1 GPU\(s\).*set resources\.gpus: 0"):
        trial_device(1)


def test_a_local_clusters_declared_gpus_run_on_the_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setenv("PARETOLAB_SIMULATED_GPUS", "1")
    assert trial_device(1) == torch.device("cpu")


@pytest.mark.gpu
def test_a_gpu_trial_runs_its_model_on_cuda() -> None:
    worker = TrialWorker("tiny-llama", SETTINGS, gpus=1)
    assert worker.base.device.type == "cuda"
    result = worker.run([StagePlan("s", "none", {})], number=0)
    assert not result.failed, result.traceback
    assert result.info["device"] == "cuda:0" and result.metrics["peak_gpu_mb"] > 0
