"""Store and cluster errors are one line with exit status 2; read-only commands create nothing."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

import optuna
import pytest

from paretolab.cli import main

ROOT = Path(__file__).resolve().parents[2]
SMOKE = str(ROOT / "pipelines" / "smoke.yaml")


def one_line_error(capsys, *argv: str) -> str:
    rc = main(list(argv))
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1, (rc, err)
    return err[0]


@pytest.mark.parametrize("command", [["studies"], ["frontier", "smoke"], ["report", "smoke"]])
def test_read_only_commands_never_create_stores(command, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    main([*command, "--home", str(tmp_path / "h")])
    assert not (tmp_path / "h").exists() and not (tmp_path / ".paretolab").exists()


def test_a_home_that_is_a_file_or_cannot_be_made(tmp_path, capsys):
    (tmp_path / "f").write_text("x")
    assert "is a file, not a folder" in one_line_error(capsys, "run", SMOKE, "--home", str(tmp_path / "f"))
    assert "cannot create it" in one_line_error(capsys, "run", SMOKE, "--home", "/proc/paretolab-test")


def test_a_garbage_database_is_named(tmp_path, capsys):
    (tmp_path / "optuna.db").write_bytes(b"not a database" * 100)
    line = one_line_error(capsys, "studies", "--home", str(tmp_path))
    assert "optuna.db is not a SQLite database" in line
    line = one_line_error(capsys, "run", SMOKE, "--home", str(tmp_path))
    assert "optuna.db is not a SQLite database" in line


def test_an_old_optuna_schema_names_the_upgrade_command(tmp_path, capsys):
    url = f"sqlite:///{tmp_path / 'optuna.db'}"
    optuna.storages.RDBStorage(url)
    with sqlite3.connect(tmp_path / "optuna.db") as conn:
        conn.execute("UPDATE alembic_version SET version_num = 'v2.4.0.a'")
    for argv in (["studies"], ["run", SMOKE]):
        assert "`optuna storage upgrade --storage URL`" in one_line_error(capsys, *argv, "--home", str(tmp_path))


def test_an_old_mlflow_schema_names_the_upgrade_command(tmp_path, capsys):
    import subprocess
    import sys

    # in another process: MLflow caches an opened store per URI, and would not look at the schema again
    subprocess.run([sys.executable, "-c", "from mlflow.tracking import MlflowClient; import sys; "
                    "MlflowClient(tracking_uri=sys.argv[1]).search_experiments()", f"sqlite:///{tmp_path / 'mlflow.db'}"], check=True)
    with sqlite3.connect(tmp_path / "mlflow.db") as conn:
        conn.execute("UPDATE alembic_version SET version_num = '451aebb31d03'")
    assert "`mlflow db upgrade URL`" in one_line_error(capsys, "run", SMOKE, "--home", str(tmp_path))


def test_an_unreachable_postgres_is_one_line_without_the_password(tmp_path, capsys):
    line = one_line_error(capsys, "run", SMOKE, "--home", str(tmp_path), "--storage", "postgresql+psycopg2://me:s3cr3t@127.0.0.1:1/optuna")
    assert "cannot reach the Optuna store" in line and "s3cr3t" not in line
    assert not (tmp_path / "mlflow.db").exists()


def test_an_unreachable_address_fails_within_seconds(tmp_path, capsys):
    start = time.monotonic()
    line = one_line_error(capsys, "run", SMOKE, "--home", str(tmp_path), "--address", "127.0.0.1:1")
    assert "no Ray cluster answers at 127.0.0.1:1" in line and time.monotonic() - start < 30
    assert not (tmp_path / "optuna.db").exists()  # refused before a store is written


def test_trials_errors_say_what_extends_a_study(tmp_path, capsys):
    from paretolab.study.spec import load_spec

    spec = load_spec(SMOKE)
    study = optuna.create_study(study_name="smoke", storage=f"sqlite:///{tmp_path / 'optuna.db'}", directions=["minimize", "minimize"])
    study.set_user_attr("pipeline_hash", spec.pipeline_hash())
    study.add_trial(optuna.trial.create_trial(values=[1.0, 2.0]))
    assert "--trials N (N > 1) to extend it" in one_line_error(capsys, "run", SMOKE, "--home", str(tmp_path))
    assert "--trials 1: study 'smoke' already holds 1 finished trial(s); give a larger N" in one_line_error(
        capsys, "run", SMOKE, "--home", str(tmp_path), "--trials", "1")
