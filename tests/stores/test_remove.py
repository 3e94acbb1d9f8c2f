"""Removing a study from both stores: gone from Optuna and MLflow, a new run of that name starts fresh, never while owned."""

from __future__ import annotations

import pytest

from paretolab.records import TrialResult
from paretolab.stores import resolve_stores
from paretolab.stores.ownership import StudyOwnedError, own_study
from paretolab.stores.remove import remove_study
from paretolab.stores.tracking import Tracker


def make_study(stores, name: str, trials: int) -> None:
    import optuna

    study = optuna.create_study(study_name=name, storage=stores.optuna_url, directions=["minimize"])
    tracker = Tracker(stores, name)
    parent = tracker.study_run({}, {})
    for _ in range(trials):
        trial = study.ask()
        tracker.log_trial(parent, trial.number, {}, TrialResult(metrics={"ppl": 1.0}), {})
        study.tell(trial, [1.0])


def test_remove_study_takes_both_stores_and_a_new_run_of_the_name_starts_fresh(tmp_path):
    import optuna
    from mlflow.tracking import MlflowClient

    stores = resolve_stores(home=str(tmp_path))
    make_study(stores, "gone", 2)
    make_study(stores, "kept", 1)
    client = MlflowClient(tracking_uri=stores.tracking_uri)
    old = client.get_experiment_by_name("gone").experiment_id
    removed = remove_study(stores, "gone")
    assert (removed.optuna_trials, removed.mlflow_runs) == (2, 3)  # two trials, three runs (the study's parent run too)
    assert [s.study_name for s in optuna.get_all_study_summaries(stores.optuna_url)] == ["kept"]
    assert sorted(e.name for e in client.search_experiments()) == ["Default", "kept"]  # what the dashboard lists: active experiments
    fresh = Tracker(stores, "gone")  # a new run under the same name gets a new, empty experiment
    assert fresh.experiment_id != old and client.get_experiment(fresh.experiment_id).lifecycle_stage == "active"
    assert client.search_runs([fresh.experiment_id]) == [] and client.get_experiment(old).name == removed.mlflow_renamed
    with pytest.raises(Exception, match="no study 'nope'"):
        remove_study(stores, "nope")


def test_a_study_whose_driver_is_alive_is_not_removed(tmp_path):
    import optuna

    stores = resolve_stores(home=str(tmp_path))
    make_study(stores, "busy", 1)
    with own_study(stores.optuna_url, "busy"):  # a driver holds it
        with pytest.raises(StudyOwnedError, match="being run by another driver"):
            remove_study(stores, "busy")
    assert [s.study_name for s in optuna.get_all_study_summaries(stores.optuna_url)] == ["busy"]


def test_status_of_a_study_from_its_session_and_counts():
    from paretolab.study.session import SESSION, study_status

    done = {"complete": 4, "failed": 0, "running": 0}
    assert study_status({SESSION: {"state": "finished", "planned": 4}}, done, owned=False)[0] == "finished"
    assert study_status({SESSION: {"state": "running", "planned": 4}}, done, owned=True)[0] == "running"
    short, hint, interrupted = study_status({SESSION: {"state": "interrupted", "by": "SIGINT", "planned": 4, "pipeline": "p.yaml"}},
                                            {"complete": 1, "failed": 1}, owned=False)
    assert interrupted and short == "interrupted (SIGINT)" and hint.endswith("1 of 4 planned trial(s) complete: resume with `paretolab run p.yaml --resume`")
    assert study_status({SESSION: {"state": "running", "planned": 4}}, {"complete": 1}, owned=False)[0] == "interrupted (driver died)"
    legacy = {"pipeline": {"search": {"trials": 12}}}  # a study from before sessions were recorded
    assert study_status(legacy, {"complete": 0, "failed": 2}, owned=False)[2]
    assert not study_status(legacy, {"complete": 12, "failed": 2}, owned=False)[2]
