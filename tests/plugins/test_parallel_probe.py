"""parallel_probe / self_consistency: the contract, the recorder's mechanics, the trace cache, trials on tiny-llama."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from paretolab.generation import greedy_decode
from paretolab.plugins.parallel_probe import ParallelProbe, SelfConsistency
from paretolab.plugins.parallel_probe.traces import RecordSettings, record, trace_key
from paretolab.records import StagePlan, TrialSettings
from paretolab.study.trial import run_trial
from paretolab.testing import MethodContract

SMALL = {"n_branches": 3, "probe_grid": 4, "answer_tokens": 3, "questions_per_batch": 2}
TASK = {"level": 3, "limit": 3, "max_new_tokens": 12, "shots": 1}
CUE = [40, 41, 42]


@pytest.fixture(autouse=True)
def private_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("PARETOLAB_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


class TestParallelProbeContract(MethodContract):
    @pytest.fixture
    def method(self):
        return ParallelProbe()


class TestSelfConsistencyContract(MethodContract):
    @pytest.fixture
    def method(self):
        return SelfConsistency()


def _prompts() -> list[list[int]]:
    gen = torch.Generator().manual_seed(0)
    return [torch.randint(3, 250, (n,), generator=gen).tolist() for n in (5, 9, 3)]


def _record(model, grid: int, **changes):
    settings = RecordSettings(**{**SMALL, "probe_grid": grid, "temperature": 1.0, **changes})
    return record(model, _prompts(), stop_ids=[7, 11], probe_stop_ids=[10], cue_ids=CUE, max_new_tokens=20, settings=settings)


def test_probing_leaves_the_branches_untouched_and_answers_like_a_fresh_decode(tiny):
    probed = _record(tiny.model, grid=4)
    plain = _record(tiny.model, grid=1000)  # never probes
    assert [[b.tokens for b in q.branches] for q in probed.questions] == [[b.tokens for b in q.branches] for q in plain.questions]
    assert len({tuple(b.tokens) for q in probed.questions for b in q.branches}) > 3  # sampled branches differ
    prompts = _prompts()
    checked = 0
    for q, question in enumerate(probed.questions):
        for branch in question.branches:
            assert len(branch.probes) == (len(branch.tokens) - 1) // 4  # one per 4 tokens while the branch goes on
            for k, answer in enumerate(branch.probes[:2]):
                ids = torch.tensor([prompts[q] + branch.tokens[: 4 * (k + 1)] + CUE])
                fresh = greedy_decode(tiny.model, ids, 3)[0].tolist()
                assert answer == (fresh[: fresh.index(10) + 1] if 10 in fresh else fresh)
                checked += 1
    assert checked >= 6


def test_trace_key_changes_with_anything_that_changes_the_traces(tiny):
    prompts = _prompts()
    args = {"stop_ids": [7], "probe_stop_ids": [10], "cue_ids": CUE, "max_new_tokens": 20, "settings": RecordSettings(**SMALL)}
    base = trace_key(tiny.model, prompts, **args)
    assert trace_key(tiny.model, prompts, **args) == base
    variants = [
        {"settings": RecordSettings(**{**SMALL, "seed": 1})},
        {"settings": RecordSettings(**{**SMALL, "n_branches": 4})},
        {"settings": RecordSettings(**{**SMALL, "probe_grid": 8})},
        {"settings": RecordSettings(**{**SMALL, "temperature": 0.5})},
        {"cue_ids": [40, 41]},
        {"max_new_tokens": 21},
        {"stop_ids": [7, 8]},
    ]
    keys = {trace_key(tiny.model, prompts, **{**args, **v}) for v in variants}
    keys.add(trace_key(tiny.model, prompts[:2], **args))
    with torch.no_grad():
        tiny.model.model.layers[0].mlp.up_proj.weight[0, 0] += 1e-3  # a changed weight (e.g. an earlier stage)
    keys.add(trace_key(tiny.model, prompts, **args))
    assert base not in keys and len(keys) == len(variants) + 2


def _trial(subject, method: str, params: dict, number: int = 0):
    result = run_trial(subject, [StagePlan("stage0", method, params)], TrialSettings("pp", "arithmetic", TASK, {}, seed=0), number=number)
    assert not result.failed, result.traceback
    return result.metrics


def test_both_methods_replay_the_same_recorded_branches(tiny, private_cache: Path):
    sc = _trial(tiny, "self_consistency", SMALL)
    assert sc["traces_cached"] == 0.0 and len(list((private_cache / "traces").iterdir())) == 1
    probe = {**SMALL, "probe_every": 4, "consensus": 1, "patience": 1, "warmup": 0}
    pp = _trial(tiny, "parallel_probe", probe, number=1)
    assert pp["traces_cached"] == 1.0 and len(list((private_cache / "traces").iterdir())) == 1
    # branch tokens (the paper's count) never exceed self-consistency's; the probes are added on top
    assert pp["tokens_total_no_probe"] <= sc["tokens_total"] and pp["tokens_sequential_no_probe"] <= sc["tokens_sequential"]
    assert pp["probe_tokens"] > 0
    assert pp["tokens_total"] == pytest.approx(pp["tokens_total_no_probe"] + pp["probe_tokens"])
    assert pp["tokens_sequential"] > pp["tokens_sequential_no_probe"]
    assert pp["tokens_total_vs_sc"] == pytest.approx(pp["tokens_total"] / sc["tokens_total"])
    assert pp["tokens_total_vs_sc_no_probe"] == pytest.approx(pp["tokens_total_no_probe"] / sc["tokens_total"])
    assert pp["tokens_sequential_vs_sc"] == pytest.approx(pp["tokens_sequential"] / sc["tokens_sequential"])
    assert sc["tokens_total_no_probe"] == sc["tokens_total"]  # self-consistency has no probes
    again = _trial(tiny, "parallel_probe", probe, number=2)
    assert {k: again[k] for k in ("acc", "tokens_total", "tokens_sequential")} == {k: pp[k] for k in ("acc", "tokens_total", "tokens_sequential")}


def test_a_controller_that_never_stops_early_costs_what_self_consistency_costs(tiny):
    sc = _trial(tiny, "self_consistency", SMALL)
    never = _trial(tiny, "parallel_probe", {**SMALL, "probe_every": 4, "consensus": 8, "patience": 8, "warmup": 8}, number=1)
    assert never["tokens_total_no_probe"] == sc["tokens_total"] and never["acc"] == sc["acc"]
    assert never["tokens_total_vs_sc_no_probe"] == 1.0 and never["agree_with_sc"] == 1.0
    # its probes are pure overhead: counted, it costs more than self-consistency
    assert never["tokens_total"] == sc["tokens_total"] + never["probe_tokens"] and never["tokens_total_vs_sc"] > 1.0


def test_probe_every_must_be_a_multiple_of_the_grid(tiny, tmp_path: Path):
    from paretolab import TrialContext
    from paretolab.errors import ConfigError

    with pytest.raises(ConfigError, match="probe_every"):
        ParallelProbe().transform(tiny.copy(), {**SMALL, "probe_every": 6}, TrialContext(seed=0, workdir=tmp_path))


def test_recorded_branch_decode_time_loses_only_the_probes_forwards(tiny, monkeypatch: pytest.MonkeyPatch):
    """Work around a probe that is not a forward (here a 1 s pause) stays out of the branch decode time."""
    import time

    from paretolab.plugins.parallel_probe import traces

    real_probe = traces._probe

    def slow_probe(*args, **kwargs):
        out = real_probe(*args, **kwargs)
        time.sleep(1.0)  # long beside 24 tiny-model forwards even on a loaded machine (0.2 s was not, in CI under load)
        return out

    monkeypatch.setattr(traces, "_probe", slow_probe)
    settings = traces.RecordSettings(**SMALL)
    recording = traces.record(tiny.model, [[5, 6, 7], [8, 9]], stop_ids=[], probe_stop_ids=[], cue_ids=CUE, max_new_tokens=12, settings=settings)
    rounds = 12 // settings.probe_grid - 1  # probed at 4 and 8 tokens; the branches end at 12
    assert recording.probe_s >= 1.0 * rounds
    # subtracting the probes' wall time (pauses included) would leave less than nothing
    assert 0 < recording.decode_s < recording.probe_s
