"""Ctrl-C on a real `paretolab run` with its own local Ray: drain, cancel, resume, and what the stores keep."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import time
from collections import Counter
from pathlib import Path

import optuna
import pytest

from tests.conftest import BIN, cli_here, run_cli, wait_for
from tests.study.test_study import mlflow_trial_runs, optuna_trials, write_pipeline

pytestmark = [pytest.mark.ray, pytest.mark.slow]

EXIT_BOUND_S = 60  # after the last Ctrl-C: the running trial (at most 4 s) plus Ray's shutdown


def start_driver(folder: Path, pipeline: Path) -> subprocess.Popen:
    """`paretolab run` with a private local Ray (no --address), in its own process group as a terminal would run it."""
    env = {**os.environ, "RAY_AUTH_MODE": "disabled"}
    return subprocess.Popen([str(BIN / "paretolab"), "run", str(pipeline), "--no-progress"], cwd=folder, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)


def running(folder: Path) -> bool:
    """A trial is running (read-only polling: never race the driver creating the schema)."""
    db = folder / ".paretolab" / "optuna.db"
    if not db.exists():
        return False
    try:
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
            return bool(conn.execute("SELECT count(*) FROM trials WHERE state = 'RUNNING'").fetchone()[0])
    except sqlite3.Error:
        return False


def ctrl_c(driver: subprocess.Popen, times: int) -> tuple[int, str, str, float]:
    """Ctrl-C as a terminal sends it (SIGINT to the whole foreground group: the driver and Ray's processes); (rc, out, err, s to exit)."""
    for i in range(times):
        if i:
            time.sleep(1.0)
        os.killpg(driver.pid, signal.SIGINT)
    start = time.monotonic()
    try:
        out, err = driver.communicate(timeout=EXIT_BOUND_S)
    except subprocess.TimeoutExpired:
        os.killpg(driver.pid, signal.SIGKILL)
        out, err = driver.communicate()
        raise AssertionError(f"the driver was still running {EXIT_BOUND_S} s after Ctrl-C x{times}\n{out}\n{err}") from None
    return driver.returncode, out, err, time.monotonic() - start


def test_ctrl_c_lets_the_running_trial_finish_and_resume_records_each_trial_once(tmp_path, with_testplugin, ray_head):
    pipeline = write_pipeline(tmp_path, name="ctrlc", stages=[{"method": "sleep", "params": {"seconds": {"low": 3.0, "high": 4.0}}}],
                              task={"name": "perplexity", "corpus": "pydoc", "max_tokens": 256, "context": 128, "stride": 128},
                              search={"sampler": "random", "trials": 3, "seed": 0, "trial_timeout_s": 120}, resources={"cpus": 1, "workers": 1})
    driver = start_driver(tmp_path, pipeline)
    wait_for(lambda: running(tmp_path) or driver.poll() is not None, timeout=300)
    rc, out, err, took = ctrl_c(driver, 1)
    assert rc == 130, out + err
    assert "no new trials; waiting for the 1 running trial(s) to finish (Ctrl-C again cancels them)" in out
    assert f"continue it with: paretolab run {pipeline} --resume" in err
    print(f"first Ctrl-C: exited {took:.1f} s after the signal")
    first = optuna_trials(tmp_path, "ctrlc")
    assert [t.state for t in first] == [optuna.trial.TrialState.COMPLETE]  # finished, not cancelled, and nothing new started
    status = run_cli("studies", cwd=tmp_path).stdout  # the command itself once; the rest in this process
    assert "interrupted (SIGINT)" in status and f"resume with `paretolab run {pipeline} --resume`" in status

    run_cli("run", str(pipeline), "--resume", "--address", ray_head, "--no-progress", cwd=tmp_path)  # the shared head: no second Ray start-up
    trials = optuna_trials(tmp_path, "ctrlc")
    assert [t.number for t in trials] == [0, 1, 2] and all(t.state == optuna.trial.TrialState.COMPLETE for t in trials)
    numbers = Counter(int(r.data.tags["paretolab.trial_number"]) for r in mlflow_trial_runs(tmp_path, "ctrlc"))
    assert numbers == {0: 1, 1: 1, 2: 1}
    assert "ctrlc  finished" in cli_here("studies", cwd=tmp_path).stdout


def test_a_second_ctrl_c_cancels_the_running_trial_into_both_stores_and_prune_removes_the_study(tmp_path, with_testplugin):
    pipeline = write_pipeline(tmp_path, name="cancel", stages=[{"method": "sleep", "params": {"seconds": {"low": 50.0, "high": 60.0}}}],
                              task={"name": "perplexity", "corpus": "pydoc", "max_tokens": 256, "context": 128, "stride": 128},
                              search={"sampler": "random", "trials": 2, "seed": 0, "trial_timeout_s": 300}, resources={"cpus": 1, "workers": 1})
    driver = start_driver(tmp_path, pipeline)
    wait_for(lambda: running(tmp_path) or driver.poll() is not None, timeout=300)
    rc, out, err, took = ctrl_c(driver, 2)
    assert rc == 130 and took < 40, (took, out, err)  # a 50 s trial did not hold it
    print(f"second Ctrl-C: exited {took:.1f} s after the signals")
    reason = "interrupted: Ctrl-C (SIGINT) in the terminal running `paretolab run`"
    [trial] = optuna_trials(tmp_path, "cancel")
    assert trial.state == optuna.trial.TrialState.FAIL and trial.user_attrs["fail_reason"] == reason
    [run] = mlflow_trial_runs(tmp_path, "cancel")
    assert run.info.status == "FAILED" and run.data.tags["paretolab.failure"] == reason

    listed = cli_here("studies", cwd=tmp_path).stdout
    assert "interrupted (SIGINT)" in listed and "0 of 2 planned trial(s) complete" in listed
    refused = cli_here("studies", "--prune", cwd=tmp_path, check=False)  # no terminal to ask on, no --yes
    assert refused.returncode == 2 and "--yes" in refused.stderr
    pruned = cli_here("studies", "--prune", "--yes", cwd=tmp_path).stdout
    assert "removed study 'cancel': Optuna study with 1 trial(s); MLflow experiment with 2 run(s)" in pruned
    assert "no studies yet" in cli_here("studies", cwd=tmp_path).stdout
