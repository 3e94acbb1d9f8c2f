"""A method reports only its own metrics: never the task's quality numbers nor the platform's costs (issue 57)."""

from __future__ import annotations

import pytest

from paretolab import Method
from paretolab.records import StagePlan, TrialSettings
from paretolab.study.trial import run_trial

SETTINGS = TrialSettings("own", "perplexity", {"max_tokens": 128, "context": 64, "stride": 64}, {"size": {}, "params": {}}, seed=0)


class Reports(Method):
    """Keeps the model; its evaluate/measure return what the test sets."""

    name = "reports"
    evaluated: dict = {}
    measured: dict = {}

    def transform(self, subject, params, ctx):
        return subject

    def evaluate(self, subject, ctx):
        return dict(self.evaluated)

    def measure(self, subject, ctx):
        return dict(self.measured)


PLUGIN_OWNER = "overreaching-plugin"  # the `register` fixture's owner: the error must name it


def trial_of(method, tiny):
    return run_trial(tiny, [StagePlan("stage0", method.name, {})], SETTINGS, number=0)


def make(**attrs):
    return type("Reports", (Reports,), attrs)()


def test_an_undeclared_ppl_fails_the_trial_naming_plugin_and_metric(register, tiny):
    result = trial_of(register(make(measured={"ppl": 1.0})), tiny)
    assert result.failed and "'overreaching-plugin'" in result.error and "metric 'ppl'" in result.error
    assert "does not declare" in result.error


def test_a_declared_size_bytes_still_fails_the_platform_owns_it(register, tiny):
    result = trial_of(register(make(metrics=("size_bytes",), measured={"size_bytes": 1.0})), tiny)
    assert result.failed and "metric 'size_bytes'" in result.error and "platform measures" in result.error


def test_a_declared_ppl_from_evaluate_fails_the_task_owns_it(register, tiny):
    result = trial_of(register(make(metrics=("ppl",), evaluated={"ppl": 1.0})), tiny)
    assert result.failed and "metric 'ppl'" in result.error and "the task 'perplexity' already reported" in result.error


def test_a_declared_energy_or_param_count_fails(register, tiny):
    for name in ("energy_j", "param_count", "trial_s"):
        result = trial_of(register(make(name=f"reports_{name}", metrics=(name,), measured={name: 1.0})), tiny)
        assert result.failed and f"metric {name!r}" in result.error


def test_a_method_s_own_declared_metric_is_kept(register, tiny):
    result = trial_of(register(make(metrics=("sqnr_db",), measured={"sqnr_db": 30.0})), tiny)
    assert not result.failed, result.error
    assert result.metrics["sqnr_db"] == 30.0 and result.metrics["ppl"] != 1.0


def test_the_contract_suite_refuses_a_declared_platform_metric(tiny, ctx):
    from paretolab.testing import MethodContract

    with pytest.raises(AssertionError, match="metric 'size_bytes', which the platform measures"):
        MethodContract().test_reported_metrics_are_registered_and_finite(make(metrics=("size_bytes",), measured={"size_bytes": 1.0}), tiny, {}, ctx)
    with pytest.raises(AssertionError, match="metric 'ppl', which the task 'perplexity'"):
        MethodContract().test_reported_metrics_are_registered_and_finite(make(metrics=("ppl",), evaluated={"ppl": 1.0}), tiny, {}, ctx)


def test_a_built_in_method_reports_only_what_it_declares(tiny):
    """absmean_ternary borrowed CAT-Q's evaluate without declaring its metric: found by the ownership rule."""
    result = run_trial(tiny, [StagePlan("stage0", "absmean_ternary", {"group_size": 64})], SETTINGS, number=0)
    assert not result.failed, result.error
    assert result.metrics["bits_per_weight"] > 1.5


def test_a_pipeline_pairing_a_method_with_a_measure_of_the_same_metric_is_refused_before_it_runs(register):
    """Every trial of it would fail on the second report (the MoE studies did, 36 of 37 trials): say so at load time."""
    from paretolab.errors import ConfigError
    from paretolab.study.spec import parse_spec

    register(make(name="reports_expert_bytes", metrics=("expert_bytes",), measured={"expert_bytes": 1.0}))
    raw = {"name": "dup", "model": "tiny-moe", "task": {"name": "perplexity"}, "stages": [{"method": "reports_expert_bytes"}],
           "objectives": [{"metric": "ppl", "direction": "minimize"}], "measures": {"expert_memory": {}}}
    with pytest.raises(ConfigError, match=r"stages\[0\]: method 'reports_expert_bytes' reports 'expert_bytes', which measures.expert_memory"):
        parse_spec(raw, source="dup.yaml")
    parse_spec({**raw, "measures": {"size": {}}}, source="ok.yaml")  # without the measure it is the method's own number
