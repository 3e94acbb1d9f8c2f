"""No secret printed (issue 69): a password given in a store's URL never reaches a message, a log line or a traceback,
and a store that does not answer is given up on in bounded time, with a line saying what is being waited for.

Two servers that are not there: a closed port (refused at once) and a port whose socket accepts and never answers (a
listener thread here): the case that kept `paretolab run` silent for 259 s and then printed the password."""

from __future__ import annotations

import io
import logging
import socket
import sys
import threading
import time

import pytest

from tests.conftest import cli_here, run_cli
from tests.reliability.conftest import one_line, refused

SECRET = "s3cr3t-pw"
FAST = {"PARETOLAB_CONNECT_TIMEOUT_S": "3"}  # the tests' patience; the default (10 s) is checked below


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def silent_port():
    """A port on 127.0.0.1 that accepts connections and never says a word (until the test ends)."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    held: list[socket.socket] = []
    stop = threading.Event()

    def serve() -> None:
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(server.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield server.getsockname()[1]
    stop.set()
    thread.join(5)
    for conn in held:
        conn.close()
    server.close()


def no_secret(proc) -> None:
    assert SECRET not in proc.stdout + proc.stderr, proc.stdout + proc.stderr


def test_an_mlflow_server_on_a_closed_port_is_one_line_at_once_without_the_password(pipeline, tmp_path):
    start = time.monotonic()
    proc = run_cli("run", str(pipeline), "--home", str(tmp_path / "home"), "--no-progress",
                   "--tracking-uri", f"http://user:{SECRET}@127.0.0.1:{closed_port()}/", cwd=tmp_path, check=False, timeout=120)
    took = time.monotonic() - start
    no_secret(proc)
    line = one_line(proc)
    assert "cannot reach the MLflow store http://user:***@127.0.0.1:" in line and "refused" in line.lower(), line
    assert took < 60, took  # the interpreter's imports and the pipeline's checks; the store itself answers at once
    assert not (tmp_path / "home" / "optuna.db").exists()  # checked before either store is written: no empty study left


def test_an_mlflow_server_that_never_answers_is_waited_for_in_bounded_time_and_said_so(pipeline, tmp_path, silent_port):
    start = time.monotonic()
    proc = run_cli("run", str(pipeline), "--home", str(tmp_path / "home"), "--no-progress",
                   "--tracking-uri", f"http://user:{SECRET}@127.0.0.1:{silent_port}/", cwd=tmp_path, env=FAST, check=False, timeout=120)
    took = time.monotonic() - start
    no_secret(proc)
    line = one_line(proc, lines=2)
    assert f"waiting for MLflow at http://user:***@127.0.0.1:{silent_port}/ (up to 3 s)" in proc.stderr, proc.stderr
    assert "accepted the connection but sent no reply in 3 s" in proc.stderr.splitlines()[-1], proc.stderr
    assert line.startswith("waiting for MLflow"), line  # said first, while it waits; then the one error line
    assert took < 60, took  # was 259 s of MLflow's retries


@pytest.mark.parametrize("where", ["closed", "silent"])
def test_a_postgres_optuna_store_that_does_not_answer_is_one_line_without_the_password(where, pipeline, tmp_path, silent_port):
    port = closed_port() if where == "closed" else silent_port
    url = f"postgresql+psycopg2://paretolab:{SECRET}@127.0.0.1:{port}/studies"
    pytest.importorskip("psycopg2")
    start = time.monotonic()
    proc = cli_here("check", str(pipeline), "--storage", url, cwd=tmp_path, env=FAST, check=False)
    took = time.monotonic() - start
    no_secret(proc)
    line = one_line(proc, lines=2)
    last = proc.stderr.strip().splitlines()[-1]
    assert f"cannot reach the Optuna store postgresql+psycopg2://paretolab:***@127.0.0.1:{port}/studies" in last, proc.stderr
    assert took < 30, took
    if where == "silent":
        assert "waiting for Optuna at postgresql+psycopg2://paretolab:***@" in line


def test_a_missing_database_driver_is_one_line_naming_the_package(pipeline, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "psycopg2", None)  # as on a machine without psycopg2-binary
    line = refused("check", str(pipeline), "--storage", f"postgresql+psycopg2://u:{SECRET}@127.0.0.1:{closed_port()}/x", cwd=tmp_path)
    assert "needs the database driver 'psycopg2'" in line and "pip install psycopg2-binary" in line, line
    assert SECRET not in line and "u:***@127.0.0.1" in line


def test_mysql_without_its_driver_is_one_line(pipeline, tmp_path):
    import importlib.util

    if importlib.util.find_spec("MySQLdb") is not None:
        pytest.skip("mysqlclient is installed here")
    line = refused("check", str(pipeline), "--storage", f"mysql://u:{SECRET}@127.0.0.1/x", cwd=tmp_path)
    assert "needs the database driver 'MySQLdb'" in line and "pip install mysqlclient" in line and SECRET not in line, line


@pytest.mark.parametrize("text", [
    f"API request to http://user:{SECRET}@127.0.0.1:9/api/2.0/mlflow/experiments/get-by-name failed",
    f"(psycopg2.OperationalError) connection to 'postgresql://u:{SECRET}@h:5432/db' failed",
    f"postgresql://u:{SECRET}/x@h/db",  # a / in the password
    f"mysql+pymysql://u:a@{SECRET}@h/db",  # an @ in it
    f"https://:{SECRET}@h/mlflow",  # no user name
    f"dsn: host=h port=5432 password={SECRET} user=u",
    f"postgresql://u@h/db?sslmode=require&password={SECRET}",
])
def test_redact_text_masks_every_password_in_free_text(text):
    from paretolab.stores.locations import redact_text

    shown = redact_text(text)
    assert SECRET not in shown and "***" in shown, shown
    assert redact_text("no url here, a=b c@d") == "no url here, a=b c@d"


def test_log_lines_warnings_and_tracebacks_are_redacted(monkeypatch):
    """MLflow's and paretolab's loggers, a handler configured before or after, an exception logged with its traceback."""
    import warnings

    from paretolab.stores.locations import install_redaction

    install_redaction()
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    for name in ("mlflow.utils.rest_utils", "paretolab.study", "sqlalchemy.pool"):
        logger = logging.getLogger(name)
        logger.addHandler(handler)
        monkeypatch.setattr(logger, "propagate", False)
        try:
            try:
                raise ConnectionError(f"HTTPConnectionPool: url http://u:{SECRET}@h:9/api")
            except ConnectionError:
                logger.error("request to %s failed", f"http://u:{SECRET}@h:9/", exc_info=True)
        finally:
            logger.removeHandler(handler)
    text = stream.getvalue()
    assert "Traceback" in text and "http://u:***@h:9/" in text and SECRET not in text, text
    shown = warnings.formatwarning(f"retrying postgresql://u:{SECRET}@h/db", UserWarning, "x.py", 1)
    assert SECRET not in shown


def test_the_default_wait_is_bounded():
    from paretolab.stores.open import CONNECT_TIMEOUT_S, connect_timeout_s

    assert connect_timeout_s() <= 30 and CONNECT_TIMEOUT_S <= 30


def test_a_full_disk_under_mlflow_is_our_one_line_not_mlflows_traceback(tmp_path, capsys, monkeypatch):
    """MLflow logs a database error with its whole traceback (45 lines) before raising it: the study says it once."""
    import optuna
    import sqlalchemy.exc
    import sqlalchemy.orm

    from paretolab.errors import ConfigError
    from paretolab.stores import resolve_stores
    from paretolab.stores.tracking import Tracker
    from paretolab.study.recording import record_trial
    from types import SimpleNamespace

    from tests.reliability.test_write_errors import _job, _outcome, _result, _spec

    stores = resolve_stores(home=str(tmp_path))
    tracker = Tracker(stores, "full")
    parent = tracker.study_run({}, {})
    study = optuna.create_study(storage=f"sqlite:///{tmp_path / 'o.db'}", directions=["minimize", "minimize"])
    job = _job(study)
    capsys.readouterr()

    def full(self, *args, **kwargs):
        raise sqlalchemy.exc.OperationalError("INSERT INTO runs", {}, Exception("database or disk is full"))

    monkeypatch.setattr(sqlalchemy.orm.Session, "commit", full)
    with pytest.raises(ConfigError) as info:
        record_trial(study, tracker, parent, _spec(), job, _result(), {}, 1.0, _outcome(), SimpleNamespace(trial_finished=lambda **k: None))
    assert "mlflow.db could not be written: the disk is full" in str(info.value) and "\n" not in str(info.value)
    err = capsys.readouterr().err
    assert "Traceback" not in err and "SQLAlchemy database error" not in err, err
