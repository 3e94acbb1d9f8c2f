"""A training study end to end through the CLI on a real Ray head: killed mid-training, resumed, curves in MLflow."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections import Counter

import optuna
import pytest
import yaml

from tests.conftest import BIN, run_cli, wait_for
from tests.study.test_study import mlflow_trial_runs, optuna_trials

pytestmark = [pytest.mark.ray, pytest.mark.slow]


# 1,024 steps: ~12 s of training per trial on this CPU after the token cache appears. At 128 steps (2 s) the
# driver's kill sometimes landed after a trial had saved its model, and the "killed mid-training" premise failed.
TOKENS, EVAL_EVERY, STEP_TOKENS = 524288, 256, 64 * 8


def test_a_training_study_killed_mid_training_resumes_and_logs_each_trials_curve_once(tmp_path, ray_head, train_text):
    cache = tmp_path / "cache"
    spec = {
        "name": "trainstudy",
        "model": "tiny-llama",
        "task": {"name": "perplexity", "corpus": "pydoc", "max_tokens": 256, "context": 64, "stride": 64},
        "stages": [{"method": "train", "params": {"tokens": TOKENS, "seq_len": 64, "batch": 8, "eval_every": EVAL_EVERY, "eval_tokens": 1024,
                                                  "corpus": train_text, "seed": [0, 1], "save_as": "resumed-{seed}"}}],
        "objectives": [{"metric": "val_loss"}, {"metric": "train_flops"}],
        "search": {"sampler": "grid", "trials": 2, "seed": 0, "trial_timeout_s": 300},
        "resources": {"cpus": 1},
        "measures": ["params"],
    }
    pipeline = tmp_path / "trainstudy.yaml"
    pipeline.write_text(yaml.safe_dump(spec))
    env = {**os.environ, "PARETOLAB_CACHE": str(cache)}
    driver = subprocess.Popen([str(BIN / "paretolab"), "run", str(pipeline), "--address", ray_head, "--no-progress"],
                              cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    try:  # the token cache is written just before the first step: from then on a trial is training
        wait_for(lambda: driver.poll() is not None or ((cache / "tokens").is_dir() and any((cache / "tokens").glob("*.pt"))), timeout=300)
        assert driver.poll() is None, driver.stderr.read().decode()[-3000:]
        time.sleep(1)
    finally:
        os.killpg(driver.pid, signal.SIGKILL)
        driver.wait()
    trained = cache / "models" / "trained"
    assert not trained.is_dir() or not any(p.name.startswith("resumed-") for p in trained.iterdir())
    assert Counter(t.state for t in optuna_trials(tmp_path, "trainstudy"))[optuna.trial.TrialState.COMPLETE] == 0

    run_cli("run", str(pipeline), "--address", ray_head, "--resume", "--no-progress", cwd=tmp_path, env={"PARETOLAB_CACHE": str(cache)})

    trials = optuna_trials(tmp_path, "trainstudy")
    assert len(trials) == 2 and all(t.state == optuna.trial.TrialState.COMPLETE for t in trials)
    runs = mlflow_trial_runs(tmp_path, "trainstudy")
    assert sorted(int(r.data.tags["paretolab.trial_number"]) for r in runs) == sorted(t.number for t in trials)  # each once
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / '.paretolab' / 'mlflow.db'}")
    for run in runs:
        assert run.info.status == "FINISHED" and run.data.metrics["train_tokens"] == TOKENS
        curve = json.loads(open(client.download_artifacts(run.info.run_id, "learning_curve.json", str(tmp_path))).read())
        assert [r["tokens"] for r in curve["rows"]] == [k * EVAL_EVERY * STEP_TOKENS for k in (1, 2, 3, 4)]
        history = client.get_metric_history(run.info.run_id, "curve.val_loss")
        assert [(m.step, m.value) for m in history] == [(r["tokens"], r["val_loss"]) for r in curve["rows"]]
        assert run.data.metrics["val_loss"] == curve["rows"][-1]["val_loss"]
    saved = sorted(p.name for p in trained.iterdir() if not p.name.startswith("."))  # .partial: staging, never a model
    assert saved == ["resumed-0", "resumed-1"]  # complete checkpoints only: no half-written leftovers
    assert all((trained / name / "paretolab.json").is_file() for name in saved)
