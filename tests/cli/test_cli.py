"""The command line a user types: help everywhere, listings, and errors that say what to do."""

from __future__ import annotations

import pytest

from tests.conftest import cli_here, run_cli


@pytest.mark.parametrize("args", [[], ["run"], ["plugins"], ["models"], ["models", "pull"], ["frontier"], ["studies"]])
def test_help_everywhere(args, tmp_path):
    out = cli_here(*args, "--help", cwd=tmp_path).stdout  # the parser the installed command runs (which the other tests run)
    assert "usage: paretolab" in out


def test_models_list_and_unknown_model(tmp_path):
    out = run_cli("models", "list", cwd=tmp_path).stdout
    assert "smollm2-135m" in out and "tiny-llama" in out
    bad = run_cli("models", "pull", "smollm3", cwd=tmp_path, check=False)
    assert bad.returncode == 2 and "did you mean 'smollm2-135m'" in bad.stderr


def test_bad_pipeline_is_one_clear_line(tmp_path):
    path = tmp_path / "p.yaml"
    path.write_text("name: x\nmodel: tiny-llama\ntask: perplexity\nstages: [{method: rtn, params: {bits: 5}}]\nobjectives: [ppl]\nsearch: {sampler: bayes}\n")
    bad = run_cli("run", str(path), cwd=tmp_path, check=False)
    assert bad.returncode == 2
    assert bad.stderr.strip().splitlines() == ["paretolab: error: search.sampler: unknown sampler 'bayes' (known: nsga2, tpe, random, grid)"]


def test_frontier_of_a_missing_study(tmp_path):
    bad = run_cli("frontier", "nope", cwd=tmp_path, check=False)
    assert bad.returncode == 2 and "no study 'nope'" in bad.stderr
    assert "no studies yet" in run_cli("studies", cwd=tmp_path).stdout
