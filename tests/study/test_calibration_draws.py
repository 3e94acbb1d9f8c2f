"""A trial names every calibration draw it made, so a verdict can tell one draw from several (results.claims)."""

from paretolab.records import StagePlan, TrialSettings
from paretolab.study.trial import run_trial

SETTINGS = TrialSettings("c", "perplexity", {"max_tokens": 128, "context": 64, "stride": 64}, {"params": {}}, seed=0)


def test_a_calibrating_method_records_its_draw_and_a_plain_one_none(tiny):
    wanda = run_trial(tiny, [StagePlan("stage0", "wanda", {"sparsity": 0.5, "calib_samples": 2, "calib_seq_len": 16})], SETTINGS, number=3)
    assert not wanda.failed, wanda.error
    assert wanda.info["calibration_draws"] == "pydoc seed 3, 2x16"  # the trial's seed: study seed 0 + trial 3
    magnitude = run_trial(tiny, [StagePlan("stage0", "magnitude", {"sparsity": 0.5})], SETTINGS, number=3)
    assert "calibration_draws" not in magnitude.info


def test_a_named_draw_pairs_trials_and_scores_as_its_draw_does(tiny):
    """``calib_seed`` (every calibrating method has it) fixes the draw whatever the trial: two trials, one draw, one model."""
    import pytest

    def wanda(number, **extra):
        params = {"sparsity": 0.5, "calib_samples": 2, "calib_seq_len": 16, **extra}
        result = run_trial(tiny, [StagePlan("stage0", "wanda", params)], SETTINGS, number=number)
        assert not result.failed, result.error
        return result

    first, second, other = wanda(3, calib_seed=1), wanda(5, calib_seed=1), wanda(5, calib_seed=2)
    assert first.info["calibration_draws"] == second.info["calibration_draws"] == "pydoc seed 1, 2x16"
    assert other.info["calibration_draws"] == "pydoc seed 2, 2x16"
    assert first.metrics["ppl"] == pytest.approx(second.metrics["ppl"], rel=1e-6), "the same draw prunes the same weights"
    assert wanda(1, calib_seed=-1).info["calibration_draws"] == "pydoc seed 1, 2x16", "-1: the trial's own seed"


def test_the_machine_a_trial_ran_on_is_named():
    import torch

    from paretolab.study.worker import machine

    info = machine(torch.device("cpu"))
    assert info["cpu"] and info["cpu"] != "unknown"
    assert int(info["cores"]) >= 1 and info["gpu"] == "none"


def test_a_trial_records_the_machine_load_it_ran_under(tiny, monkeypatch):
    """A timed trial beside other work times the contention too: each trial says the 1-min load average (the larger end)."""
    from paretolab.study import worker

    loads = iter([0.5, 3.25])
    monkeypatch.setattr(worker, "machine_load", lambda: next(loads))
    trial_worker = worker.TrialWorker.__new__(worker.TrialWorker)
    trial_worker.base, trial_worker.settings, trial_worker.roles, trial_worker.name, trial_worker.placement = tiny, SETTINGS, {}, "w", {}
    result = trial_worker.run([StagePlan("stage0", "magnitude", {"sparsity": 0.5})], 0)
    assert result.info["load_1m"] == "3.25"
