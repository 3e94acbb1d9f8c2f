"""From pipeline to Optuna: conditional plans, prefixes, grids, samplers."""

from __future__ import annotations

import optuna
import pytest

from paretolab.errors import ConfigError
from paretolab.study.search import grid_points, make_sampler, plan_trial
from paretolab.study.spec import parse_spec
from tests.study.test_spec import GOOD, broken


def test_plan_follows_the_choice_and_fills_defaults():
    spec = parse_spec(GOOD)
    plan = plan_trial(optuna.trial.FixedTrial({"magnitude.sparsity": 0.3, "magnitude.scope": "matrix", "stage1.method": "rtn", "rtn.bits": 3, "rtn.group_size": 64}), spec)
    assert [(p.stage, p.method) for p in plan] == [("stage0", "magnitude"), ("stage1", "rtn")]
    assert plan[0].params == {"sparsity": 0.3, "scope": "matrix"}
    assert plan[1].params == {"bits": 3, "group_size": 64}
    none = plan_trial(optuna.trial.FixedTrial({"magnitude.sparsity": 0.3, "magnitude.scope": "row", "stage1.method": "none"}), spec)
    assert none[1].method == "none" and none[1].params == {}


def test_a_method_used_twice_gets_stage_prefixes():
    raw = broken("stages", [{"method": "magnitude", "params": {"sparsity": 0.2}}, {"id": "again", "method": "magnitude"}])
    spec = parse_spec(raw)
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    trial = study.ask()
    plan_trial(trial, spec)
    assert set(trial.params) == {"stage0.magnitude.scope", "again.magnitude.sparsity", "again.magnitude.scope"}


def test_grid_enumerates_the_conditional_space():
    raw = broken("stages", [{"choice": [{"method": "rtn", "params": {"bits": [2, 4], "group_size": 32}},
                                        {"method": "magnitude", "params": {"sparsity": {"low": 0.2, "high": 0.6, "step": 0.2}, "scope": "row"}},
                                        {"method": "none"}]}])
    points = grid_points(parse_spec(raw))
    assert len(points) == 2 + 3 + 1
    assert {"stage0.method": "rtn", "rtn.bits": 4} in points
    assert {"stage0.method": "magnitude", "magnitude.sparsity": 0.4} in points


def test_grid_refuses_continuous_ranges():
    with pytest.raises(ConfigError, match="'magnitude.sparsity' is a continuous range"):
        grid_points(parse_spec(broken("search.sampler", "grid")))


@pytest.mark.parametrize("name, cls", [("nsga2", optuna.samplers.NSGAIISampler), ("tpe", optuna.samplers.TPESampler), ("random", optuna.samplers.RandomSampler), ("grid", optuna.samplers.RandomSampler)])
def test_samplers(name, cls):
    assert isinstance(make_sampler(parse_spec(broken("search.sampler", name))), cls)


def test_same_seed_same_plans():
    spec = parse_spec(broken("search.sampler", "random"))

    def plans():
        study = optuna.create_study(sampler=make_sampler(spec), directions=["minimize", "minimize"])
        return [[(p.method, p.params) for p in plan_trial(study.ask(), spec)] for _ in range(5)]

    assert plans() == plans()
