"""A full disk while creating the stores or recording a trial: one line, nothing partial left, the study resumable."""

from __future__ import annotations

import errno
import os
import shutil
from types import SimpleNamespace

import optuna
import pytest

from paretolab.errors import ConfigError

FULL = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def test_creating_the_mlflow_store_on_a_full_disk_leaves_no_part_file(tmp_path, monkeypatch):
    from paretolab.stores import resolve_stores
    from paretolab.stores.tracking import Tracker

    stores = resolve_stores(home=str(tmp_path))
    real = shutil.copyfile

    def full(src, dst, *args, **kwargs):
        real(src, dst, *args, **kwargs)  # the copy lands, then the disk fills: the part file exists when it fails
        raise FULL

    monkeypatch.setattr(shutil, "copyfile", full)
    with pytest.raises(ConfigError, match="cannot create the MLflow store .*mlflow.db \\(No space left on device\\)") as info:
        Tracker(stores, "s")
    assert "\n" not in str(info.value)
    left = sorted(p.name for p in tmp_path.iterdir() if not p.name.endswith(".lock"))  # the creation lock stays, as after a success
    assert "mlflow.db" not in left and not [n for n in left if n.endswith(".part")], left


def _spec():
    from paretolab.study.spec import parse_spec
    from tests.reliability.conftest import TINY

    import yaml

    return parse_spec(yaml.safe_load(TINY))


def _job(study):
    from paretolab.records import StagePlan

    trial = study.ask()
    return SimpleNamespace(trial=trial, plan=[StagePlan("stage0", "rtn", {"bits": 4, "group_size": 32})], attempt=1, started=0.0)


def _outcome():
    return SimpleNamespace(overhead_s=[], failed=0, pruned=0, completed=0)


def _result():
    from paretolab.records import TrialResult

    return TrialResult(metrics={"ppl": 10.0, "size_bytes": 100.0, "transform_s": 0.1})


def test_recording_a_trial_on_a_full_mlflow_disk_is_one_line_and_the_trial_runs_again(tmp_path):
    import sqlalchemy.exc

    from paretolab.study.recording import record_trial

    study = optuna.create_study(storage=f"sqlite:///{tmp_path / 'optuna.db'}", directions=["minimize", "minimize"])
    job = _job(study)

    def log_trial(*args):
        raise sqlalchemy.exc.OperationalError("INSERT INTO metrics", {}, Exception("database or disk is full"))

    tracker = SimpleNamespace(uri=f"sqlite:///{tmp_path / 'mlflow.db'}", log_trial=log_trial)
    with pytest.raises(ConfigError) as info:
        record_trial(study, tracker, "parent", _spec(), job, _result(), {}, 1.0, _outcome(), SimpleNamespace(trial_finished=lambda **k: None))
    line = str(info.value)
    assert "mlflow.db could not be written: the disk is full" in line and "--resume" in line and "\n" not in line
    assert study.trials[0].state == optuna.trial.TrialState.RUNNING  # not COMPLETE: a resume runs its parameters again


def test_telling_optuna_on_a_full_disk_is_one_line(tmp_path, monkeypatch):
    import sqlalchemy.exc

    from paretolab.study.recording import record_trial

    study = optuna.create_study(storage=f"sqlite:///{tmp_path / 'optuna.db'}", directions=["minimize", "minimize"])
    job = _job(study)

    def tell(*args, **kwargs):
        raise sqlalchemy.exc.OperationalError("UPDATE trials", {}, Exception("database or disk is full"))

    monkeypatch.setattr(study, "tell", tell)
    tracker = SimpleNamespace(uri=f"sqlite:///{tmp_path / 'mlflow.db'}", log_trial=lambda *a: "run1")
    with pytest.raises(ConfigError, match="optuna.db could not be written: the disk is full"):
        record_trial(study, tracker, "parent", _spec(), job, _result(), {}, 1.0, _outcome(), SimpleNamespace(trial_finished=lambda **k: None))


def test_a_store_write_error_that_is_not_the_disk_still_raises_as_itself(tmp_path):
    from paretolab.study.recording import record_trial

    study = optuna.create_study(storage=f"sqlite:///{tmp_path / 'optuna.db'}", directions=["minimize", "minimize"])
    tracker = SimpleNamespace(uri="sqlite:///x.db", log_trial=lambda *a: (_ for _ in ()).throw(KeyError("bug")))
    with pytest.raises(KeyError):
        record_trial(study, tracker, "p", _spec(), _job(study), _result(), {}, 1.0, _outcome(), SimpleNamespace(trial_finished=lambda **k: None))
