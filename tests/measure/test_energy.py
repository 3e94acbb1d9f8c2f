"""Energy per stage: the source is chosen by what can be read (NVML, RAPL, else the CPU-time estimate)."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest

from paretolab.errors import ConfigError
from paretolab.measure.energy import (
    DEFAULT_WATTS_PER_CORE,
    EnergyMeter,
    choose_source,
    watts_per_core,
)


class FakeZeus:
    """ZeusMonitor's window interface with fixed readings: ``gpu`` joules per GPU, ``cpu`` per package per window."""

    def __init__(self, gpus: list[int], cpus: list[int], *, gpu_j: float = 5.0, cpu_j: float = 2.0) -> None:
        self.gpu_indices, self.cpu_indices = gpus, cpus
        self.gpu_j, self.cpu_j = gpu_j, cpu_j
        self.open: set[str] = set()

    def begin_window(self, key: str) -> None:
        self.open.add(key)

    def end_window(self, key: str) -> SimpleNamespace:
        self.open.remove(key)
        return SimpleNamespace(
            gpu_energy={i: self.gpu_j for i in self.gpu_indices},
            cpu_energy={i: self.cpu_j for i in self.cpu_indices} or None,
            dram_energy=None,
        )


@pytest.mark.parametrize(
    ("gpus", "cpus", "trial_has_gpu", "source"),
    [
        ([0], [0], True, "nvml"),
        ([0], [0], False, "rapl"),  # a CPU trial on a GPU node reads the CPU packages
        ([], [0, 1], False, "rapl"),
        ([0], [], False, "estimate"),
        ([], [], True, "estimate"),
    ],
)
def test_source_follows_what_is_readable(gpus, cpus, trial_has_gpu, source):
    assert choose_source(FakeZeus(gpus, cpus), gpu=trial_has_gpu) == source
    assert choose_source(None, gpu=trial_has_gpu) == "estimate"


def test_nvml_windows_sum_the_trials_gpus():
    meter = EnergyMeter(FakeZeus([0, 1], [0], gpu_j=5.0), gpu=True)
    meter.begin("trial")
    meter.begin("evaluate")
    assert meter.end("evaluate") == 10.0
    assert meter.end("trial") == 10.0 and meter.source == "nvml"


def test_rapl_counts_packages_and_dram():
    zeus = FakeZeus([], [0, 1], cpu_j=2.0)
    meter = EnergyMeter(zeus, gpu=False)
    meter.begin("measure")
    assert meter.end("measure") == 4.0 and meter.source == "rapl"


def test_estimate_is_cpu_seconds_times_watts_per_core(monkeypatch):
    monkeypatch.setenv("PARETOLAB_WATTS_PER_CORE", "10")
    meter = EnergyMeter(None)
    meter.begin("busy")
    cpu0 = time.process_time()
    while time.process_time() - cpu0 < 0.2:
        pass
    joules = meter.end("busy")
    assert meter.source == "estimate"
    assert 2.0 <= joules < 4.0  # 0.2 s or a little more of CPU at 10 W


def test_watts_per_core_default_and_bad_value(monkeypatch):
    monkeypatch.delenv("PARETOLAB_WATTS_PER_CORE", raising=False)
    assert watts_per_core() == DEFAULT_WATTS_PER_CORE
    monkeypatch.setenv("PARETOLAB_WATTS_PER_CORE", "-3")
    with pytest.raises(ConfigError, match="PARETOLAB_WATTS_PER_CORE.*-3"):
        watts_per_core()


def test_a_trial_reports_energy_per_stage_and_its_source(tiny):
    from paretolab.records import StagePlan, TrialSettings
    from paretolab.study.trial import run_trial

    settings = TrialSettings("e", "perplexity", {"max_tokens": 128, "context": 64, "stride": 64}, {"params": {}}, seed=0)
    result = run_trial(tiny, [StagePlan("stage0", "magnitude", {"sparsity": 0.5, "scope": "row"})], settings, number=0)
    assert not result.failed, result.error
    assert result.info["energy_source"] == "estimate"  # no GPU, no readable RAPL here
    assert set(result.stage_energy_j) == {"copy", "transform:stage0", "evaluate", "measure"}
    assert result.metrics["energy_j"] >= sum(result.stage_energy_j.values()) > 0


def test_rapl_counters_read_packages_only_and_survive_wrap_around(tmp_path):
    from paretolab.measure.energy import CounterMonitor, _rapl_counters

    for zone, value in (("intel-rapl:0", 999_000_000), ("intel-rapl:1", 5_000_000), ("intel-rapl:0:0", 1)):
        (tmp_path / zone).mkdir()
        (tmp_path / zone / "energy_uj").write_text(str(value))
        (tmp_path / zone / "max_energy_range_uj").write_text("1000000000")
    counters, wrap = _rapl_counters(str(tmp_path))
    assert sorted(counters) == [0, 1] and wrap == {0: 1000.0, 1: 1000.0}  # the core sub-zone is inside package 0
    monitor = CounterMonitor({}, counters, wrap)
    meter = EnergyMeter(monitor)
    assert meter.source == "rapl"
    meter.begin("evaluate")
    (tmp_path / "intel-rapl:0" / "energy_uj").write_text("2000000")  # wrapped past 1000 J: 1 + 2 J
    (tmp_path / "intel-rapl:1" / "energy_uj").write_text("9000000")  # 4 J
    assert meter.end("evaluate") == pytest.approx(7.0)
