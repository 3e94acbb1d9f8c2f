"""constraints: and search.enqueue end to end on a real Ray head: the reference arm runs first, every trial
carries its verdict in both stores, the samplers see it, and the frontier is drawn over feasible trials only."""

from __future__ import annotations

import json

import optuna
import pytest
import yaml

from paretolab.plugin_api.numbers import metric_value
from paretolab.results.frontier import pareto_indices
from tests.conftest import cli_here, run_cli
from tests.study.test_study import mlflow_trial_runs, optuna_trials

pytestmark = [pytest.mark.ray]

RATIO = 1.02  # ppl at most 2 % above the unmodified model's (random-init tiny-llama: compression rarely hurts it)
SMALLEST = 9.0e4  # bytes: no smaller model (2-bit rtn) is allowed, so the smallest trials, on the plain frontier, are infeasible


def _pipeline(tmp_path, name="bounded", trials=8, sparsity_high=0.9):
    spec = {
        "name": name,
        "model": "tiny-llama",
        "task": {"name": "perplexity", "corpus": "pydoc", "max_tokens": 1024},
        "stages": [
            {"id": "prune", "choice": [{"method": "none"}, {"method": "magnitude", "params": {"sparsity": {"low": 0.1, "high": sparsity_high}, "scope": "row"}}]},
            {"id": "quant", "choice": [{"method": "none"}, {"method": "rtn", "params": {"bits": [2, 4, 8], "group_size": 32}}]},
        ],
        "objectives": [{"metric": "ppl", "direction": "minimize"}, {"metric": "size_bytes", "direction": "minimize"}],
        "constraints": [{"metric": "ppl", "max_ratio_to": "none", "max": RATIO}, {"metric": "size_bytes", "min": SMALLEST}],
        "search": {"sampler": "tpe", "trials": trials, "seed": 0, "trial_timeout_s": 300, "enqueue": ["magnitude+rtn[bits=2]"]},
        "resources": {"cpus": 1},
        "measures": ["size"],
    }
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def test_a_constrained_study_judges_every_trial_against_its_reference_and_keeps_infeasible_ones_off_the_frontier(tmp_path, ray_head):
    run_cli("run", str(_pipeline(tmp_path)), "--address", ray_head, "--no-progress", cwd=tmp_path)

    trials = sorted(optuna_trials(tmp_path, "bounded"), key=lambda t: t.number)
    assert len(trials) == 8 and all(t.state == optuna.trial.TrialState.COMPLETE for t in trials)
    reference, enqueued = trials[0], trials[1]
    assert reference.params == {"prune.method": "none", "quant.method": "none"}  # the reference arm ran first
    assert reference.user_attrs["enqueued_as"] == "the reference of constraints: none"
    assert enqueued.params["prune.method"] == "magnitude" and enqueued.params["rtn.bits"] == 2  # search.enqueue next
    assert enqueued.user_attrs["enqueued_as"] == "search.enqueue[0]"
    limit = RATIO * reference.values[0]
    for t in trials:  # each verdict is the bound applied to the trial's own ppl
        assert t.user_attrs["feasible"] == (t.values[0] <= limit and t.values[1] >= SMALLEST), (t.number, t.values, limit)
        assert t.constraints == {"0": pytest.approx(t.values[0] - limit), "1": pytest.approx(SMALLEST - t.values[1])}  # what NSGA-II and TPE read
        if t.values[1] < SMALLEST:
            assert f"size_bytes {metric_value('size_bytes', t.values[1])} breaks size_bytes >= 90 kB" in t.user_attrs["infeasible_because"]
    infeasible = {t.number for t in trials if not t.user_attrs["feasible"]}
    unconstrained = {trials[i].number for i in pareto_indices([t.values for t in trials], ["minimize", "minimize"])}
    assert infeasible & unconstrained  # the bound matters here: an infeasible trial would be on the plain frontier

    runs = {int(r.data.tags["paretolab.trial_number"]): r for r in mlflow_trial_runs(tmp_path, "bounded")}
    assert {n for n, r in runs.items() if r.data.tags["paretolab.feasible"] == "false"} == infeasible

    frontier = json.loads(cli_here("frontier", "bounded", "--json", cwd=tmp_path).stdout)
    on_front = {row["trial"] for row in frontier if row["feasible"]}
    assert on_front and not on_front & infeasible
    assert {row["trial"] for row in frontier if not row["feasible"]} == infeasible & unconstrained  # listed, marked, not drawn



    # warm start: a new study starts from these trials, copied (never re-run) with their verdicts, then runs 2 of its own
    out = run_cli("run", str(_pipeline(tmp_path, "warm", trials=2)), "--from-study", "bounded", "--address", ray_head, "--no-progress", cwd=tmp_path).stdout
    assert "copied 8 trial(s) from study 'bounded'" in out
    warm = sorted(optuna_trials(tmp_path, "warm"), key=lambda t: t.number)
    assert len(warm) == 10 and [t.user_attrs.get("copied_from") for t in warm[:8]] == [f"bounded#{t.number}" for t in trials]
    assert [t.values for t in warm[:8]] == [t.values for t in trials]
    assert [t.user_attrs["feasible"] for t in warm[:8]] == [t.user_attrs["feasible"] for t in trials]
    assert all("copied_from" not in t.user_attrs and "enqueued_as" not in t.user_attrs for t in warm[8:])  # reference and enqueued point were copied
    warm_runs = {int(r.data.tags["paretolab.trial_number"]): r for r in mlflow_trial_runs(tmp_path, "warm")}
    assert sorted(warm_runs) == list(range(10))  # each trial once in MLflow too
    assert [warm_runs[n].data.tags.get("paretolab.copied_from") for n in range(8)] == [f"bounded#{t.number}" for t in trials]
    assert warm_runs[1].data.metrics["ppl"] == runs[1].data.metrics["ppl"]

    other = run_cli("run", str(_pipeline(tmp_path, "elsewhere", sparsity_high=0.5)), "--from-study", "bounded", cwd=tmp_path, check=False)
    assert other.returncode != 0 and "magnitude.sparsity" in other.stderr and "same search space" in other.stderr
