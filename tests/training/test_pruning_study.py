"""search.pruner end to end on a real Ray head: a diverging learning rate is stopped early, recorded once as
PRUNED in Optuna and MLflow with its curve, and the one worker goes on to the next trial."""

from __future__ import annotations

import optuna
import pytest
import yaml

from tests.conftest import run_cli
from tests.study.test_study import mlflow_trial_runs, optuna_trials

pytestmark = [pytest.mark.ray]

STEPS, EVAL_EVERY = 48, 4  # 48 optimizer steps of 8 x 64 tokens: a few seconds per trial for tiny-llama
GOOD, BAD = 3.0e-3, 10.0  # AdamW at lr 10 wrecks the model at its first steps; a higher good lr learns faster here


def _pipeline(tmp_path, train_text, pruner):
    spec = {
        "name": "pruned",
        "model": "tiny-llama",
        "task": {"name": "perplexity", "corpus": "pydoc", "max_tokens": 256, "context": 64, "stride": 64},
        # the grid runs its points in order: two trials for the median, the bad one, then one better than both
        "stages": [{"method": "train", "params": {"tokens": STEPS * 8 * 64, "seq_len": 64, "batch": 8, "eval_every": EVAL_EVERY,
                                                  "eval_tokens": 1024, "corpus": train_text, "lr": [GOOD / 3, GOOD * 2 / 3, BAD, GOOD * 4 / 3]}}],
        "objectives": [{"metric": "val_loss"}, {"metric": "train_flops"}],
        "search": {"sampler": "grid", "trials": 4, "seed": 0, "trial_timeout_s": 300, "pruner": pruner},
        "resources": {"cpus": 1, "workers": 1},
        "measures": ["params"],
    }
    path = tmp_path / "pruned.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def test_a_diverging_trial_is_pruned_early_recorded_once_and_its_worker_runs_the_next(tmp_path, ray_head, train_text):
    pipeline = _pipeline(tmp_path, train_text, {"name": "median", "n_startup_trials": 2, "n_warmup_steps": EVAL_EVERY})
    out = run_cli("run", str(pipeline), "--address", ray_head, "--no-progress", cwd=tmp_path).stdout
    assert "1 pruned" in out

    trials = sorted(optuna_trials(tmp_path, "pruned"), key=lambda t: t.number)
    states = {t.params["train.lr"]: t.state for t in trials}
    assert states[BAD] == optuna.trial.TrialState.PRUNED
    assert all(state == optuna.trial.TrialState.COMPLETE for lr, state in states.items() if lr != BAD)
    bad = next(t for t in trials if t.params["train.lr"] == BAD)
    stopped = bad.user_attrs["pruned_at_step"]
    assert EVAL_EVERY <= stopped < STEPS // 2  # at an evaluation point after the warm-up, well before the end
    assert sorted(bad.intermediate_values) == list(range(EVAL_EVERY, stopped + 1, EVAL_EVERY))  # its curve, in Optuna
    assert bad.values is None  # a pruned trial has no objective values: it can sit on no frontier
    good = next(t for t in trials if t.state == optuna.trial.TrialState.COMPLETE)
    assert len(good.intermediate_values) >= STEPS // EVAL_EVERY - 1  # a finished trial keeps its reports too

    runs = mlflow_trial_runs(tmp_path, "pruned")
    assert sorted(int(r.data.tags["paretolab.trial_number"]) for r in runs) == [t.number for t in trials]  # each trial once
    by_number = {int(r.data.tags["paretolab.trial_number"]): r for r in runs}
    pruned_run = by_number[bad.number]
    assert pruned_run.info.status == "KILLED" and pruned_run.data.tags["paretolab.trial_state"] == "PRUNED"
    assert pruned_run.data.metrics["train_steps"] == stopped  # it stopped there: the rest of its budget was never spent
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / '.paretolab' / 'mlflow.db'}")
    curve = client.get_metric_history(pruned_run.info.run_id, "curve.val_loss")
    assert len(curve) == stopped // EVAL_EVERY  # its curve, in MLflow
    workers = {r.data.tags["paretolab.study.worker"] for r in runs}
    assert len(workers) == 1  # the worker that ran the pruned trial was not replaced: it ran the trial after it
    assert max(t.number for t in trials) > bad.number and by_number[bad.number + 1].info.status == "FINISHED"
