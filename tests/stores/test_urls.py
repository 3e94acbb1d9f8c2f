"""Store URLs are parsed as SQLAlchemy parses them wherever a password is hidden or refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from paretolab.cluster.jobs import submit
from paretolab.cluster.ray_init import forwarded
from paretolab.errors import ConfigError
from paretolab.stores import Stores, has_password, redact
from paretolab.study.spec import load_spec

SMOKE = Path(__file__).resolve().parents[2] / "pipelines" / "smoke.yaml"

WITH_PASSWORD = [
    ("postgresql://u:se/cret@h/db", "se/cret", "postgresql://u:***@h/db"),
    ("postgresql://:secret@h/db", "secret", "postgresql://:***@h/db"),
    ("postgresql+psycopg2://u:p%40ss@h:5432/db", "p%40ss", "postgresql+psycopg2://u:***@h:5432/db"),
    ("postgresql://u@h/db?sslmode=require&PassWord=hunter2", "hunter2", "postgresql://u@h/db?sslmode=require&PassWord=***"),
    ("http://admin:s3cret@mlflow:5000", "s3cret", "http://admin:***@mlflow:5000"),
    ("postgresql://u:se/cret@h:port/db", "se/cret", "postgresql://***@h:port/db"),  # unparseable port: all user info hidden
]
WITHOUT = ["postgresql://u@h/db", "sqlite:////tmp/x/optuna.db", "http://mlflow:5000", "databricks", "/data:/more", "file:///tmp/mlruns"]


@pytest.mark.parametrize("url, secret, shown", WITH_PASSWORD)
def test_redact_hides_every_password_sqlalchemy_would_send(url, secret, shown):
    assert redact(url) == shown and secret not in redact(url)
    assert has_password(url)
    assert secret not in str(Stores(url, url, None).redacted())
    assert not forwarded("PARETOLAB_EXTRA", url)  # never put in a Ray job's runtime_env


@pytest.mark.parametrize("url", WITHOUT)
def test_text_without_a_password_is_left_alone(url):
    assert redact(url) == url and not has_password(url)


@pytest.mark.parametrize("url, secret", [(u, s) for u, s, _ in WITH_PASSWORD[:4]])
def test_submit_refuses_them_before_contacting_ray(url, secret):
    with pytest.raises(ConfigError) as err:
        submit(load_spec(SMOKE), SMOKE, address="http://127.0.0.1:1", storage=url)
    assert "--storage:" in str(err.value) and "holds a password" in str(err.value) and secret not in str(err.value)
