"""The data path apart from rendering: store reads, frontiers, the cache, reproduce files, images."""

from __future__ import annotations

import hashlib

import optuna
import pandas as pd
import pytest
from optuna.distributions import CategoricalDistribution, FloatDistribution
from optuna.trial import create_trial

from paretolab.dashboard import data, runs
from paretolab.dashboard.plots import frontier_points
from paretolab.dashboard.static_plot import frontier_image
from paretolab.dashboard.reproduce import reproduce_pipeline
from paretolab.stores import resolve_stores


def _digest(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_trials_read_in_one_pass_match_optuna(fixture_home):
    stores = resolve_stores(home=str(fixture_home))
    before = _digest(fixture_home / "optuna.db"), _digest(fixture_home / "mlflow.db")
    data.clear_cache()
    table = data.load_trials(stores.optuna_url, "demo", methods_cost={"magnitude": "simulated", "rtn": "simulated"})
    study = optuna.load_study(study_name="demo", storage=stores.optuna_url)
    frame = table.frame.set_index("number")
    for trial in study.get_trials():
        row = frame.loc[trial.number]
        assert row["state"] == trial.state.name
        assert {c.removeprefix("param:"): row[c] for c in table.param_columns if row[c] is not None} == trial.params
        if trial.values:
            assert [row["ppl"], row["size_bytes"]] == trial.values
    assert isinstance(frame.loc[7, "param:rtn.bits"], int), "categorical ints stay ints"
    assert frame.loc[0, "methods"] == "none" and frame.loc[7, "methods"] == "magnitude+rtn"
    assert frame.loc[7, "simulated"] == "magnitude,rtn" and frame.loc[0, "simulated"] == ""
    front = table.frontier(["ppl", "size_bytes"], ["minimize", "minimize"])
    assert sorted(front) == sorted(t.number for t in study.best_trials)
    metrics = runs.trial_metrics(stores.tracking_uri, "demo")
    assert sorted(metrics["number"]) == list(range(12)) and metrics.set_index("number").loc[3, "prefill_ms"] == 13.0
    assert (_digest(fixture_home / "optuna.db"), _digest(fixture_home / "mlflow.db")) == before, "the dashboard never writes"


def test_cache_is_reused_until_the_study_changes(tmp_path):
    url = f"sqlite:///{tmp_path / 'optuna.db'}"
    study = optuna.create_study(study_name="s", storage=url, directions=["minimize", "minimize"])
    study.set_user_attr("objectives", [["ppl", "minimize"], ["size_bytes", "minimize"]])
    dist = {"x": FloatDistribution(0, 1)}
    study.add_trials([create_trial(params={"x": 0.1 * i}, distributions=dist, values=[float(i), float(10 - i)]) for i in range(5)])
    data.clear_cache()
    first = data.load_trials(url, "s")
    assert data.load_trials(url, "s") is first and data.cached_trials(url, "s") is first
    study.add_trial(create_trial(params={"x": 0.9}, distributions=dist, values=[0.0, 0.0]))
    assert data.cached_trials(url, "s") is None
    second = data.load_trials(url, "s")
    assert second is not first and list(second.frontier(["ppl", "size_bytes"], ["minimize", "minimize"])) == [5]


def test_a_store_that_does_not_exist_is_not_created(tmp_path):
    url = f"sqlite:///{tmp_path / 'nothing.db'}"
    assert data.list_studies(url) == []
    assert runs.trial_metrics(url, "x").empty
    assert not (tmp_path / "nothing.db").exists()


def test_per_method_frontiers_and_maximised_axes():
    import pandas as pd

    frame = pd.DataFrame({"number": [0, 1, 2, 3], "acc": [0.5, 0.7, 0.6, 0.9], "size_bytes": [1.0, 2.0, 1.5, 3.0], "methods": ["a", "a", "b", "b"]})
    assert list(data.frontier_numbers(frame, ["acc", "size_bytes"], ["maximize", "minimize"])) == [0, 1, 2, 3]
    frame.loc[2, "acc"] = 0.4  # now dominated by trial 0 overall, but still on method b's own frontier
    assert list(data.frontier_numbers(frame, ["acc", "size_bytes"], ["maximize", "minimize"])) == [0, 1, 3]
    assert list(data.frontier_numbers(frame, ["acc", "size_bytes"], ["maximize", "minimize"], "methods")) == [0, 1, 2, 3]


def test_reproduce_fixes_choices_and_searched_params():
    pipeline = {
        "name": "p",
        "stages": [{"method": "magnitude", "params": {"sparsity": {"low": 0.1, "high": 0.9}}},
                   {"id": "q", "choice": [{"method": "rtn", "params": {"bits": [2, 4]}}, {"method": "none"}]}],
        "search": {"sampler": "nsga2", "trials": 30, "population_size": 8},
    }
    out = reproduce_pipeline(pipeline, {"magnitude.sparsity": 0.3, "q.method": "rtn", "rtn.bits": 4}, study="p", number=5)
    assert out["stages"] == [{"method": "magnitude", "params": {"sparsity": 0.3}}, {"method": "rtn", "id": "q", "params": {"bits": 4}}]
    assert out["name"] == "p-trial5" and out["search"] == {"sampler": "random", "trials": 1}
    none = reproduce_pipeline(pipeline, {"magnitude.sparsity": 0.3, "q.method": "none"}, study="p", number=6)
    assert none["stages"][1] == {"method": "none", "id": "q"}


@pytest.mark.parametrize("fmt, magic", [("png", b"\x89PNG"), ("svg", b"<?xml")])
def test_frontier_image_without_a_browser(fixture_home, fmt, magic):
    stores = resolve_stores(home=str(fixture_home))
    table = data.load_trials(stores.optuna_url, "demo")
    front = table.frontier(["ppl", "size_bytes"], ["minimize", "minimize"])
    plot = frontier_points(table.complete(), front, x="ppl", y="size_bytes", directions=("minimize", "minimize"), param_columns=table.param_columns)
    assert frontier_image(plot, fmt).startswith(magic)
    csv = plot.csv().splitlines()
    assert csv[0].startswith("number,ppl,size_bytes,methods,simulated") and len(csv) == 1 + len(front)


def test_categorical_params_of_mixed_types_come_back_as_given(tmp_path):
    url = f"sqlite:///{tmp_path / 'optuna.db'}"
    study = optuna.create_study(study_name="s", storage=url)
    dist = {"c": CategoricalDistribution([None, 2, "x", 1.5])}
    study.add_trials([create_trial(params={"c": v}, distributions=dist, value=1.0) for v in (None, 2, "x", 1.5)])
    table = data.load_trials(url, "s")
    assert table.frame["param:c"].tolist() == [None, 2, "x", 1.5]


def test_the_frontier_plot_averages_the_draws_of_each_configuration_and_says_so():
    """A routing study over three splits: each configuration one point at its draws' mean, and the caption says so; a
    study without replicates keeps its trials as they are and says nothing."""
    import pandas as pd

    from paretolab.dashboard.configurations import configuration_means
    from paretolab.dashboard.view_frontier import replicate_note

    columns = ["param:sdr.split", "param:sdr.cost_weight"]
    trials = pd.DataFrame({"number": range(6), "methods": "sdr", "param:sdr.split": [0, 1, 2, 0, 1, 2],
                           "param:sdr.cost_weight": [0.1] * 3 + [0.3] * 3, "acc": [0.5, 0.6, 0.7, 0.2, 0.3, 0.4]})
    points = configuration_means(trials, columns, ["acc"])
    assert points["number"].tolist() == [0, 3] and points["acc"].tolist() == pytest.approx([0.6, 0.3])
    assert points["trials"].tolist() == ["0+1+2", "3+4+5"] and points["draws"].tolist() == [3, 3]
    note = replicate_note(points, columns)
    assert note and note[0].startswith("each point is a configuration at the mean over its draws (split; up to 3")
    assert configuration_means(trials.assign(**{"param:sdr.split": 0}), columns, ["acc"]) is None
    assert replicate_note(trials, columns) == []


def test_a_repaint_reads_only_new_and_formerly_running_trials_and_matches_a_full_read(tmp_path, monkeypatch):
    """The cache follows the store by trial id: a finished trial and new trials (one with a new parameter) show up,
    unchanged studies read no trial rows at all, and the result equals reading everything again."""

    from paretolab.dashboard import store_read

    url = f"sqlite:///{tmp_path / 'optuna.db'}"
    study = optuna.create_study(study_name="s", storage=url, directions=["minimize", "minimize"])
    study.set_user_attr("objectives", [["ppl", "minimize"], ["size_bytes", "minimize"]])
    dist = {"x": FloatDistribution(0, 1)}
    study.add_trials([create_trial(params={"x": 0.1 * i}, distributions=dist, values=[float(i), float(10 - i)]) for i in range(5)])
    running = study.ask(dist)  # trial 5, still running
    data.clear_cache()
    first = data.load_trials(url, "s")
    assert first.frame["state"].tolist() == ["COMPLETE"] * 5 + ["RUNNING"] and first.study.counts == {"COMPLETE": 5, "RUNNING": 1}

    read: list[str] = []
    counting = store_read.read_columns

    def read_columns(conn, table, where, columns):
        out = counting(conn, table, where, columns)
        if table == "trials":
            read.extend(str(number) for number in out[1])
        return out

    monkeypatch.setattr(store_read, "read_columns", read_columns)
    assert data.load_trials(url, "s") is first and read == [], "an unchanged study reads no trial"
    study.tell(running, [0.5, 0.5])
    study.add_trial(create_trial(params={"x": 0.2, "bits": 4}, distributions={**dist, "bits": CategoricalDistribution([2, 4])}, values=[9.0, 9.0]))
    second = data.load_trials(url, "s")
    assert sorted(read) == ["5", "6"], "only the trial that was running and the new one are read"
    assert second.study.counts == {"COMPLETE": 7}
    assert list(second.frontier(["ppl", "size_bytes"], ["minimize", "minimize"])) == [0, 5]
    data.clear_cache()
    full = data.load_trials(url, "s")
    pd.testing.assert_frame_equal(second.frame, full.frame)
    assert second.frame["param:bits"].tolist() == [None] * 6 + [4]


def test_columns_read_as_one_string_each_equal_the_rows_read_one_by_one(tmp_path, monkeypatch):
    """SQLite's aggregated read (numbers parsed in C) and the row-by-row read other databases get build the same
    table, bit for bit: floats that need 17 digits, infinite values, a missing value, params of each kind, a trial
    without a parameter, texts with commas, a running trial without an end time, a failed one without values."""
    from optuna.distributions import IntDistribution

    from paretolab.dashboard import store_read

    url = f"sqlite:///{tmp_path / 'optuna.db'}"
    study = optuna.create_study(study_name="s", storage=url, directions=["minimize", "minimize"])
    study.set_user_attr("objectives", [["ppl", "minimize"], ["size_bytes", "minimize"]])
    dist = {"x": FloatDistribution(0, 1), "k": IntDistribution(1, 9), "c": CategoricalDistribution(["a,b", None, 3])}
    study.add_trials([create_trial(params={"x": 1 / 3, "k": 7, "c": "a,b"}, distributions=dist, values=[0.1 + 0.2, float("inf")]),
                      create_trial(params={"x": 2 / 3, "k": 2, "c": None}, distributions=dist, values=[-float("inf"), 1e-300]),
                      create_trial(params={"x": 0.5}, distributions={"x": dist["x"]}, values=[5.0, 5.0], user_attrs={"fail_reason": "a, b"}),
                      create_trial(state=optuna.trial.TrialState.FAIL, params={"c": 3}, distributions={"c": dist["c"]})])
    other = optuna.create_study(study_name="other", storage=url, directions=["minimize", "minimize"])
    other.add_trial(create_trial(params={"x": 0.25, "c": "a,b"}, distributions={"x": dist["x"], "c": dist["c"]}, values=[1.0, 1.0]))  # between two of s's trial ids
    study.ask(dist)
    data.clear_cache()
    aggregated = data.load_trials(url, "s").frame
    monkeypatch.setattr(store_read, "AGGREGATED", ())
    data.clear_cache()
    rows = data.load_trials(url, "s").frame
    pd.testing.assert_frame_equal(aggregated, rows)
    assert aggregated["ppl"].tolist()[:3] == [0.1 + 0.2, -float("inf"), 5.0] and aggregated["size_bytes"][0] == float("inf")
    assert aggregated["param:x"].tolist()[:3] == [1 / 3, 2 / 3, 0.5] and aggregated["param:c"].tolist()[:4] == ["a,b", None, None, 3]
    assert aggregated["param:k"].tolist()[:3] == [7, 2, None] and aggregated["fail_reason"][2] == "a, b"
    assert aggregated["state"].tolist() == ["COMPLETE"] * 3 + ["FAIL", "RUNNING"] and pd.isna(aggregated["datetime_complete"][4])
    assert pd.isna(aggregated["ppl"][4]) and aggregated["param:x"][4] != 0.25, "another study's trial between s's ids is not read"
    assert data.load_trials(url, "other").frame["param:x"].tolist() == [0.25], "a study's ids that run unbroken are read as a range"
