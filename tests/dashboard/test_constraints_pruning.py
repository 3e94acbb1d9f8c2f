"""Issue 32 on the dashboard: the frontier over feasible trials (infeasible ones drawn as grey crosses), pruned
trials' curves on the Curves page (dotted, with their step) and never on a frontier. Stores: ``constrained_home``."""

from __future__ import annotations

import pytest

from paretolab.dashboard import data
from paretolab.dashboard.context import label
from paretolab.dashboard.plots import frontier_points
from paretolab.dashboard.static_plot import frontier_image
from paretolab.stores import resolve_stores
from tests.dashboard.conftest import CURVE_POINTS, INFEASIBLE_DOMINATING, PRUNED_STEP, PRUNED_TRIAL, curve_loss
from tests.dashboard.test_app import figure, frame_of, open_app, texts

LEGEND = "infeasible: breaks decode_tok_s >= 150 or ppl <= 1.5 x none"
WHY = "decode_tok_s 100 breaks decode_tok_s >= 150"


def test_the_frontier_data_is_over_feasible_trials_and_keeps_the_infeasible_ones_marked(constrained_home):
    url = resolve_stores(home=str(constrained_home)).optuna_url
    data.clear_cache()
    table = data.load_trials(url, "constrained")
    assert table.study.constraints == ("decode_tok_s >= 150", "ppl <= 1.5 x none")
    frame = table.frame.set_index("number")
    assert frame["feasible"].tolist() == [True, True, True, False, False, True]
    assert frame.loc[INFEASIBLE_DOMINATING, "infeasible_because"] == WHY and frame.loc[0, "infeasible_because"] == ""
    front = table.frontier(["ppl", "size_bytes"], ["minimize", "minimize"])
    assert list(front) == [0, 1, 2]  # trial 3 dominates all three, and breaks decode_tok_s >= 150
    assert list(table.frontier(["ppl", "size_bytes"], ["minimize", "minimize"], by="methods")) == [0, 1, 2, 5]
    plot = frontier_points(table.complete(), front, x="ppl", y="size_bytes", directions=("minimize", "minimize"),
                           param_columns=table.param_columns, constraints=table.study.constraints)
    assert plot.infeasible["number"].tolist() == [3, 4] and plot.front["number"].tolist() == [0, 1, 2]
    assert plot.infeasible_label() == LEGEND and f"<b>infeasible</b>: {WHY}" in plot.infeasible["hover"].iloc[0]
    assert frontier_image(plot, "svg").startswith(b"<?xml")
    assert [line.split(",")[0] for line in plot.csv().splitlines()[1:]] == ["0", "1", "2"]


def test_a_pruned_trial_is_read_with_its_step_and_is_never_on_a_frontier(constrained_home):
    url = resolve_stores(home=str(constrained_home)).optuna_url
    table = data.load_trials(url, "pruned")
    row = table.frame.set_index("number").loc[PRUNED_TRIAL]
    assert (row["state"], row["pruned_at_step"], row["feasible"]) == ("PRUNED", PRUNED_STEP, True)
    assert PRUNED_TRIAL not in table.frontier(["val_loss", "train_flops"], ["minimize", "minimize"])
    assert [s for s in data.list_studies(url) if s.name == "pruned"][0].counts == {"COMPLETE": 4, "PRUNED": 1}


def test_frontier_page_draws_infeasible_trials_as_grey_crosses_never_on_the_frontier(constrained_env):
    at = open_app("Frontier", "constrained")
    fig = figure(at)
    front = next(t for t in fig["data"] if t.get("name") == "Pareto frontier")
    assert sorted(front["customdata"]) == [0, 1, 2]
    crosses = next(t for t in fig["data"] if t.get("name") == LEGEND)
    assert crosses["marker"]["symbol"] == "x" and crosses["marker"]["color"] == "#9a9a9a" and sorted(crosses["customdata"]) == [3, 4]
    drawn_as_methods = [n for t in fig["data"] if t.get("legendgroup") in ("none", "rtn", "magnitude+rtn") for n in t.get("customdata", [])]
    assert INFEASIBLE_DOMINATING not in drawn_as_methods  # drawn once, as a cross
    assert sorted(frame_of(at)["number"]) == [0, 1, 2]
    assert "feasible frontier under: decode_tok_s >= 150; ppl <= 1.5 x none; 2 infeasible trial(s) drawn as grey ×" in texts(at)
    at.toggle(key="fper").set_value(True).run()  # each method's own frontier: over its feasible trials too
    own = {t["name"]: t for t in figure(at)["data"] if str(t.get("name", "")).endswith(" frontier") and t["name"] != "Pareto frontier"}
    assert sorted(own) == ["magnitude+rtn frontier", "none frontier", "rtn frontier"]
    assert own["magnitude+rtn frontier"]["x"] == [23.0]  # trial 5 (ppl 23), not the infeasible trial 3 (ppl 19)


def test_curves_page_draws_the_pruned_trial_dotted_and_says_where_it_stopped(constrained_env):
    at = open_app("Curves", "pruned")
    fig = figure(at)
    name = f"dyt · trial {PRUNED_TRIAL} · pruned at step {PRUNED_STEP}"
    pruned = next(t for t in fig["data"] if t["name"] == name)
    assert pruned["line"]["dash"] == "dot" and pruned["opacity"] == 0.5
    assert pruned["x"] == [1024, 2048] and pruned["y"] == pytest.approx([curve_loss("dyt", 0, i) for i in (1, 2)])
    groups = {t["name"] for t in fig["data"] if not t["name"].endswith("band") and t["name"] != name}
    assert groups == {"bhyt (2 seeds)", "none (2 seeds)"}  # the pruned trial is in no group's mean or band
    assert list(frame_of(at)["group"]) == ["bhyt", "none"]
    assert frame_of(at).set_index("group").loc["none", "final val_loss (mean)"] == pytest.approx(curve_loss("none", 0.5, CURVE_POINTS))
    assert "1 pruned trial(s) drawn faded and dotted" in texts(at)
    frontier = open_app("Frontier", "pruned")
    front = next(t for t in figure(frontier)["data"] if t.get("name") == "Pareto frontier")
    assert PRUNED_TRIAL not in front["customdata"] and "1 pruned trial(s) not shown" in texts(frontier)


def test_studies_page_counts_pruned_trials_and_the_trial_page_says_why_a_trial_is_off_the_frontier(constrained_env):
    table = frame_of(open_app())
    table = table.assign(study=table["study"].str.rsplit("=", n=1).str[-1]).set_index("study")  # a name is a link to its Frontier
    assert table.loc["pruned", ["complete", "pruned", "running"]].tolist() == [4, 1, 0]
    infeasible = open_app("Trial", "constrained", trial=INFEASIBLE_DOMINATING)
    # the reason as Markdown source, escaped (dashboard.context.label): the page shows the characters it holds
    assert any(w.value.startswith(f"Infeasible: {label(WHY)}. It stays off every frontier") for w in infeasible.warning)
    assert label(WHY) == r"decode\_tok\_s 100 breaks decode\_tok\_s \>= 150"
    pruned = open_app("Trial", "pruned", trial=PRUNED_TRIAL)
    assert any(i.value.startswith(f"Pruned at step {PRUNED_STEP}") for i in pruned.info)
