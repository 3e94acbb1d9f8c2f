"""Exactly-once bookkeeping when a driver died between writing MLflow and telling Optuna."""

from __future__ import annotations

import optuna

from paretolab.records import TrialResult
from paretolab.stores import resolve_stores
from paretolab.stores.tracking import Tracker
from paretolab.study.optuna_study import open_study, stale_trials
from paretolab.study.search import plan_trial
from paretolab.study.spec import parse_spec
from tests.study.test_spec import GOOD


def test_a_trial_logged_to_mlflow_but_not_told_is_recovered_not_rerun(tmp_path):
    spec = parse_spec(GOOD)
    stores = resolve_stores(home=str(tmp_path))
    study = open_study(spec, stores, resume=False)
    tracker = Tracker(stores, spec.name)
    parent = tracker.study_run({}, {})
    logged, lost, half = study.ask(), study.ask(), study.ask()
    for trial in (logged, lost, half):
        plan_trial(trial, spec)
    tracker.log_trial(parent, logged.number, {}, TrialResult(metrics={"ppl": 12.0, "size_bytes": 100.0}), {})
    half_run = tracker.client.create_run(tracker.experiment_id, tags={"paretolab.role": "trial", "paretolab.trial_number": str(half.number)})
    redo = stale_trials(study, tracker, spec, log=lambda *_: None)

    assert [t.number for t, _ in redo] == [lost.number, half.number]
    told = study.trials[logged.number]
    assert told.state == optuna.trial.TrialState.COMPLETE and told.values == [12.0, 100.0]
    assert tracker.client.get_run(half_run.info.run_id).info.lifecycle_stage == "deleted"  # half-written: dropped
    # the redone trial keeps the parameters it was given before the crash
    assert plan_trial(redo[0][0], spec) == plan_trial(optuna.trial.FixedTrial(study.trials[lost.number].params), spec)


def test_retry_failed_queues_each_failed_parameter_set_once(tmp_path):
    from paretolab.study.optuna_study import requeue_failed

    study = optuna.create_study(directions=["minimize", "minimize"])
    dist = {"rtn.bits": optuna.distributions.CategoricalDistribution([2, 4, 8])}

    for bits, ok in [(2, True), (2, False), (4, False), (8, False), (8, False)]:
        study.enqueue_trial({"rtn.bits": bits})
        trial = study.ask(dist)
        if ok:
            study.tell(trial, [1.0, 2.0])
        else:
            study.tell(trial, state=optuna.trial.TrialState.FAIL)
    assert requeue_failed(study) == 2  # 4 and 8; 2 already has a complete trial
    assert requeue_failed(study) == 0  # already waiting: not queued twice
    assert sorted(study.ask(dist).params["rtn.bits"] for _ in range(2)) == [4, 8]
