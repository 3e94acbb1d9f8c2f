"""A method's real-or-simulated label per trial, carried by `frontier --json` as by the report."""

from __future__ import annotations

import json

from optuna.distributions import CategoricalDistribution

from paretolab import Method
from paretolab.records import StagePlan, TrialSettings
from paretolab.study.trial import run_trial
from tests.conftest import cli_here
from tests.reliability.test_stores import good_home, home  # noqa: F401 - fixtures

SETTINGS = TrialSettings("l", "perplexity", {"max_tokens": 128, "context": 64, "stride": 64}, {"params": {}}, seed=0)


class Sometimes(Method):
    """Stored for real in one mode, simulated in the other."""

    name = "sometimes"
    cost_is = "simulated"

    def search_space(self):
        return {"mode": CategoricalDistribution(["stored", "masked"])}

    def transform(self, subject, params, ctx):
        return subject

    def cost_of(self, params, subject):
        return "real" if params["mode"] == "stored" else "simulated"


class Garbled(Sometimes):
    name = "garbled"

    def cost_of(self, params, subject):
        return "maybe"



def test_the_label_follows_the_trial_s_setting(register, tiny):
    register(Sometimes())
    stored = run_trial(tiny, [StagePlan("s0", "sometimes", {"mode": "stored"})], SETTINGS, number=0)
    masked = run_trial(tiny, [StagePlan("s0", "sometimes", {"mode": "masked"})], SETTINGS, number=1)
    assert not stored.failed and stored.simulated_by == [] and masked.simulated_by == ["sometimes"]


def test_a_label_that_is_neither_fails_the_trial_with_a_reason(register, tiny):
    register(Garbled())
    result = run_trial(tiny, [StagePlan("s0", "garbled", {"mode": "stored"})], SETTINGS, number=0)
    assert result.failed and "cost_of() must return 'real' or 'simulated', got 'maybe'" in result.error


def test_frontier_json_carries_each_trial_s_label(home):
    from tests.reliability.test_stores import sql

    before = {r["trial"]: r["cost"] for r in json.loads(cli_here("frontier", "demo", "--json", "--home", str(home), cwd=home).stdout)}
    assert before[3] == "simulated (rtn)" and before[0] == "real"  # recorded before the label was kept in Optuna: MLflow's tag
    target = 3  # as a trial recorded now is: its label in Optuna wins (here: every saving real)
    sql(home / "optuna.db", "INSERT INTO trial_user_attributes (trial_id, key, value_json) SELECT t.trial_id, 'simulated_by', '\"\"' "
        f"FROM trials t JOIN studies s ON s.study_id = t.study_id WHERE s.study_name = 'demo' AND t.number = {target}")
    after = {r["trial"]: r["cost"] for r in json.loads(cli_here("frontier", "demo", "--json", "--home", str(home), cwd=home).stdout)}
    assert after == {**before, target: "real"}
