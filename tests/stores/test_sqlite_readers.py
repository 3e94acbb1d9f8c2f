"""`paretolab frontier` on a SQLite store reads it with the standard library: the same study Optuna reads, the same
run metrics and artifacts MLflow holds, and no MLflow, Optuna, SQLAlchemy or torch imported (the ≤ 1 s path)."""

from __future__ import annotations

import json
import subprocess
import sys

import optuna
import pytest

from paretolab.results.source import StoreSource
from paretolab.stats import ARTIFACT
from paretolab.stores import resolve_stores
from paretolab.stores.mlflow_sqlite import artifact_dir, run_metrics
from paretolab.stores.optuna_sqlite import read_study
from tests.dashboard.conftest import build_stores


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    home = tmp_path_factory.mktemp("sqlite_readers")
    built = build_stores(home)
    optuna.load_study(study_name="demo", storage=built.optuna_url).set_user_attr("quality_note", "")  # as `run` records it now
    return built


def test_the_study_read_with_sqlite3_is_the_one_optuna_reads(stores):
    mine = read_study(stores.optuna_url, "demo")
    study = optuna.load_study(study_name="demo", storage=stores.optuna_url)
    theirs = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
    assert mine.user_attrs == study.user_attrs and mine.directions == ["minimize", "minimize"]
    assert [(t.number, t.values, t.params, t.user_attrs) for t in mine.complete] == [(t.number, t.values, t.params, t.user_attrs) for t in theirs]
    assert [list(t.params) for t in mine.complete] == [list(t.params) for t in theirs], "params in Optuna's order"
    assert read_study(stores.optuna_url, "nope") is None, "an unknown study is Optuna's to word"
    assert read_study("postgresql://u@h/db", "demo") is None


def test_run_metrics_and_artifacts_read_with_sqlite3_are_mlflows(stores):
    from mlflow.tracking import MlflowClient

    run_id = read_study(stores.optuna_url, "demo").complete[0].user_attrs["mlflow_run_id"]
    run = MlflowClient(stores.tracking_uri).get_run(run_id)
    assert run_metrics(stores.tracking_uri, run_id) == run.data.metrics
    assert artifact_dir(stores.tracking_uri, run_id).as_uri() == run.info.artifact_uri
    assert StoreSource(stores).artifact(run_id, ARTIFACT) is None, "a run without per-example scores has none"
    assert run_metrics("http://127.0.0.1:5000", run_id) is None, "a tracking server is the client's"


def test_frontier_imports_no_mlflow_optuna_or_torch(stores, tmp_path):
    code = ("import sys; from paretolab.cli import main; rc = main(['frontier', 'demo', '--storage', sys.argv[1], '--tracking-uri', sys.argv[2]]);"
            "import json; print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in ('mlflow', 'optuna', 'torch', 'sqlalchemy', 'alembic'))))")
    out = subprocess.run([sys.executable, "-c", code, stores.optuna_url, stores.tracking_uri], capture_output=True, text=True, check=True, cwd=tmp_path)
    lines = out.stdout.strip().splitlines()
    assert lines[0].startswith("Pareto set of study 'demo'"), out.stdout
    assert json.loads(lines[-1]) == [], "the frontier of a SQLite store reads it without the heavy imports"
