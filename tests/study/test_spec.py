"""Pipeline validation: a wrong pipeline is refused with the field, the value and the fix."""

from __future__ import annotations

import pytest

from paretolab.errors import ConfigError
from paretolab.study.spec import load_spec, parse_spec
from paretolab.study.stages import Choices, Fixed, Range
from tests.conftest import edited

GOOD = {
    "name": "smoke",
    "model": "tiny-llama",
    "task": {"name": "perplexity", "corpus": "pydoc", "max_tokens": 4096},
    "stages": [
        {"method": "magnitude", "params": {"sparsity": {"low": 0.1, "high": 0.9}}},
        {"choice": [{"method": "rtn", "params": {"bits": [2, 3, 4, 8]}}, {"method": "none"}]},
    ],
    "objectives": [{"metric": "ppl", "direction": "minimize"}, {"metric": "size_bytes"}],
    "search": {"sampler": "nsga2", "trials": 12, "seed": 0, "trial_timeout_s": 600},
    "resources": {"cpus": 1, "gpus": 0},
}


def broken(path: str, value):
    return edited(GOOD, path, value)


def test_the_issue_example_parses_into_param_specs():
    spec = parse_spec(GOOD)
    assert [s.id for s in spec.stages] == ["stage0", "stage1"]
    assert spec.stages[0].options[0].params["sparsity"] == Range(0.1, 0.9)
    assert spec.stages[1].options[0].params["bits"] == Choices((2, 3, 4, 8))
    assert [o.direction for o in spec.objectives] == ["minimize", "minimize"]  # size_bytes' own direction
    assert spec.methods() == ["magnitude", "none", "rtn"]


def test_shipped_pipelines_are_valid(pytestconfig):
    root = pytestconfig.rootpath / "pipelines"
    names = sorted(p.name for p in root.glob("*.yaml"))
    assert {"smoke.yaml", "demo.yaml"} <= set(names)
    from paretolab.study.search import grid_points
    from tests.study.shipped_pipelines import load_shipped

    for path in root.glob("*.yaml"):
        spec = load_shipped(path)
        if spec.search.sampler == "grid":  # every parameter enumerable, and enough points for the trials asked
            assert len(grid_points(spec)) >= (spec.search.trials or 1), path.name


@pytest.mark.parametrize(
    "path, value, message",
    [
        ("stages.0.method", "magnitud", "stages[0].method: unknown method 'magnitud'; did you mean 'magnitude'"),
        ("stages.0.params", {"sparsity": 0.5, "sparsty": 1}, "stages[0].params.sparsty: method 'magnitude' has no parameter 'sparsty'; did you mean 'sparsity'"),
        ("stages.0.params", {"sparsity": {"low": 0.9, "high": 0.1}}, "stages[0].params.sparsity: low (0.9) is greater than high (0.1)"),
        ("stages.0.params", {"sparsity": []}, "cannot be empty"),
        ("search.sampler", "nsga", "search.sampler: unknown sampler 'nsga'; did you mean 'nsga2'"),
        ("search.trials", 0, "search.trials: expected a positive integer, got 0"),
        ("objectives.0.metric", "perplexity", "objectives[0].metric: unknown metric 'perplexity'"),
        ("objectives.0.direction", "down", "objectives[0].direction: expected minimize or maximize, got 'down'"),
        ("task.name", "perplexty", "task.name: unknown task 'perplexty'; did you mean 'perplexity'"),
        ("task.max_tokens", "many", "task.max_tokens: expected an integer, got 'many'"),
        ("task.corpuss", "pydoc", "task.corpuss: unknown option; did you mean 'corpus'"),
        ("resources.gpus", -1, "resources.gpus: expected a non-negative number, got -1"),
        ("name", "has space", "name: 'has space' must start with a letter or digit"),
        ("model", KeyError, "model: required field is missing"),
        ("stagse", [], "stagse: unknown field; did you mean 'stages'"),
    ],
)
def test_errors_name_the_field_and_the_value(path, value, message):
    with pytest.raises(ConfigError) as info:
        parse_spec(broken(path, value))
    assert message in str(info.value)


def test_a_config_error_is_also_a_value_error():
    with pytest.raises(ValueError):
        parse_spec(broken("search.sampler", "bayes"))


def test_fixed_params_and_hash_ignores_trial_count():
    raw = broken("stages.0.params", {"sparsity": 0.5, "scope": "matrix"})
    spec = parse_spec(raw)
    assert spec.stages[0].options[0].params == {"sparsity": Fixed(0.5), "scope": Fixed("matrix")}
    more = parse_spec(broken("search.trials", 99))
    assert more.pipeline_hash() == parse_spec(GOOD).pipeline_hash()
    assert parse_spec(broken("search.seed", 3)).pipeline_hash() != parse_spec(GOOD).pipeline_hash()


def test_missing_file_and_bad_yaml(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_spec(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: [unclosed")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_spec(bad)
