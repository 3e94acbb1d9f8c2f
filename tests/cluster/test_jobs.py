"""Cluster plumbing that needs no cluster: what fits on which node, what travels to Ray, store settings."""

from __future__ import annotations

import pytest

from paretolab.cluster.jobs import jobs_address, stage_package, submit
from paretolab.cluster.ray_init import forwarded
from paretolab.errors import ConfigError
from paretolab.stores import redact, resolve_stores
from paretolab.study.pool import node_slots
from paretolab.study.spec import Resources, load_spec

ROOT = __import__("pathlib").Path(__file__).resolve().parents[2]


def node(cpus: float, gpus: float = 0.0, memory_gb: float = 64.0, alive: bool = True) -> dict:
    return {"Alive": alive, "Resources": {"CPU": cpus, "GPU": gpus, "memory": memory_gb * 2**30}}


def test_trials_are_counted_node_by_node_not_from_cluster_totals():
    two_half_gpu_nodes = [node(8, 1.5), node(8, 1.5)]
    assert node_slots(Resources(cpus=1, gpus=1), two_half_gpu_nodes) == 2  # the totals (3 GPUs) would say 3
    assert node_slots(Resources(cpus=1, gpus=0.5), two_half_gpu_nodes) == 6  # fractional GPUs share a device
    assert node_slots(Resources(cpus=4, gpus=1), [node(8, 4), node(2, 0)]) == 2  # CPU-bound on the GPU node
    assert node_slots(Resources(cpus=1, gpus=1), [node(16, 0)]) == 0  # never a GPU trial on a node without one
    assert node_slots(Resources(cpus=1, memory_gb=16), [node(8, memory_gb=40)]) == 2
    assert node_slots(Resources(cpus=0.1), [node(1)]) == 10  # no float rounding loss
    assert node_slots(Resources(cpus=1), [node(4, alive=False), node(2)]) == 2  # a node that left counts nothing


def test_store_urls_never_travel_to_ray_workers():
    assert not forwarded("PARETOLAB_OPTUNA_STORAGE", "postgresql://u@h/db")
    assert not forwarded("PARETOLAB_TRACKING_URI", "http://mlflow:5000")
    assert not forwarded("PARETOLAB_EXTRA", "postgresql://u:secret@h/db")
    assert forwarded("PARETOLAB_DATA_DIR", "/data") and forwarded("PYTHONPATH", "/x")
    assert not forwarded("AWS_SECRET_ACCESS_KEY", "x")


def test_redact_hides_passwords_in_userinfo_and_query():
    assert redact("postgresql+psycopg2://u:s3cr@t@db:5432/optuna") == "postgresql+psycopg2://u:***@db:5432/optuna"
    assert redact("postgresql://db/optuna?user=u&password=hunter2&sslmode=require") == "postgresql://db/optuna?user=u&password=***&sslmode=require"
    assert redact("http://mlflow:5000") == "http://mlflow:5000"


def test_stores_come_from_flags_then_environment_then_the_config_file(tmp_path, monkeypatch):
    for key in ("PARETOLAB_OPTUNA_STORAGE", "PARETOLAB_TRACKING_URI", "MLFLOW_TRACKING_URI", "PARETOLAB_HOME", "PARETOLAB_ARTIFACT_ROOT"):
        monkeypatch.delenv(key, raising=False)
    config = tmp_path / "stores.yaml"
    config.write_text("stores:\n  optuna_storage: postgresql://cfg/optuna\n  tracking_uri: http://cfg:5000\n")
    monkeypatch.setenv("PARETOLAB_CONFIG", str(config))
    assert resolve_stores() .optuna_url == "postgresql://cfg/optuna"
    monkeypatch.setenv("PARETOLAB_OPTUNA_STORAGE", "postgresql://env/optuna")
    stores = resolve_stores()
    assert (stores.optuna_url, stores.tracking_uri) == ("postgresql://env/optuna", "http://cfg:5000")
    assert resolve_stores(optuna_url="postgresql://flag/optuna").optuna_url == "postgresql://flag/optuna"
    config.write_text("stores:\n  optuna: postgresql://typo\n")
    with pytest.raises(ConfigError, match=r"unknown key\(s\) stores.optuna"):
        resolve_stores()
    monkeypatch.setenv("PARETOLAB_CONFIG", str(tmp_path / "missing.yaml"))
    with pytest.raises(ConfigError, match="PARETOLAB_CONFIG: no file at"):
        resolve_stores()


def test_submit_refuses_a_password_in_a_store_url_before_contacting_ray():
    with pytest.raises(ConfigError) as err:
        submit(load_spec(ROOT / "pipelines" / "smoke.yaml"), ROOT / "pipelines" / "smoke.yaml", address="http://127.0.0.1:1", storage="postgresql://u:topsecret@db/optuna")
    assert "topsecret" not in str(err.value) and "u:***@db" in str(err.value)
    assert "PARETOLAB_OPTUNA_STORAGE on the cluster's nodes" in str(err.value) and "PGPASSWORD" in str(err.value)


def test_jobs_address_names_the_flag_when_missing_or_wrong(monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    with pytest.raises(ConfigError, match="--address: give the Ray head's dashboard address"):
        jobs_address(None)
    with pytest.raises(ConfigError, match="--address: expected the head's dashboard URL"):
        jobs_address("ray://head:10001")
    assert jobs_address("head:8265") == "http://head:8265"


def test_the_shipped_code_is_the_whole_package_tree(tmp_path):
    root = stage_package(tmp_path)
    assert root.name == "paretolab"
    for part in ("cli/__init__.py", "study/driver.py", "plugins/baselines.py", "pipelines/smoke.yaml", "kernels/__init__.py", "dashboard/app.py"):
        assert (root / part).is_file(), part
    assert not list(root.rglob("__pycache__")) and not list(root.rglob("*.so"))
