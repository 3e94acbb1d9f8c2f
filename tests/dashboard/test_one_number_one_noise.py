"""One formatter and one "within noise" on every surface: the CLI's `frontier` table, the report's Markdown table and the
dashboard's tables write a value the same way, and the dashboard's frontier names the same neighbours within noise as
`paretolab frontier` does (paired on per-example scores where the trials have them)."""

from __future__ import annotations

import math

import optuna
import pytest
from optuna.trial import create_trial

from paretolab.dashboard import data
from paretolab.dashboard.plots import frontier_points
from paretolab.dashboard.tables import compare_table, frontier_table, key_values
from paretolab.plugin_api.numbers import axis_scale, axis_title, interval_text, metric_value, number, param_value, plain_text, tick_labels
from paretolab.results.read import frontier_rows, print_frontier
from paretolab.results.section import markdown_table
from paretolab.stats import ARTIFACT, per_example_json
from paretolab.stores import resolve_stores

from .conftest import PIPELINE, _mlflow_params, _params


@pytest.mark.parametrize("value, unit, text", [
    (538060032.0, "bytes", "538.1 MB"),        # the demo's unmodified size (was 538060032.0 on Compare, 5.3806e+08 on the plot)
    (4525265.071, "bytes", "4.525 MB"),        # was 4525265.071 in the Frontier table
    (318316.0, "parameters", "318316"),        # a whole number below a million, exactly
    (4525265.071, "", "4.525M"),               # was 4.525e+06 beside 318,316 in `report`
    (1.73106e8, "", "173.1M"),                 # was 1.73106e+08 on the Trial page
    (14.21625090642673, "", "14.22"),          # was 14.21625090642673 on Compare
    (0.5675410179622814, "", "0.5675"),        # was sparsity=0.5675410179622814 in `report`
    (8.0, "", "8"),
    (12345.67, "", "12346"),
    (0.0000123456, "", "0.00001235"),          # never e-notation (was 1.235e-05; ×2.777e-05 as a ratio's bound in a document)
    (-5.399e-07, "", "-0.0000005399"),
    (1e-300, "", "0"),                         # below 1e-15: 0
    (1.2e15, "", "1.2P"),                      # was 1.2e+15
    (40.16, "MiB", "42.11 MB"),                # a memory metric in MiB: decimal MB, as bytes are written (was -40.16 MiB in a verdict)
    (1.02, "x", "×1.02"),                      # a ratio carries ×
    (float("inf"), "x", "×∞"),
    (float("nan"), "", ""),
    (None, "", ""),
    ("row", "", "row"),
])
def test_the_one_formatter(value, unit, text):
    assert number(value, unit) == text


def test_an_interval_with_different_bounds_never_reads_as_zero_width():
    """OMNISIFT's FLOPs ratio printed "×1.003 [×1.003, ×1.003]" beside "held": a reader takes that for the zero width that
    means "no variation observed". Bounds that differ get the digits that tell them apart; equal ones stay as they are."""
    assert interval_text(1.003, 1.00291, 1.00342) == "1.003 [1.0029, 1.0034]"
    assert interval_text(20.3, 16.37, 25.17) == "20.3 [16.37, 25.17]"
    assert interval_text(5.0, 5.0, 5.0) == "5 [5, 5]"
    assert interval_text(1.5e6, 1.50001e6, 1.50002e6, "bytes") == "1.5 MB [1.50001 MB, 1.50002 MB]"
    assert interval_text(1.426, 1.129, 1.787, "x") == "×1.426 [×1.129, ×1.787]"  # ENGINES.md's ÷ none wrote 1.426 [1.129, 1.787]


def test_e_notation_older_code_stored_and_axis_ticks_read_one_way():
    assert plain_text("largest relative change 4.9e-04; 0.1.0+1d2e635") == "largest relative change 0.00049; 0.1.0+1d2e635"
    assert tick_labels([10, 100, 1000, 1e4, 1e5, 1e6]) == ["10", "100", "1k", "10k", "100k", "1M"]  # was 100000 beside 1M
    assert tick_labels([0.1, 1, 10, 100]) == ["0.1", "1", "10", "100"]
    assert metric_value("ppl ÷ none", 1.051) == "×1.051" and metric_value("decode_speedup", 1.02) == "×1.02"
    assert axis_title("peak_act_mb", "minimize") == "peak_act_mb [MB] ↓" and axis_scale("peak_act_mb") == 1e6 / 2**20


def test_params_read_as_numbers_also_when_mlflow_kept_them_as_text():
    assert param_value("0.5675410179622814") == param_value(0.5675410179622814) == "0.5675"  # `report`'s params column
    assert [param_value(v) for v in ("128", "row", "nan", True)] == ["128", "row", "nan", "True"]
    cell = markdown_table([{"params": {"stage0.magnitude.sparsity": "0.5675410179622814", "stage0.magnitude.scope": "row"}}], ["params"])
    assert cell.splitlines()[-1] == "| magnitude.sparsity=0.5675, magnitude.scope=row |"


def test_axis_titles_say_unit_and_direction():
    assert axis_title("ppl", "minimize") == "ppl ↓"
    assert axis_title("size_bytes", "minimize") == "size [MB] ↓"
    assert axis_title("decode_tok_s", "maximize") == "decode_tok_s [tokens/s] ↑"
    assert metric_value("size_bytes", 4525265.071) == "4.525 MB", "the unit comes from the metric registry"


def test_a_value_reads_the_same_in_the_cli_the_report_and_the_dashboard(fixture_home, capsys):
    stores = resolve_stores(home=str(fixture_home))
    rows = frontier_rows("demo", stores)
    print_frontier("demo", rows)
    cli = capsys.readouterr().out
    row = next(r for r in rows if r["trial"] == 3)  # rtn 8-bit: ppl 20.2, size 110,000 bytes
    expected = {"ppl": "20.2", "size_bytes": "110 kB"}
    for metric, text in expected.items():
        assert metric_value(metric, row[metric]) == text
        assert text in cli.splitlines()[[line.split()[0] for line in cli.splitlines()].index("3")]
    report = markdown_table([{"trial": 3, **{m: row[m] for m in expected}}], ["trial", *expected])
    assert report.splitlines()[-1] == "| 3 | 20.2 | 110 kB |"

    table = data.load_trials(stores.optuna_url, "demo")
    front = table.frontier(["ppl", "size_bytes"], ["minimize", "minimize"])
    plot = frontier_points(table.complete(), front, x="ppl", y="size_bytes", directions=("minimize", "minimize"),
                           param_columns=table.param_columns)
    shown = frontier_table(plot.front, plot.shown, [c.removeprefix("param:") for c in plot.params]).set_index("number")
    assert shown.loc[3, ["ppl", "size_bytes"]].tolist() == list(expected.values())
    assert shown.loc[8, "magnitude.sparsity"] == "0.8" and shown.loc[8, "ppl"] == "400"
    side = compare_table(table.complete().set_index("number").loc[[3]], ["ppl", "size_bytes", "param:rtn.bits"], table.param_columns)
    assert side["trial 3"].tolist() == ["20.2", "110 kB", "8"]
    assert key_values({"size_bytes": row["size_bytes"]}, metrics=True)["value"].tolist() == ["110 kB"]


# ---- one "within noise" --------------------------------------------------------------------------------------------

# (stage1, bits, ppl, size_bytes); every trial logs a ±5 % ppl interval, so unpaired, trials 0 and 1 are within noise.
NOISY = [("none", None, 20.0, 400_000.0), ("rtn", 8, 20.2, 110_000.0), ("rtn", 4, 30.0, 60_000.0)]
WINDOWS = [0.9, 1.1, 1.0, 0.95, 1.05, 1.0, 0.98, 1.02]  # per-window NLL around 0 (spread), shifted per trial below


def _noisy_study(home, name: str, per_example: bool):
    from paretolab.records import TrialResult
    from paretolab.stores.tracking import Tracker

    stores = resolve_stores(home=str(home))
    study = optuna.create_study(study_name=name, storage=stores.optuna_url, directions=["minimize", "minimize"])
    study.set_user_attr("objectives", [["ppl", "minimize"], ["size_bytes", "minimize"]])
    study.set_user_attr("model", "tiny-llama")
    study.set_user_attr("pipeline", {**PIPELINE, "name": name})
    tracker = Tracker(stores, name)
    parent = tracker.study_run({}, {"pipeline": PIPELINE})
    for number, (stage1, bits, ppl, size) in enumerate(NOISY):
        params, dists = _params("none", None, stage1, bits)
        metrics = {"ppl": ppl, "size_bytes": size, "ppl_ci_low": 0.95 * ppl, "ppl_ci_high": 1.05 * ppl, "n_windows": 8.0}
        # the same windows for every trial, each trial's NLL shifted by log(ppl): paired, 20.0 vs 20.2 is a clear difference
        nll = [w - 1.0 + math.log(ppl) for w in WINDOWS]
        artifacts = {ARTIFACT: per_example_json("window", {"nll": nll}).encode()} if per_example else {}
        run_id = tracker.log_trial(parent, number, _mlflow_params("none", None, stage1, bits), TrialResult(metrics=metrics, artifacts=artifacts), {})
        study.add_trial(create_trial(params=params, distributions=dists, values=[ppl, size], user_attrs={"mlflow_run_id": run_id}))
    return stores


def _dashboard_noise(stores, name: str) -> dict[int, str]:
    data.clear_cache()
    table = data.load_trials(stores.optuna_url, name)
    front = table.frontier(["ppl", "size_bytes"], ["minimize", "minimize"])
    plot = frontier_points(table.complete(), front, x="ppl", y="size_bytes", directions=("minimize", "minimize"),
                           param_columns=table.param_columns, source=stores)
    return dict(zip(plot.front["number"].astype(int), plot.front["noise"]))


def _cli_noise(stores, name: str) -> dict[int, str]:
    return {r["trial"]: r.get("noise", "") for r in frontier_rows(name, stores) if r.get("feasible", True)}


@pytest.mark.parametrize("per_example, tied", [
    (False, {0: "ppl ≈ trial 1", 1: "ppl ≈ trial 0", 2: ""}),  # logged intervals only: unpaired, 20.0 and 20.2 overlap
    (True, {0: "", 1: "", 2: ""}),                             # the same windows scored: paired, +0.2 on every window
])
def test_dashboard_and_frontier_agree_on_within_noise(tmp_path, per_example, tied):
    stores = _noisy_study(tmp_path, "noisy", per_example)
    dashboard, cli = _dashboard_noise(stores, "noisy"), _cli_noise(stores, "noisy")
    assert cli == tied
    assert dashboard == cli, "the dashboard says what `paretolab frontier` says"
