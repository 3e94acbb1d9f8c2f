"""Every read path on a damaged store: one line naming the file and what to do; a read never creates or migrates a schema."""

from __future__ import annotations

import shutil
import sqlite3
import threading
from pathlib import Path

import pytest

from tests.conftest import run_cli
from tests.reliability.conftest import refused


@pytest.fixture(scope="session")
def good_home(tmp_path_factory) -> Path:
    """Study ``demo`` in both stores, as `paretolab run` writes them (tests/dashboard's fixture)."""
    from tests.dashboard.conftest import build_stores

    home = tmp_path_factory.mktemp("good_store")
    build_stores(home)
    return home


@pytest.fixture
def home(good_home, tmp_path) -> Path:
    return Path(shutil.copytree(good_home, tmp_path / "home"))


def sql(db: Path, *statements: str) -> None:
    with sqlite3.connect(db) as conn:
        for statement in statements:
            conn.execute(statement)


READS = [["studies"], ["frontier", "demo"], ["frontier", "demo", "--json"], ["report", "demo"]]


@pytest.mark.parametrize("argv", READS, ids=lambda a: "-".join(a))
def test_an_empty_optuna_store_is_one_line_and_stays_empty(argv, home):
    (home / "optuna.db").write_bytes(b"")
    line = refused(*argv, "--home", str(home), cwd=home)
    assert "optuna.db is empty (0 bytes)" in line
    assert (home / "optuna.db").stat().st_size == 0  # no schema written by a read


def test_an_empty_mlflow_store_is_one_line_and_stays_empty(home):
    (home / "mlflow.db").write_bytes(b"")
    assert "mlflow.db is empty (0 bytes)" in refused("frontier", "demo", "--home", str(home), cwd=home)
    assert (home / "mlflow.db").stat().st_size == 0


def _scramble(db: Path, at: float) -> None:
    data = bytearray(db.read_bytes())
    start = int(len(data) * at) // 4096 * 4096 + 8  # inside a page, past its header's first bytes
    data[start:start + 3000] = bytes((i * 97 + 13) % 256 for i in range(3000))
    db.write_bytes(bytes(data))


@pytest.mark.parametrize("argv", [["studies"], ["frontier", "demo", "--json"]], ids=lambda a: "-".join(a))
def test_random_bytes_inside_the_optuna_store_are_named_damaged(argv, home):
    _scramble(home / "optuna.db", 0.25)
    line = refused(*argv, "--home", str(home), cwd=home)
    assert "optuna.db" in line and ("damaged" in line or "not a SQLite" in line)


def test_a_truncated_optuna_store_is_one_line(home):
    db = home / "optuna.db"
    db.write_bytes(db.read_bytes()[: db.stat().st_size // 2])
    line = refused("frontier", "demo", "--home", str(home), cwd=home)
    assert "optuna.db" in line and "damaged" in line


def test_a_complete_trial_without_values_is_named(home):
    sql(home / "optuna.db", "DELETE FROM trial_values WHERE trial_id = (SELECT min(trial_id) FROM trials WHERE state = 'COMPLETE')")
    line = refused("frontier", "demo", "--json", "--home", str(home), cwd=home)
    assert "have no objective values" in line and "'demo' #0" in line and "UPDATE trials SET state = 'FAIL'" in line


def test_a_dropped_table_is_named(home):
    sql(home / "optuna.db", "DROP TABLE trial_params")
    line = refused("studies", "--home", str(home), cwd=home)
    assert "missing table(s) trial_params" in line


def test_a_dropped_mlflow_table_is_named(home):
    sql(home / "mlflow.db", "DROP TABLE metrics")
    assert "mlflow.db is missing table(s) metrics" in refused("frontier", "demo", "--home", str(home), cwd=home)


def test_a_store_from_a_newer_optuna_is_one_line(home):
    sql(home / "optuna.db", "UPDATE alembic_version SET version_num = 'v9.9.9.z'")
    line = refused("frontier", "demo", "--home", str(home), cwd=home)
    assert "optuna.db" in line or "Optuna store" in line


def test_a_locked_store_says_so(home, monkeypatch):
    from paretolab.stores import store_check

    monkeypatch.setattr(store_check, "LOCK_TIMEOUT_S", 0.5)
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        conn = sqlite3.connect(home / "optuna.db", isolation_level=None)
        conn.execute("BEGIN EXCLUSIVE")
        held.set()
        release.wait(30)
        conn.execute("ROLLBACK")
        conn.close()

    thread = threading.Thread(target=hold)
    thread.start()
    held.wait(10)
    try:
        assert "is locked by another process" in refused("studies", "--home", str(home), cwd=home)
    finally:
        release.set()
        thread.join()


def test_load_study_on_an_empty_store_is_a_config_error(home):
    import paretolab
    from paretolab.errors import ConfigError

    (home / "optuna.db").write_bytes(b"")
    with pytest.raises(ConfigError, match="optuna.db is empty"):
        paretolab.load_study("demo", home=str(home))
    assert (home / "optuna.db").stat().st_size == 0


def test_export_on_a_damaged_store_is_refused_before_any_work(home, tmp_path):
    (home / "optuna.db").write_bytes(b"")
    assert "optuna.db is empty" in refused("export", "demo", "1", "--out", str(tmp_path / "o"), "--home", str(home), cwd=home)
    assert not (tmp_path / "o").exists() and not list(tmp_path.glob("o.*"))


def test_the_dashboard_refuses_a_store_studies_refuses(home):
    (home / "optuna.db").write_bytes(b"")
    proc = run_cli("dashboard", "--home", str(home), "--port", "8599", cwd=home, check=False, timeout=40)
    assert proc.returncode == 2 and "optuna.db is empty" in proc.stderr and "Traceback" not in proc.stderr


def test_the_dashboard_page_shows_the_line(home, monkeypatch):
    from streamlit.testing.v1 import AppTest

    from paretolab.stores import resolve_stores

    stores = resolve_stores(home=str(home))
    monkeypatch.setenv("PARETOLAB_OPTUNA_STORAGE", stores.optuna_url)
    monkeypatch.setenv("PARETOLAB_TRACKING_URI", stores.tracking_uri)
    (home / "optuna.db").write_bytes(b"\x00" * 100)
    at = AppTest.from_file(str(Path(__file__).resolve().parents[2] / "dashboard" / "app.py"), default_timeout=60)
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    assert any("optuna.db is not a SQLite database" in e.value for e in at.error)
