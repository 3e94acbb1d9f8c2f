"""Several models by role: shared per worker, per-model costs, the recorded-answers replay key, the routing methods."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from paretolab.errors import ConfigError
from paretolab.models import TinyLlama
from paretolab.plugins.routing import FixedRoute, LazyStackMethod, SDRMethod
from paretolab.plugins.routing.answers import (
    answers_key,
    builtin_questions,
    load_or_record_answers,
)
from paretolab.plugins.routing.bed import Bed
from paretolab.plugins.routing.policies import SDR, Cascade, LazyStack, Random, Stack
from paretolab.records import StagePlan, TrialSettings
from paretolab.study.trial import run_trial
from paretolab.testing import MethodContract

TASK = {"datasets": "builtin", "limit": 24}


@pytest.fixture(autouse=True)
def _own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("PARETOLAB_CACHE", str(tmp_path / "cache"))


def _roles(tiny) -> dict[str, Any]:
    return {"small": tiny, "large": TinyLlama(seed=2, layers=3).load()}


def test_the_worker_loads_each_role_model_once_and_shares_it(monkeypatch, tmp_path):
    import paretolab.models as models
    import paretolab.study.worker as worker_module
    from paretolab.study.worker import TrialWorker

    monkeypatch.setattr(worker_module, "_placement", lambda: {})  # outside Ray: never look for a running cluster

    loads: list[str] = []

    def load(name: str):
        loads.append(name)
        return TinyLlama(seed=len(loads), layers=2 + len(loads) % 2).load()

    monkeypatch.setattr(models, "load_subject", load)
    settings = TrialSettings("s", "mc_routing", TASK, {}, seed=0, models={"small": "tiny-llama", "large": "big", "again": "big"})
    worker = TrialWorker("tiny-llama", settings)
    large = worker.roles["large"]
    results = [worker.run([StagePlan("stage0", "route_fixed", {"role": "large", "split": n})], n) for n in range(3)]
    assert all(not r.failed for r in results), results[0].traceback
    assert sorted(loads) == ["big", "tiny-llama"]  # three trials, one load each; `again` shares `large`
    assert worker.roles["large"] is large and worker.roles["again"] is large and worker.roles["small"] is worker.base
    assert all(r.info["cost.large.calls"] > 0 for r in results)


def test_per_model_costs_are_recorded_with_their_price_marked_simulated(tiny):
    settings = TrialSettings("s", "mc_routing", TASK, {}, seed=0, prices={"large": 1e-3})
    result = run_trial(tiny, [StagePlan("stage0", "route_fixed", {"role": "large"})], settings, 0, roles=_roles(tiny))
    assert not result.failed, result.traceback
    info, metrics = result.info, result.metrics
    assert info["cost.large.calls"] == metrics["n_examples"] == 12 and info.get("cost.small.calls", 0) == 0
    assert info["cost.large.s_is"] == "replayed" and info["cost.large.price_is"] == "simulated"
    assert metrics["model_price"] == pytest.approx(1e-3 * info["cost.large.tokens"])
    assert metrics["model_tokens"] == info["cost.large.tokens"] > 0 and metrics["model_calls"] == 12


def test_sdr_accounts_for_the_small_model_and_each_deferral(tiny):
    settings = TrialSettings("s", "mc_routing", TASK, {}, seed=0)
    result = run_trial(tiny, [StagePlan("stage0", "sdr", {"cost_weight": 0.0})], settings, 0, roles=_roles(tiny))
    assert not result.failed, result.traceback
    deferred = result.info.get("cost.large.calls", 0)
    assert result.info["cost.small.calls"] == 12  # the small model always answers first
    assert result.metrics["deferred_frac"] == pytest.approx(deferred / 12)


def test_recorded_answers_replay_and_any_changed_setting_misses(tiny):
    questions = builtin_questions(6)
    first, cached = load_or_record_answers(tiny, questions)
    again, cached_again = load_or_record_answers(tiny, questions)
    assert (cached, cached_again) == (False, True) and again.loglik == first.loglik
    key = answers_key(tiny, questions)
    assert answers_key(tiny, builtin_questions(6, seed=1)) != key  # other prompts
    assert answers_key(tiny, questions[:5]) != key
    other = tiny.copy()
    with __import__("torch").no_grad():
        other.model.lm_head.weight[0, 0] += 1.0  # other weights
    assert answers_key(other, questions) != key
    from paretolab.data import recorded

    assert recorded.record_key({"a": 1}, code=1) != recorded.record_key({"a": 1}, code=2)  # other recorder version


def test_models_by_role_in_a_pipeline(tmp_path):
    from paretolab.study.spec import parse_spec

    raw = {"name": "r", "models": {"small": "tiny-llama", "large": {"name": "tiny-llama", "price_per_token": 2e-6}},
           "task": {"name": "mc_routing", **TASK}, "stages": [{"method": "sdr"}], "objectives": [{"metric": "acc", "direction": "maximize"}]}
    spec = parse_spec(raw)
    assert spec.models == {"small": "tiny-llama", "large": "tiny-llama"} and spec.prices == {"large": 2e-6} and spec.model == "tiny-llama"
    with pytest.raises(ConfigError, match=r"models.large.price_per_token: expected a number >= 0"):
        parse_spec({**raw, "models": {"small": "tiny-llama", "large": {"name": "tiny-llama", "price_per_token": -1}}})
    with pytest.raises(ConfigError, match=r"models.Big: a role is a lower-case name"):
        parse_spec({**raw, "models": {"Big": "tiny-llama"}})


def _bed(n: int = 200, seed: int = 0) -> Bed:
    """Synthetic answers: the small model is right where its hidden feature is positive, the large one mostly."""
    rng = np.random.default_rng(seed)
    gold = rng.integers(0, 4, n)
    hidden = rng.normal(size=(n, 4))
    easy = hidden[:, 0] > 0

    def role(correct: np.ndarray, cost: float, sharp: float) -> dict[str, Any]:
        pred = np.where(correct, gold, (gold + 1) % 4)
        probs = [np.eye(4)[p] * sharp + (1 - sharp) / 4 for p in pred]
        return {"probs": probs, "pred": pred, "hidden": hidden, "tokens": np.full(n, 10.0), "seconds": np.full(n, cost), "gflops": np.full(n, cost)}

    data = {"small": role(easy, 1.0, np.where(easy, 0.9, 0.3).mean()), "large": role(rng.random(n) < 0.9, 4.0, 0.8)}
    data["small"]["probs"] = [np.eye(4)[p] * (0.9 if e else 0.2) + (0.1 if e else 0.8) / 4 for p, e in zip(data["small"]["pred"], easy)]
    return Bed(["small", "large"], data, gold, ["q"] * n)


def test_sdr_reads_the_hidden_state_and_beats_random_routing_on_a_bed_built_for_it():
    from paretolab.plugins.routing.task import bed_floor, route_auc

    calib, test = _bed().split(0.5, 0)
    aucs = {}
    for name, policy in {"sdr": SDR(), "random": Random(), "cascade": Cascade()}.items():
        policy.fit(calib)
        aucs[name] = route_auc(policy, test, bed_floor(test))
    assert aucs["sdr"] > aucs["random"] + 0.05


def test_lazystack_exits_early_when_confident_and_keeps_the_ensemble_accuracy():
    calib, test = _bed().split(0.5, 0)
    full = Stack()
    full.fit(calib)
    lazy = LazyStack(knob=0.6)
    lazy.fit(calib)
    out = lazy.route(test)
    assert out.ran.sum(1).mean() < 2  # not every question ran both models
    assert out.acc(test) >= 0.9 * full.route(test).acc(test)
    order, threshold = lazy.at_retention(calib, 0.97, full.route(calib).acc(calib))
    assert set(order) == {"small", "large"} and 0.3 <= threshold <= 1.01


def test_a_fixed_route_to_an_unknown_role_names_the_roles(tiny):
    result = run_trial(tiny, [StagePlan("stage0", "route_fixed", {"role": "medium"})], TrialSettings("s", "mc_routing", TASK, {}, seed=0), 0, roles=_roles(tiny))
    assert result.failed and "route_fixed.role: 'medium' is no role of the pipeline's models (small, large)" in result.error


class TestSDRContract(MethodContract):
    @pytest.fixture
    def method(self):
        return SDRMethod()


class TestLazyStackContract(MethodContract):
    @pytest.fixture
    def method(self):
        return LazyStackMethod()


class TestFixedRouteContract(MethodContract):
    @pytest.fixture
    def method(self):
        return FixedRoute()
