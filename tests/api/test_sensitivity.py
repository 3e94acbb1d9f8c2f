"""paretolab sensitivity: the method on one group at a time, paired against the unmodified model, ranked, greedy under a budget."""

from __future__ import annotations

import json

import pytest

from paretolab.errors import ConfigError

TASK = {"corpus": "pydoc", "max_tokens": 1024, "context": 128, "stride": 128}


@pytest.fixture(scope="module")
def result():
    from paretolab.api.sensitivity import sensitivity

    return sensitivity("tiny-llama", "rtn", {"bits": 2}, by="layer-kind", task=TASK, progress=lambda _: None)


def test_each_group_is_scored_alone_on_the_base_models_windows(result):
    import paretolab
    from paretolab.api.sensitivity import _score
    from paretolab.models import load_subject
    from paretolab.plugin_api.manager import registries

    assert [g.group for g in result.groups] == ["0 attention", "1 attention", "0 mlp", "1 mlp"]
    assert [g.modules for g in result.groups] == [4, 4, 3, 3] and result.windows == 8
    whole = paretolab.apply("tiny-llama", "rtn", bits=2)
    # the groups partition the model: their savings add up to the whole model's
    assert sum(g.bytes_saved for g in result.groups) == pytest.approx(result.base_size - whole.costs["size_bytes"])
    alone = paretolab.apply("tiny-llama", [{"method": "rtn", "params": {"bits": 2}, "layers": {"0 mlp": {"bits": 2}, "rest": "keep"}}])
    metrics, _, _ = _score(alone.subject, [], registries().tasks.get("perplexity"), {"name": "perplexity", **TASK}, 0)
    g = next(g for g in result.groups if g.group == "0 mlp")
    assert g.metric == pytest.approx(metrics["ppl"], rel=1e-9)
    base, _, _ = _score(load_subject("tiny-llama"), [], registries().tasks.get("perplexity"), {"name": "perplexity", **TASK}, 0)
    assert result.base == pytest.approx(base["ppl"]) and g.delta == pytest.approx(metrics["ppl"] - base["ppl"])
    assert all(x.low <= x.delta <= x.high and x.low < x.high for x in result.groups)


def test_the_ranking_puts_the_cheapest_per_mb_first_and_greedy_stops_at_the_budget(result):
    ranked = result.ranking()
    assert [g.per_mb for g in ranked] == sorted(g.per_mb for g in ranked)
    budget = result.base_size - ranked[0].bytes_saved - ranked[1].bytes_saved / 2  # needs the first two groups
    greedy = result.greedy(budget)
    assert greedy["groups"] == [ranked[0].group, ranked[1].group] and greedy["fits"]
    assert greedy["predicted_size_bytes"] == pytest.approx(result.base_size - ranked[0].bytes_saved - ranked[1].bytes_saved)
    assert greedy["layers"] == {ranked[0].group: {"bits": 2, "group_size": 128}, ranked[1].group: {"bits": 2, "group_size": 128}, "rest": "keep"}
    assert not result.greedy(1.0)["fits"] and result.greedy(result.base_size)["groups"] == []


def test_the_greedy_layers_block_runs_as_a_pipeline_stage_and_meets_its_predicted_size(result):
    import paretolab

    ranked = result.ranking()
    greedy = result.greedy(result.base_size - ranked[0].bytes_saved - 1)
    ran = paretolab.apply("tiny-llama", [{"method": "rtn", "params": {"bits": 2}, "layers": greedy["layers"]}])
    assert ran.costs["size_bytes"] == pytest.approx(greedy["predicted_size_bytes"])


def test_it_writes_the_table_the_json_and_the_plot(result, tmp_path):
    from paretolab.api.sensitivity import write

    paths = write(result, tmp_path / "s", budget_bytes=result.base_size * 0.8)
    assert sorted(p.name for p in paths) == ["sensitivity.json", "sensitivity.md", "sensitivity.png", "sensitivity.svg"]
    data = json.loads((tmp_path / "s" / "sensitivity.json").read_text())
    assert [g["group"] for g in data["groups"]] == [g.group for g in result.ranking()] and "greedy" in data
    text = (tmp_path / "s" / "sensitivity.md").read_text()
    assert "| 1 | " + result.ranking()[0].group in text and "rest: keep" in text
    with pytest.raises(ConfigError, match="exists; pick a new directory or pass --force"):
        write(result, tmp_path / "s")


@pytest.mark.parametrize("method, params, by, fragment", [
    ("catq", {}, "layer", "--method catq: it changes the whole model at once"),
    ("rtn", {"bitz": 3}, "layer", "--params: method 'rtn' has no parameter 'bitz'"),
    ("rtn", {"bits": 3}, "rows", "--by 'rows': give one of layer, layer-kind, kind"),
    ("rtn", {"bits": 3}, ["7 mlp"], "group '7 mlp' holds none"),
])
def test_refusals_name_the_flag_the_value_and_the_fix(method, params, by, fragment):
    from paretolab.api.sensitivity import sensitivity

    with pytest.raises(ConfigError) as err:
        sensitivity("tiny-llama", method, params, by=by, task=TASK, progress=lambda _: None)
    assert fragment in str(err.value)
