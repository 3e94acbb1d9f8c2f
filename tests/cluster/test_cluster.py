"""A real Ray cluster on loopback: a head with two logical GPUs plus a worker node, PostgreSQL for
Optuna, an MLflow server on PostgreSQL; studies submitted through the CLI as Ray jobs, and faults
(a worker killed, a driver killed, a job stopped, a node leaving) that the study must survive.

All services are started here (one of each for the module) and stopped by their process ids.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import urllib.request
from collections import Counter
from pathlib import Path

import optuna
import psutil
import pytest

from paretolab.cluster.localcluster import MlflowServer, Postgres, RayCluster
from tests.conftest import BIN, run_cli, wait_for
from tests.study.test_study import write_pipeline

pytestmark = [pytest.mark.ray, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
SLEEPY = [{"method": "sleep", "params": {"seconds": {"low": 4.0, "high": 5.0}}}]


@pytest.fixture(scope="module")
def services(testplugin_path):
    """PostgreSQL, an MLflow server on it, and a two-node Ray cluster whose nodes know the stores."""
    pg = Postgres().start()
    mlflow_server = MlflowServer(pg.url("mlflow")).launch()  # slow to import: start the cluster meanwhile
    cluster = RayCluster(head_cpus=2, head_gpus=2, env_extra={
        "PARETOLAB_OPTUNA_STORAGE": pg.url("optuna"),  # the nodes' own store settings, as in deploy/
        "PARETOLAB_TRACKING_URI": mlflow_server.url,
        "PYTHONPATH": str(testplugin_path),  # the third-party test plugin (sleep, ...) on every node
        "RAY_JOB_STOP_WAIT_TIME_S": "30",  # time for a stopped driver to record its trials
    })
    try:
        cluster.start()
        cluster.add_node("worker", cpus=2)
        mlflow_server.wait()
        yield pg, mlflow_server, cluster
    finally:
        cluster.stop()
        mlflow_server.stop()
        pg.stop()


def cli(cluster: RayCluster, *args: str, cwd: Path, check: bool = True) -> subprocess.CompletedProcess:
    return run_cli(*args, cwd=cwd, env=cluster.env, check=check)


def submit(cluster: RayCluster, pipeline: Path, *extra: str, cwd: Path) -> str:
    return cli(cluster, "submit", str(pipeline), "--address", cluster.jobs_url, *extra, cwd=cwd).stdout.strip().splitlines()[-1]


def job_status(cluster: RayCluster, job_id: str, cwd: Path) -> str:
    return json.loads(cli(cluster, "jobs", "status", job_id, "--address", cluster.jobs_url, "--json", cwd=cwd).stdout)["status"]


def wait_job(cluster: RayCluster, job_id: str, cwd: Path, timeout: float = 300) -> str:
    def ended():
        status = _job_status_fast(cluster, job_id)
        return status if status in ("SUCCEEDED", "FAILED", "STOPPED") else None

    return wait_for(ended, timeout=timeout, interval=2)


def _job_status_fast(cluster: RayCluster, job_id: str) -> str:
    """Poll the job API directly (the CLI's start-up is too slow to poll with)."""
    return _api(cluster, f"/api/jobs/{job_id}")["status"]


def job_logs(cluster: RayCluster, job_id: str) -> str:
    """A job's logs from the job API (`paretolab jobs logs` itself is run once, in the smoke test)."""
    return _api(cluster, f"/api/jobs/{job_id}/logs")["logs"]


def _api(cluster: RayCluster, path: str):
    request = urllib.request.Request(cluster.jobs_url + path, headers={"Authorization": f"Bearer {cluster.token}"})
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read())


_STORAGES: dict[str, optuna.storages.RDBStorage] = {}


def trials(pg: Postgres, study: str) -> list[optuna.trial.FrozenTrial]:
    url = pg.url("optuna")
    if url not in _STORAGES:  # one engine (and connection pool) for all the polling
        _STORAGES[url] = optuna.storages.RDBStorage(url)
    return optuna.load_study(study_name=study, storage=_STORAGES[url]).get_trials(deepcopy=False)


def trial_runs(server: MlflowServer, study: str) -> list:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=server.url)
    exp = client.get_experiment_by_name(study)
    return list(client.search_runs([exp.experiment_id], "tags.`paretolab.role` = 'trial'", max_results=1000))


def counts(pg: Postgres, server: MlflowServer, study: str, planned: int, retried: int) -> dict[str, int]:
    """Planned, completed, failed, retried and lost trials, checked against both stores."""
    states = Counter(t.state for t in trials(pg, study))
    runs = trial_runs(server, study)
    numbers = Counter(int(r.data.tags["paretolab.trial_number"]) for r in runs)
    assert set(numbers.values()) == {1}, f"a trial logged twice: {numbers}"  # no duplicates
    assert all(r.info.status in ("FINISHED", "FAILED") for r in runs)  # no half-written runs
    done = states[optuna.trial.TrialState.COMPLETE] + states[optuna.trial.TrialState.FAIL]
    out = {"planned": planned, "completed": states[optuna.trial.TrialState.COMPLETE],
           "failed": states[optuna.trial.TrialState.FAIL], "retried": retried, "lost": planned - min(done, len(numbers))}
    print(f"\n{study}: " + ", ".join(f"{k}={v}" for k, v in out.items()))
    return out


def running_trials(pg: Postgres, study: str) -> int:
    try:
        return sum(t.state == optuna.trial.TrialState.RUNNING for t in trials(pg, study))
    except KeyError:  # the driver has not created the study yet
        return 0


def our_processes(cluster: RayCluster, title: str) -> list[psutil.Process]:
    """Processes of this cluster (they carry its token in their environment) whose title starts with ``title``."""
    found = []
    for proc in psutil.process_iter(["pid", "cmdline"]):
        try:
            if " ".join(proc.info["cmdline"] or ()).startswith(title) and proc.environ().get("RAY_AUTH_TOKEN") == cluster.token:
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass
    return found


def test_submit_without_a_token_says_what_to_do(services, tmp_path):
    _, _, cluster = services
    env = {k: v for k, v in cluster.env.items() if k not in ("RAY_AUTH_TOKEN", "RAY_AUTH_MODE")}
    env["HOME"] = str(tmp_path)  # no ~/.ray/auth_token either
    proc = subprocess.run([str(BIN / "paretolab"), "submit", str(ROOT / "pipelines" / "smoke.yaml"), "--address", cluster.jobs_url],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2
    assert "requires its authentication token, and no token was found on this machine" in proc.stderr
    assert "ray get-auth-token" in proc.stderr and "export RAY_AUTH_TOKEN=" in proc.stderr and "~/.ray/auth_token" in proc.stderr


def test_submitted_smoke_study_runs_on_both_nodes_into_postgres_and_the_mlflow_server(services, tmp_path):
    pg, server, cluster = services
    job_id = submit(cluster, ROOT / "pipelines" / "smoke.yaml", "--trials", "8", cwd=tmp_path)
    assert job_id.startswith("paretolab-smoke-")
    assert wait_job(cluster, job_id, tmp_path) == "SUCCEEDED", cli(cluster, "jobs", "logs", job_id, "--address", cluster.jobs_url, cwd=tmp_path).stdout
    listed = cli(cluster, "jobs", "list", "--address", cluster.jobs_url, cwd=tmp_path).stdout
    assert job_id in listed and "SUCCEEDED" in listed
    logs = cli(cluster, "jobs", "logs", job_id, "--address", cluster.jobs_url, cwd=tmp_path).stdout
    assert "starting 4 worker(s)" in logs and "8 trial(s) completed, 0 failed" in logs

    assert all(t.state == optuna.trial.TrialState.COMPLETE for t in trials(pg, "smoke")) and len(trials(pg, "smoke")) == 8
    runs = trial_runs(server, "smoke")
    assert counts(pg, server, "smoke", planned=8, retried=0)["lost"] == 0
    assert len({r.data.params["info.ray_node"] for r in runs}) == 2  # trials ran on both nodes
    assert len({r.data.tags["paretolab.study.worker"] for r in runs}) == 4  # four concurrent workers

    # the database password is never printed, logged, or stored in MLflow
    from mlflow.tracking import MlflowClient

    parent = MlflowClient(tracking_uri=server.url).search_runs([runs[0].info.experiment_id], "tags.`paretolab.role` = 'study'")[0]
    stored = json.dumps([[r.data.params, r.data.tags] for r in [*runs, parent]])
    job_info = json.dumps(_api(cluster, f"/api/jobs/{job_id}"))
    assert "***@127.0.0.1" in logs  # the driver names its stores, redacted
    for text in (logs, listed, stored, job_info):
        assert pg.password not in text
    ray_logs = Path(cluster.temp_dir) / "session_latest" / "logs"
    leaked = [p.name for p in ray_logs.rglob("*") if p.is_file() and pg.password in p.read_text(errors="ignore")]
    assert not leaked


def test_a_password_in_a_submitted_store_url_is_refused_before_it_reaches_ray(services, tmp_path):
    pg, _, cluster = services
    proc = cli(cluster, "submit", str(ROOT / "pipelines" / "smoke.yaml"), "--address", cluster.jobs_url, "--storage", pg.url("optuna"),
               cwd=tmp_path, check=False)
    assert proc.returncode == 2 and "--storage" in proc.stderr and "PARETOLAB_OPTUNA_STORAGE on the cluster" in proc.stderr
    assert pg.password not in proc.stdout + proc.stderr and "paretolab:***@" in proc.stderr


def test_one_gpu_trials_run_two_at_a_time_on_the_gpu_node_only(services, tmp_path):
    pg, server, cluster = services
    pipeline = write_pipeline(tmp_path, name="gpu", resources={"cpus": 1, "gpus": 1}, search={"sampler": "random", "trials": 4, "seed": 0})
    job_id = submit(cluster, pipeline, cwd=tmp_path)
    assert wait_job(cluster, job_id, tmp_path) == "SUCCEEDED"
    assert "starting 2 worker(s)" in job_logs(cluster, job_id)
    gpu_nodes = {n["node_id"] for n in _api(cluster, "/api/v0/nodes?detail=1")["data"]["result"]["result"] if n["resources_total"].get("GPU")}
    runs = trial_runs(server, "gpu")
    assert len(runs) == 4
    assert {r.data.params["info.ray_node"] for r in runs} <= gpu_nodes  # never on the node without a GPU
    assert {r.data.params["info.gpu_ids"] for r in runs} == {"0", "1"}  # each worker holds one of the two GPUs
    assert len({r.data.tags["paretolab.study.worker"] for r in runs}) == 2  # so at most two trials at once


def test_a_stopped_job_leaves_every_trial_in_a_terminal_state(services, tmp_path):
    pg, server, cluster = services
    pipeline = write_pipeline(tmp_path, name="stopme", stages=[{"method": "sleep", "params": {"seconds": {"low": 55.0, "high": 65.0}}}],
                              search={"sampler": "random", "trials": 6, "seed": 0, "trial_timeout_s": 300})
    job_id = submit(cluster, pipeline, cwd=tmp_path)
    wait_for(lambda: running_trials(pg, "stopme") >= 2, timeout=240, interval=1)
    out = cli(cluster, "jobs", "stop", job_id, "--address", cluster.jobs_url, cwd=tmp_path).stdout
    assert f"{job_id}  STOPPED" in out
    got = trials(pg, "stopme")
    assert got and all(t.state == optuna.trial.TrialState.FAIL for t in got)
    assert all(t.user_attrs["fail_reason"].startswith("stopped: the driver got SIGTERM") for t in got)
    assert {r.info.status for r in trial_runs(server, "stopme")} == {"FAILED"} and len(trial_runs(server, "stopme")) == len(got)


def test_a_live_study_refuses_a_second_driver_and_a_killed_one_is_finished_by_resubmitting(services, tmp_path):
    pg, server, cluster = services
    gate = tmp_path / "gate"  # the trials wait for this file: the first driver lives until the test opens it
    stages = [{"method": "sleep", "params": {"seconds": {"low": 4.0, "high": 5.0}, "gate": str(gate)}}]
    pipeline = write_pipeline(tmp_path, name="driverkill", stages=stages, search={"sampler": "random", "trials": 6, "seed": 1})
    first = submit(cluster, pipeline, cwd=tmp_path)
    wait_for(lambda: running_trials(pg, "driverkill") >= 1, timeout=300, interval=0.5)

    second = submit(cluster, pipeline, cwd=tmp_path)  # its driver runs `paretolab run --resume` while the first lives
    ended = wait_job(cluster, second, tmp_path)
    logs = job_logs(cluster, second)
    assert ended == "FAILED", logs
    assert "study 'driverkill' is being run by another driver (host " in logs
    gate.touch()

    def progressed():
        if not running_trials(pg, "driverkill"):
            return False
        return sum(t.state == optuna.trial.TrialState.COMPLETE for t in trials(pg, "driverkill")) >= 2

    wait_for(progressed, timeout=300, interval=0.5)
    drivers = wait_for(lambda: our_processes(cluster, "python -m paretolab.cli run pipeline.yaml"), timeout=30)
    for proc in drivers:
        proc.kill()  # kill -9 the study's driver
    assert wait_job(cluster, first, tmp_path) == "FAILED"
    left = Counter(t.state for t in trials(pg, "driverkill"))
    assert left[optuna.trial.TrialState.RUNNING] >= 1

    third = submit(cluster, pipeline, cwd=tmp_path)
    assert wait_job(cluster, third, tmp_path) == "SUCCEEDED"
    logs = job_logs(cluster, third)
    assert "resuming" in logs or "recovered from its MLflow run" in logs
    assert counts(pg, server, "driverkill", planned=6, retried=0) == {"planned": 6, "completed": 6, "failed": 0, "retried": 0, "lost": 0}


def test_a_worker_killed_mid_trial_then_a_worker_node_leaving_are_survived(services, tmp_path):
    pg, server, cluster = services
    pipeline = write_pipeline(tmp_path, name="faults", stages=SLEEPY, search={"sampler": "random", "trials": 16, "seed": 2})
    driver = subprocess.Popen([str(BIN / "paretolab"), "run", str(pipeline), "--address", cluster.address, "--no-progress"], cwd=tmp_path,
                              env=cluster.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    victim = wait_for(lambda: our_processes(cluster, "ray::TrialWorker.run"), timeout=240, interval=0.5)[0]
    victim.kill()  # kill -9 one trial worker, mid-trial
    # once the victim's trial has completed on its second attempt (a third would fail it: "died twice") and more
    # trials run than the head's 2 CPUs hold (so at least one on the worker node), the node dies
    def retried_and_spread() -> bool:
        got = trials(pg, "faults")
        done_again = any(t.user_attrs.get("attempts", 1) >= 2 and t.state == optuna.trial.TrialState.COMPLETE for t in got)
        return done_again and sum(t.state == optuna.trial.TrialState.RUNNING for t in got) >= 3

    wait_for(retried_and_spread, timeout=240, interval=0.5)
    cluster.kill_node("worker")  # its raylet and agents die, and the trial workers on it (the module's last test)
    out, _ = driver.communicate(timeout=300)
    assert driver.returncode == 0, out
    retried = out.count("retrying once")
    assert retried >= 2, [l for l in out.splitlines() if "died" in l]  # the killed worker's trial, and each trial on the node
    assert counts(pg, server, "faults", planned=16, retried=retried) == {"planned": 16, "completed": 16, "failed": 0, "retried": retried, "lost": 0}
    assert f"16 trial(s) completed, 0 failed, {retried} retried" in out
