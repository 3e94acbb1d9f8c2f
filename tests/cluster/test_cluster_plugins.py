"""A third-party plugin installed only on the submitting machine reaches a cluster that does not have it."""

from __future__ import annotations

import os

import pytest
import yaml

from paretolab.cluster.localcluster import RayCluster
from tests.cluster.test_cluster import job_logs, wait_job
from tests.conftest import run_cli

pytestmark = [pytest.mark.ray, pytest.mark.slow]


@pytest.fixture(scope="module")
def bare_cluster():
    """One Ray head whose nodes have paretolab's dependencies but not the test plugin."""
    env = {"PYTHONPATH": ""} if os.environ.get("PYTHONPATH") else {}
    cluster = RayCluster(head_cpus=2, env_extra=env)
    try:
        yield cluster.start()
    finally:
        cluster.stop()


def test_submit_ships_the_plugins_a_pipeline_uses(bare_cluster, testplugin_path, tmp_path):
    """As docs/plugins.md says: pip-install the plugin beside paretolab, then `paretolab submit`."""
    pipeline = tmp_path / "shipped.yaml"
    pipeline.write_text(yaml.safe_dump({
        "name": "shipped", "model": "tiny-llama",
        "task": {"name": "perplexity", "max_tokens": 256, "context": 64, "stride": 64},
        "stages": [{"method": "noise"}],  # from the plugin (tests/fixtures/testplugin)
        "objectives": [{"metric": "ppl"}, {"metric": "size_bytes"}],
        "search": {"sampler": "random", "trials": 2, "seed": 0},
        "measures": ["size", "params"],
    }))
    here = {**bare_cluster.env, "PYTHONPATH": str(testplugin_path)}  # installed here only

    def submit(*extra: str) -> str:
        out = run_cli("submit", str(pipeline), "--address", bare_cluster.jobs_url, *extra, cwd=tmp_path, env=here)
        return out.stdout.strip().splitlines()[-1]

    unshipped = submit("--no-code")  # the cluster's own install: it has no `noise`
    assert wait_job(bare_cluster, unshipped, tmp_path) == "FAILED"
    assert "unknown method 'noise'" in job_logs(bare_cluster, unshipped)

    shipped = submit()
    assert wait_job(bare_cluster, shipped, tmp_path) == "SUCCEEDED", job_logs(bare_cluster, shipped)
    assert "2 trial(s) completed, 0 failed" in job_logs(bare_cluster, shipped)
