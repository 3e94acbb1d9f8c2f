"""What `paretolab submit` ships for the third-party plugins a pipeline uses (the cluster test runs it)."""

from __future__ import annotations

from pathlib import Path

from paretolab.cluster.jobs import plugin_files
from paretolab.study.spec import load_spec
from tests.study.test_study import write_pipeline

ROOT = Path(__file__).resolve().parents[2]


def test_a_pipeline_using_a_plugin_ships_its_module_and_dist_info(tmp_path, with_testplugin):
    spec = load_spec(write_pipeline(tmp_path, name="third", stages=[{"method": "noise"}]))
    assert [p.name for p in plugin_files(spec)] == ["paretolab_testplugin.py", "paretolab_testplugin-0.3.1.dist-info"]
    assert (plugin_files(spec)[1] / "entry_points.txt").read_text().count("paretolab_testplugin") == 1


def test_a_builtin_only_pipeline_ships_no_plugin(with_testplugin):
    assert plugin_files(load_spec(ROOT / "pipelines" / "smoke.yaml")) == []
