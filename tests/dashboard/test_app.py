"""Each dashboard page, driven through Streamlit's AppTest on the fixture stores (no browser)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from streamlit.testing.v1 import AppTest

APP = str(Path(__file__).resolve().parents[2] / "dashboard" / "app.py")
TIMEOUT = 60  # the first run imports the plugins (torch)


def open_app(page: str = "Studies", study: str | None = None, trial: int | None = None) -> AppTest:
    at = AppTest.from_file(APP, default_timeout=TIMEOUT)
    at.query_params["page"] = page
    if study:
        at.query_params["study"] = study
    if trial is not None:
        at.query_params["trial"] = str(trial)
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def texts(at: AppTest) -> str:
    parts = [e.value for kind in ("header", "info", "error", "warning", "caption", "markdown", "code", "subheader") for e in getattr(at, kind)]
    return "\n".join(str(p) for p in parts)


def figure(at: AppTest, index: int = 0) -> dict:
    """The plotly figure a chart element carries, with plotly's base64 typed arrays decoded to lists."""
    import base64
    import json

    import numpy as np

    def decode(obj):
        if isinstance(obj, dict) and set(obj) >= {"bdata", "dtype"}:
            return np.frombuffer(base64.b64decode(obj["bdata"]), dtype=obj["dtype"]).tolist()
        if isinstance(obj, dict):
            return {k: decode(v) for k, v in obj.items()}
        if isinstance(obj, list):
            return [decode(v) for v in obj]
        return obj

    return decode(json.loads(at.get("plotly_chart")[index].proto.spec))


def frame_of(at: AppTest, index: int = 0):
    return at.dataframe[index].value


def test_studies_lists_every_study_with_counts_and_progress(store_env):
    at = open_app()
    table = frame_of(at)
    assert table["study"].tolist() == [f"?page=Frontier&study={n}" for n in ("demo", "single", "training")]  # each name opens its Frontier
    table = table.assign(study=table["study"].str.rsplit("=", n=1).str[-1]).set_index("study")
    assert list(table.index) == ["demo", "single", "training"]
    assert table.loc["demo", ["complete", "failed", "running", "planned"]].tolist() == [10, 2, 1, 16]
    assert table.loc["demo", "progress"] == pytest.approx(12 / 16)
    assert "ppl ↓" in table.loc["demo", "objectives"]
    assert table.loc["single", "complete"] == 1
    # the status `paretolab studies` prints: demo has failed and running trials, no driver and fewer complete than planned
    assert table.loc["demo", "status"] == "interrupted" and table.loc["single", "status"] == "finished"
    assert "resume with `paretolab run" in texts(at)


def test_a_study_link_opens_its_frontier(store_env):
    at = open_app(page="Frontier", study="single")
    assert at.sidebar.selectbox[0].value == "single" and not [w for w in at.warning if "No study" in w.value]


def test_an_unknown_study_in_the_url_is_said_not_silently_replaced(store_env):
    at = open_app(page="Frontier", study="dmeo")
    warned = " ".join(w.value for w in at.warning)
    assert "No study 'dmeo'" in warned and "Did you mean 'demo'?" in warned and "Showing 'demo' instead" in warned


def test_frontier_shows_trials_frontier_reference_and_simulated_marks(store_env):
    at = open_app("Frontier", "demo")
    fig = figure(at)
    names = [t.get("name") for t in fig["data"]]
    assert "Pareto frontier" in names and "unmodified model" in names
    front = next(t for t in fig["data"] if t.get("name") == "Pareto frontier")
    assert front["line"]["shape"] == "hv"
    # the frontier of the fixture on (ppl, size_bytes), both minimised
    assert sorted(front["customdata"]) == [0, 3, 4, 5, 7, 8]
    assert any(t.get("marker", {}).get("symbol") == "circle-open" for t in fig["data"]), "simulated-cost trials are hollow"
    notes = texts(at)
    assert "2 failed trial(s) not shown" in notes and "cost saving simulated by" in notes
    table = frame_of(at)
    assert sorted(table["number"]) == [0, 3, 4, 5, 7, 8]
    csv = next(b for b in at.get("download_button") if b.proto.label == "Frontier CSV")
    assert csv is not None


def test_frontier_draws_error_bars_in_the_methods_colour_and_names_points_within_noise(store_env):
    at = open_app("Frontier", "demo")
    fig = figure(at)
    rtn = next(t for t in fig["data"] if t.get("name") == "rtn")
    # each point's ppl interval (±5 % in the fixture) as asymmetric error bars on the ppl axis (y here: x is size_bytes)
    axis = "error_x" if fig["layout"]["xaxis"]["title"]["text"] == "ppl ↓" else "error_y"
    ppl = rtn["x"] if axis == "error_x" else rtn["y"]
    assert rtn[axis]["array"] == pytest.approx([0.05 * v for v in ppl]) and rtn[axis]["arrayminus"] == pytest.approx([0.05 * v for v in ppl])
    assert rtn[axis]["color"] == rtn["marker"]["color"], "error bars in the method's colour, not black"
    assert not any(t.get("name") == "within noise of a neighbour" for t in fig["data"]), "no red crosses over the method's marker"
    # trials 0 (ppl 20.0 [19, 21]) and 3 (20.2 [19.19, 21.21]) are neighbours on the frontier and within noise
    table = frame_of(at).set_index("number")
    assert table.loc[0, "noise"] == "ppl ≈ trial 3" and table.loc[4, "noise"] == ""
    assert "error bars" in texts(at)


def test_frontier_options_log_axes_third_metric_and_per_method(store_env):
    at = open_app("Frontier", "demo")
    at.selectbox(key="fx").set_value("prefill_ms").run()
    at.selectbox(key="fy").set_value("decode_tok_s").run()
    at.selectbox(key="fz").set_value("ppl").run()
    at.toggle(key="flogx").set_value(True).run()
    at.toggle(key="fper").set_value(True).run()
    assert not at.exception, [e.value for e in at.exception]
    fig = figure(at)
    assert fig["layout"]["xaxis"]["type"] == "log"
    assert fig["layout"]["coloraxis"]["colorbar"]["title"]["text"] == "ppl"
    assert any(str(t.get("name", "")).endswith(" frontier") and t.get("name") != "Pareto frontier" for t in fig["data"])
    # decode_tok_s is maximised (from the metric registry): the step line turns the other way round for y only
    front = next(t for t in fig["data"] if t.get("name") == "Pareto frontier")
    assert len(front["x"]) >= 1


def test_frontier_button_opens_the_trial_page(store_env):
    at = open_app("Frontier", "demo")
    next(b for b in at.button if b.label == "Trial 4").click().run()
    assert at.sidebar.radio(key="page").value == "Trial"
    assert at.selectbox(key="trial").value == 4
    assert "Trial · demo" in texts(at)


def test_trial_page_shows_params_metrics_timings_tags_and_reproduce(store_env):
    at = open_app("Trial", "demo", trial=7)
    params = frame_of(at, 0).set_index("name")["value"].to_dict()
    assert params == {"magnitude.sparsity": "0.6", "rtn.bits": "4", "stage0.method": "magnitude", "stage1.method": "rtn"}
    metrics = frame_of(at, 2).set_index("name")["value"].to_dict()  # 1 is the MLflow params expander
    assert metrics["ppl"] == "40" and metrics["prefill_ms"] == "17"
    assert "Stage timings (s)" in texts(at)
    assert "cost saving of magnitude,rtn is simulated" in texts(at)
    reproduce = next(c.value for c in at.code if c.value.startswith("# trial 7"))
    pipeline = yaml.safe_load(reproduce)
    assert pipeline["stages"] == [
        {"method": "magnitude", "params": {"sparsity": 0.6, "scope": "row"}},
        {"method": "rtn", "params": {"bits": 4, "group_size": 32}},
    ]
    from paretolab.study.spec import parse_spec

    spec = parse_spec(pipeline)  # the reproduce file is a valid pipeline
    assert spec.search.trials == 1
    assert "paretolab export demo 7 --out demo-trial7" in [c.value for c in at.code]


def test_failed_trial_shows_reason_and_traceback(store_env):
    at = open_app("Trial", "demo", trial=10)
    assert not any(c.value.startswith("paretolab export") for c in at.code), "a failed trial has no model to export"
    assert any("objective metric 'ppl' is nan" in e.value for e in at.error)
    assert any("RuntimeError: boom" in c.value for c in at.code)
    assert any(b.proto.label == "traceback.txt" for b in at.get("download_button"))


def test_running_trial_without_a_run_is_explained(store_env):
    at = open_app("Trial", "demo", trial=12)
    assert "No MLflow run recorded for this trial" in texts(at)


def test_compare_side_by_side_and_parallel_coordinates(store_env):
    at = open_app("Compare", "demo")
    assert at.multiselect(key="compare").value == [0, 3, 4, 5]
    at.multiselect(key="compare").set_value([3, 7]).run()
    side = frame_of(at)
    assert list(side.columns) == ["trial 3", "trial 7"]
    assert side.loc["methods"].tolist() == ["rtn", "magnitude+rtn"]
    assert side.loc["ppl"].tolist() == ["20.2", "40"]  # the one number formatter: no float noise, no trailing .0
    fig = figure(at)
    assert fig["data"][0]["type"] == "parcoords"
    axes = [d["label"] for d in fig["data"][0]["dimensions"]]
    # the searched params and the objectives (unit and direction), not every MLflow metric
    assert axes == ["magnitude.sparsity", "rtn.bits", "stage0.method", "stage1.method", "ppl ↓", "size [MB] ↓"], axes
    assert fig["data"][0]["dimensions"][-1]["values"] == [0.11, 0.059], "sizes drawn in the MB the title names"
    at.multiselect(key="pc_metrics").set_value(["prefill_ms"]).run()
    assert [d["label"] for d in figure(at)["data"][0]["dimensions"]][-1] == "prefill_ms [ms] ↓", "another metric when the user asks"


def test_methods_page_lists_the_registry(store_env):
    at = open_app("Methods")
    methods = frame_of(at, 0).set_index("method")
    assert {"magnitude", "rtn", "none"} <= set(methods.index)
    assert methods.loc["rtn", "cost"] == "simulated" and methods.loc["none", "cost"] == "real"
    assert "ppl" in set(frame_of(at, 1)["metric"])


def test_cluster_page_says_local_without_an_address(store_env):
    at = open_app("Cluster")
    assert at.info[0].value.startswith("local:")


def test_cluster_page_reports_an_unreachable_address(store_env, monkeypatch):
    monkeypatch.setenv("PARETOLAB_RAY_ADDRESS", "127.0.0.1:1")
    from paretolab.dashboard import cluster

    def refuse(address):
        raise ConnectionError(f"could not connect to {address}")

    monkeypatch.setattr(cluster, "cluster_info", refuse)
    at = open_app("Cluster")
    assert "Could not reach the Ray cluster at '127.0.0.1:1'" in at.error[0].value


def test_one_trial_study(store_env):
    at = open_app("Frontier", "single")
    assert sorted(frame_of(at)["number"]) == [0]
    at.sidebar.radio(key="page").set_value("Trial").run()
    assert not at.exception
    at.sidebar.radio(key="page").set_value("Compare").run()
    assert not at.exception


@pytest.mark.parametrize("page", ["Studies", "Frontier", "Trial", "Compare", "Curves"])
def test_empty_store_says_so_without_a_traceback(empty_env, page):
    at = open_app(page)
    assert any("No studies in" in i.value for i in at.info)
    assert not (empty_env / "optuna.db").exists(), "reading an empty store must not create it"


def test_frontier_of_a_random_weight_model_is_labelled_not_meaningful_for_quality(store_env):
    at = open_app("Frontier", "demo")  # the fixture studies ran on tiny-llama
    assert any("Not meaningful for quality: model 'tiny-llama' has random weights" in w.value for w in at.warning)


def test_energy_per_stage_and_provenance_with_estimates_marked(store_env):
    at = open_app("Trial", "demo", trial=4)
    shown = texts(at)
    assert "Energy per stage (J, estimate) — an estimate: CPU seconds × watts per core" in shown
    assert "Base model weights: random init (stored 400 kB; 200 kB in fp16)" in shown
    frontier = open_app("Frontier", "demo")
    assert "base weights: random init" in texts(frontier)
    frontier.selectbox(key="fz").set_value("energy_j").run()
    assert "energy is an estimate" in texts(frontier)
    assert frontier.selectbox(key="fz").options[1] == "prefill_speedup"  # the ratio leads the other metrics


def test_the_dashboard_never_creates_a_missing_home(tmp_path, monkeypatch):
    import argparse

    from paretolab.dashboard.context import stores_from

    for name in ("PARETOLAB_OPTUNA_STORAGE", "PARETOLAB_TRACKING_URI", "MLFLOW_TRACKING_URI", "PARETOLAB_HOME"):
        monkeypatch.delenv(name, raising=False)
    home = tmp_path / "nowhere"
    stores = stores_from(argparse.Namespace(home=str(home), storage=None, tracking_uri=None))
    assert str(home) in stores.optuna_url
    assert not home.exists(), "the dashboard only reads: it must not create the stores' folder"


def _trace(fig: dict, name: str) -> dict:
    return next(t for t in fig["data"] if t.get("name") == name)


def test_curves_group_seeds_into_a_mean_line_and_a_min_max_band(store_env):
    from tests.dashboard.conftest import CURVE_POINTS, curve_loss

    at = open_app("Curves", "training")
    assert "Curves · training" in texts(at)
    fig = figure(at)
    assert fig["layout"]["xaxis"]["title"]["text"] == "training tokens"
    # the fixed train stage is in every trial, so groups are named by the choice alone
    assert {t["name"] for t in fig["data"] if not t["name"].endswith("band")} == {"bhyt (3 seeds)", "none (3 seeds)", "dyt (1 seed)"}
    bhyt = _trace(fig, "bhyt (3 seeds)")
    points = range(1, CURVE_POINTS + 1)
    assert bhyt["x"] == [1024 * i for i in points]
    assert bhyt["y"] == pytest.approx([sum(curve_loss("bhyt", s, i) for s in range(3)) / 3 for i in points])
    high, low = [t for t in fig["data"] if t["name"] == "bhyt band"]
    assert high["y"] == pytest.approx([curve_loss("bhyt", 2, i) for i in points])  # the worst seed
    assert low["y"] == pytest.approx([curve_loss("bhyt", 0, i) for i in points]) and low["fill"] == "tonexty"
    # dyt logged its curve only as metric history (step = tokens): it is still drawn against tokens
    assert _trace(fig, "dyt (1 seed)")["y"] == pytest.approx([curve_loss("dyt", 0, i) for i in points])
    table = frame_of(at).set_index("group")
    assert table.loc["bhyt", "seeds"] == "0, 1, 2" and table.loc["bhyt", "trials"] == "0, 1, 2"
    assert table.loc["none", "final val_loss (mean)"] == pytest.approx(curve_loss("none", 1, CURVE_POINTS))
    assert table.loc["none", "max"] == pytest.approx(curve_loss("none", 2, CURVE_POINTS))


def test_curves_against_flops_per_seed_with_train_loss_and_stderr_band(store_env):
    from tests.dashboard.conftest import curve_flops, curve_loss

    at = open_app("Curves", "training")
    at.radio(key="cx").set_value("flops").run()
    fig = figure(at)
    assert fig["layout"]["xaxis"]["title"]["text"] == "training FLOPs"
    assert _trace(fig, "bhyt (3 seeds)")["x"] == pytest.approx([curve_flops("bhyt", i) for i in range(1, 5)])
    assert not any(t["name"].startswith("dyt") for t in fig["data"]), "a metric-history curve has no FLOPs"
    assert "1 trial(s) have their curve only as metric history (tokens, no FLOPs)" in texts(at)
    assert frame_of(at).set_index("group").loc["bhyt", "flops at end (mean)"] == pytest.approx(curve_flops("bhyt", 4))

    at.radio(key="cband").set_value("± stderr").run()
    high = [t for t in figure(at)["data"] if t["name"] == "none band"][0]
    # seeds differ by 0.1 each: sd 0.1, stderr 0.1 / sqrt(3) above the mean
    assert high["y"][0] == pytest.approx(curve_loss("none", 1, 1) + 0.1 / 3 ** 0.5)

    at.radio(key="cband").set_value("one line per seed").run()
    at.toggle(key="ctrain").set_value(True).run()
    assert not at.exception, [e.value for e in at.exception]
    names = [t["name"] for t in figure(at)["data"]]
    assert "bhyt · seed 2" in names and "none · train_loss · seed 0" in names and len(names) == 12  # 6 seeds x 2 losses
    dashed = next(t for t in figure(at)["data"] if t["name"] == "none · train_loss · seed 0")
    assert dashed["line"]["dash"] == "dash" and dashed["y"][0] == pytest.approx(curve_loss("none", 0, 1) + 0.05)


def test_a_study_without_curves_gets_one_line_not_an_error(store_env):
    at = open_app("Curves", "demo")
    assert [i.value for i in at.info] == [
        "Study 'demo' has no learning curves: none of its trials logged a `learning_curve.json` artifact or "
        "`curve.val_loss` history (only pipelines with a `train` stage do)."
    ]
    assert not at.get("plotly_chart")
