"""Per-layer search spaces: `layers:` parsed and refused, sampled by every sampler, applied module by module, re-applied exactly."""

from __future__ import annotations

import copy
import json
import tempfile
from pathlib import Path

import optuna
import pytest
import torch

from paretolab.errors import ConfigError
from paretolab.plugin_api.layers import Selector, assign, parse_selector
from paretolab.study.search import grid_points, make_sampler, plan_trial, space_size
from paretolab.study.spec import parse_spec

ATTN = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP = ("gate_proj", "up_proj", "down_proj")
MODULES = [f"model.layers.{i}.self_attn.{p}" for i in range(4) for p in ATTN] + [f"model.layers.{i}.mlp.{p}" for i in range(4) for p in MLP]


def pipeline(layers, params=None, sampler="grid", trials=4):
    return {"name": "lay", "model": "tiny-llama", "task": {"name": "perplexity", "corpus": "pydoc", "max_tokens": 256},
            "stages": [{"method": "rtn", "params": params or {"bits": 8, "group_size": 32}, "layers": layers}],
            "objectives": [{"metric": "ppl"}, {"metric": "size_bytes"}], "search": {"sampler": sampler, "trials": trials, "seed": 0}}


def test_selectors_name_kinds_ranges_and_one_group_per_layer():
    assert [s.name for s in parse_selector("attention", "x")] == ["attention"]
    assert [s.name for s in parse_selector("0-9 mlp", "x")] == ["0-9 mlp"]
    assert [s.name for s in parse_selector(3, "x")] == ["3"]
    assert [s.name for s in parse_selector("2,0-1,7,5-6 mlp", "x")] == ["0-2 5-7 mlp"]  # layer sets in canonical order
    assert [s.name for s in parse_selector("0-1 5 down_proj", "x")] == ["0-1 5 down_proj"]
    assert [s.name for s in parse_selector("each 1-3 down_proj", "x")] == ["1 down_proj", "2 down_proj", "3 down_proj"]
    groups = assign(MODULES, [*parse_selector("0-1 attention", "x"), *parse_selector("mlp", "x"), *parse_selector("3 q_proj", "x")], "x")
    assert groups["model.layers.1.self_attn.v_proj"] == "0-1 attention"
    assert groups["model.layers.2.self_attn.v_proj"] == "rest"
    assert groups["model.layers.3.self_attn.q_proj"] == "3 q_proj" and groups["model.layers.3.self_attn.k_proj"] == "rest"
    assert all(groups[m] == "mlp" for m in MODULES if ".mlp." in m)


@pytest.mark.parametrize("key, fragment", [
    ("each attention", "'each' needs a range"), ("9-2", "runs backwards"), ("0-3 mlp up_proj", "not a layer group"),
    ("", "not a layer group"), ("1-2 each", "goes alone"),
])
def test_a_bad_selector_names_the_field_the_value_and_the_fix(key, fragment):
    with pytest.raises(ConfigError) as err:
        parse_spec(pipeline({key: {"bits": [2, 4]}}))
    assert "stages[0].layers." in str(err.value) and fragment in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("layers, fragment", [
    ({"attention": {"bits": [2, 4]}, "0-1": {"bits": 3}}, "groups 'attention' and '0-1' can both hold a module"),
    ({"0,2 mlp": {"bits": [2, 4]}, "1-2 mlp": {"bits": 3}}, "groups '0 2 mlp' and '1-2 mlp' can both hold a module"),
    ({"mlp": {"bits": 3}, "1 down_proj": {"bits": 4}}, "can both hold"),
    ({"attention": {"bitz": [2]}}, "stages[0].layers.attention.bitz: method 'rtn' has no parameter 'bitz'; did you mean 'bits'?"),
    ({"attention": {"bits": "four"}}, "stages[0].layers.attention.bits: 'four' is not an integer"),
    ({"attention": 4}, "stages[0].layers.attention: expected this group's parameters"),
    ({"rest": {"bits": 2}, "mlp": {"bits": 3}}, "`rest` takes only `keep`"),
    ({"rest": "keep"}, "name at least one group"),
    ([], "expected a mapping of layer groups"),
])
def test_a_bad_layers_block_is_refused_before_any_trial(layers, fragment):
    with pytest.raises(ConfigError, match=None) as err:
        parse_spec(pipeline(layers))
    assert fragment in str(err.value), str(err.value)


def test_a_method_that_is_not_layerwise_is_refused_with_the_ones_that_are():
    raw = pipeline({"mlp": {"steps": 3}})
    raw["stages"][0] = {"method": "catq", "layers": {"mlp": {"steps": 3}}}
    with pytest.raises(ConfigError, match=r"stages\[0\]\.layers: method 'catq' takes one setting .* \(magnitude, rtn"):
        parse_spec(raw)


def test_disjoint_kinds_and_ranges_are_accepted():
    spec = parse_spec(pipeline({"0-1 attention": {"bits": [2, 4]}, "2-3 attention": {"bits": 3}, "down_proj": {"bits": [4, 8]}, "rest": "keep"}))
    assert grid_points(spec) == [{"rtn.bits/0-1 attention": a, "rtn.bits/down_proj": d} for a in (2, 4) for d in (4, 8)]
    assert space_size(spec) == 4


def test_the_grid_enumerates_each_group_and_the_plan_carries_the_assignment():
    spec = parse_spec(pipeline({"attention": {"bits": [2, 4]}, "each 0-1 mlp": {"bits": [3, 8]}}))
    points = grid_points(spec)
    assert len(points) == 2 * 2 * 2 and space_size(spec) == 8
    plan = plan_trial(optuna.trial.FixedTrial(points[5]), spec)[0]
    assert plan.params == {"bits": 8, "group_size": 32}
    assert plan.layers == {"attention": {"bits": points[5]["rtn.bits/attention"]}, "0 mlp": {"bits": points[5]["rtn.bits/0 mlp"]},
                           "1 mlp": {"bits": points[5]["rtn.bits/1 mlp"]}}


@pytest.mark.parametrize("sampler", ["random", "tpe", "nsga2"])
def test_every_sampler_samples_each_group_on_its_own(sampler):
    spec = parse_spec(pipeline({"attention": {"bits": [2, 3, 4, 8]}, "mlp": {"bits": [2, 3, 4, 8], "group_size": [32, 64]}}, sampler=sampler, trials=8))
    study = optuna.create_study(directions=["minimize", "minimize"], sampler=make_sampler(spec))
    seen = set()
    for i in range(8):
        trial = study.ask()
        plan = plan_trial(trial, spec)[0]
        assert set(trial.params) == {"rtn.bits/attention", "rtn.bits/mlp", "rtn.group_size/mlp"}
        assert plan.layers == {"attention": {"bits": trial.params["rtn.bits/attention"]},
                               "mlp": {"bits": trial.params["rtn.bits/mlp"], "group_size": trial.params["rtn.group_size/mlp"]}}
        seen.add((trial.params["rtn.bits/attention"], trial.params["rtn.bits/mlp"]))
        study.tell(trial, [float(i), float(-i)])
    assert len(seen) > 2  # the two groups vary apart, not as one value


def _applied(plan):
    from paretolab.models import load_subject
    from paretolab.plugin_api.context import TrialContext
    from paretolab.study.trial import apply_plan

    base = load_subject("tiny-llama")
    ctx = TrialContext(seed=0, workdir=Path(tempfile.mkdtemp(prefix="layers-test-")))
    subject, _ = apply_plan(base.copy(), plan, ctx, {})
    return base, subject, ctx


def test_each_module_runs_with_its_groups_values_and_the_assignment_is_kept():
    from paretolab.plugins.baselines import quantize_rtn

    spec = parse_spec(pipeline({"attention": {"bits": [2, 4]}, "0 mlp": {"bits": [3]}, "1 down_proj": "keep"}))
    plan = plan_trial(optuna.trial.FixedTrial({"rtn.bits/attention": 2, "rtn.bits/0 mlp": 3}), spec)
    base, subject, ctx = _applied(plan)
    want = {"self_attn": 2, "0.mlp": 3, "1.mlp.down_proj": None, "1.mlp": 8}
    weights = dict(subject.model.named_parameters())
    for name, module in base.model.named_modules():
        if not isinstance(module, torch.nn.Linear) or name == "lm_head":
            continue
        bits = next(b for k, b in want.items() if k in name)
        expected = module.weight if bits is None else quantize_rtn(module.weight, bits, 32)
        assert torch.equal(weights[f"{name}.weight"], expected), name
        if bits is None:
            assert f"{name}.weight" not in subject.storage, name  # kept: stored as it was
        else:
            assert subject.storage_of(f"{name}.weight").value_bits == bits, name  # what size_bytes counts
    record = json.loads(next(p for p in ctx.artifacts if p.name == "layers.stage0.json").read_text())
    assert record["modules"]["model.layers.1.self_attn.q_proj"] == {"group": "attention", "bits": 2}
    assert record["modules"]["model.layers.0.mlp.up_proj"] == {"group": "0 mlp", "bits": 3}
    assert record["modules"]["model.layers.1.mlp.up_proj"] == {"group": "rest", "bits": 8}
    assert record["modules"]["model.layers.1.mlp.down_proj"] == {"group": "1 down_proj", "keep": True}
    assert subject.info["layers.stage0"].startswith("attention: bits=2 (8 modules); 0 mlp: bits=3 (3 modules)")
    assert subject.scope is None  # the scope does not outlive the stage


def test_a_group_that_holds_no_module_fails_the_trial_naming_the_layers_it_has():
    spec = parse_spec(pipeline({"2-5 mlp": {"bits": 3}}))
    with pytest.raises(ConfigError, match=r"group '2-5 mlp' holds none of the 14 modules .* layers 0-1"):
        _applied(plan_trial(optuna.trial.FixedTrial({}), spec))


def test_reproduce_and_apply_re_apply_a_per_layer_trial_exactly():
    import paretolab
    from paretolab.dashboard.reproduce import reproduce_pipeline

    raw = pipeline({"attention": {"bits": [2, 4]}, "each 0-1 mlp": {"bits": [3, 8]}})
    spec = parse_spec(raw)
    params = {"rtn.bits/attention": 4, "rtn.bits/0 mlp": 3, "rtn.bits/1 mlp": 8}
    _, trial_model, _ = _applied(plan_trial(optuna.trial.FixedTrial(params), spec))
    again = reproduce_pipeline(copy.deepcopy(raw), params, study="lay", number=0)
    assert again["stages"][0]["layers"] == {"attention": {"bits": 4}, "0 mlp": {"bits": 3}, "1 mlp": {"bits": 8}}
    rerun = parse_spec(again)
    _, reproduced, _ = _applied(plan_trial(optuna.trial.FixedTrial({}), rerun))  # nothing left to search
    applied = paretolab.apply("tiny-llama", [{"method": "rtn", "params": {"bits": 8, "group_size": 32}, "layers": again["stages"][0]["layers"]}])
    reference = trial_model.model.state_dict()
    for other in (reproduced.model, applied.model):
        state = other.state_dict()
        assert all(torch.equal(state[k], v) for k, v in reference.items())
    assert applied.costs["size_bytes"] < paretolab.apply("tiny-llama", "rtn", bits=8, group_size=32).costs["size_bytes"]


def test_recorded_mlflow_params_name_each_groups_value():
    from mlflow.utils.validation import _validate_param_name

    from paretolab.records import StagePlan
    from paretolab.study.recording import _flat_params

    spec = parse_spec(pipeline({"0,2-3 attention": {"bits": [2, 4]}, "each 0-1 mlp": {"bits": [3, 8]}}))
    for name in _flat_params(plan_trial(optuna.trial.FixedTrial(grid_points(spec)[0]), spec)):
        _validate_param_name(name)  # MLflow refuses a comma (and most punctuation) in a name: one such trial stopped a study

    plan = [StagePlan("stage0", "rtn", {"bits": 8, "group_size": 32}, layers={"attention": {"bits": 2}, "rest": None})]
    assert _flat_params(plan) == {"stage0.method": "rtn", "stage0.rtn.bits": 8, "stage0.rtn.group_size": 32,
                                  "stage0.rtn.bits/attention": 2, "stage0.rtn/rest": "keep"}


def test_overlap_is_judged_from_the_text():
    assert Selector(frozenset({0, 1, 2, 3}), "mlp").overlaps(Selector(frozenset({2, 5}), None))
    assert not Selector(frozenset({0, 1, 2, 3}), "mlp").overlaps(Selector(frozenset({4, 5}), "mlp"))
    assert not Selector(None, "attention").overlaps(Selector(None, "down_proj"))
    assert Selector(None, "mlp").overlaps(Selector(None, "down_proj"))


def test_claims_and_constraints_name_a_per_layer_arm_by_its_groups_values():
    from paretolab.plugin_api.manager import registries
    from paretolab.study.arms import arm_params

    raw = pipeline({"0,1 attention": {"bits": [3, 4, 5]}, "0-1 mlp": {"bits": [3, 4, 5]}})
    raw["stages"][0] = {"choice": [raw["stages"][0], {"method": "none"}]}
    uniform = "rtn[bits/0-1 attention=4, bits/0-1 mlp=4]"
    raw["constraints"] = [{"metric": "size_bytes", "max_ratio_to": uniform, "max": 1.0}]
    raw["claims"] = [{"text": "5/3 beats 4/4 at equal bytes", "metric": "ppl", "method": "rtn[bits/0-1 attention=5, bits/0-1 mlp=3]",
                      "baseline": uniform, "expect": "lower", "scale": "log", "replicates": "none"}]
    spec = parse_spec(raw)
    assert arm_params(spec.stages, registries(), "rtn[bits/0-1 attention=5, bits/0-1 mlp=3]", "x") == {
        "stage0.method": "rtn", "rtn.bits/0-1 attention": 5, "rtn.bits/0-1 mlp": 3}
    assert dict(spec.constraints[0].arm) == {"stage0.method": "rtn", "rtn.bits/0-1 attention": 4, "rtn.bits/0-1 mlp": 4}
    with pytest.raises(ConfigError, match=r"'6' is not one of its values \[3, 4, 5\]"):
        arm_params(spec.stages, registries(), "rtn[bits/0-1 mlp=6]", "x")
