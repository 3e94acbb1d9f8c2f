"""search.pruner, constraints: and search.enqueue as a pipeline states them: parsed, refused with the field and the fix,
and the pruner's judgement (PruneBoard) as the driver uses it, across a resume."""

from __future__ import annotations

import pytest

from paretolab.errors import ConfigError
from paretolab.study.constraints import references, trial_verdict
from paretolab.study.pruning import PruneBoard
from paretolab.study.spec import parse_spec
from tests.study.test_spec import GOOD

TRAIN = {
    **GOOD,
    "name": "train-lr",
    "model": "scratch-1m",
    "task": {"name": "perplexity", "corpus": "pystdlib-val", "max_tokens": 1024},
    "stages": [{"id": "t", "method": "train", "params": {"tokens": 8192, "lr": {"low": 1e-4, "high": 1.0, "log": True}, "eval_every": 4}}],
    "objectives": [{"metric": "val_loss"}],
    "search": {"sampler": "random", "trials": 8, "seed": 0, "pruner": {"name": "median", "n_startup_trials": 2}},
}


def _search(**search):
    return parse_spec({**TRAIN, "search": {**TRAIN["search"], **search}})


def test_a_pruner_is_parsed_with_its_own_arguments_and_asha_gets_a_rung_per_evaluation_point():
    spec = _search()
    assert spec.search.pruner.name == "median" and spec.search.pruner.args == {"n_startup_trials": 2}
    assert spec.search.pruner.metric == "val_loss" and spec.search.pruner.direction == "minimize"
    asha = _search(pruner={"name": "asha"}).search.pruner
    assert asha.args["min_resource"] == 4  # the train stage's eval_every, not Optuna's 'auto' (1/100 of a trial)
    assert asha.make().__class__.__name__ == "SuccessiveHalvingPruner"


@pytest.mark.parametrize(("pruner", "message"), [
    ({"name": "medain"}, "did you mean 'median'"),
    ({"name": "median", "n_warmup": 3}, "search.pruner.n_warmup: not an argument of MedianPruner"),
    ({"name": "asha", "reduction_factor": 1}, "search.pruner: SuccessiveHalvingPruner(reduction_factor=1"),
    ({"name": "median", "metric": "val_los"}, "search.pruner.metric"),
])
def test_a_wrong_pruner_is_refused_with_the_field(pruner, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
        _search(pruner=pruner)


def test_a_pruner_needs_a_stage_that_reports():
    with pytest.raises(ConfigError, match="no stage of this pipeline reports intermediate values"):
        parse_spec({**GOOD, "search": {**GOOD["search"], "pruner": "median"}})


def test_constraints_and_enqueued_points_are_parsed_into_optuna_parameters():
    spec = parse_spec({**GOOD, "constraints": [{"metric": "ppl", "max_ratio_to": "none", "max": 1.1}, {"metric": "size_bytes", "max": 2e5}],
                       "search": {**GOOD["search"], "enqueue": ["magnitude+rtn[bits=4]", {"magnitude.sparsity": 0.5}]}})
    relative, absolute = spec.constraints
    assert relative.ratio_to == "none" and relative.upper and relative.bound == 1.1
    assert absolute.ratio_to is None and absolute.bound == 2e5
    assert spec.search.enqueue[0] == {"stage1.method": "rtn", "rtn.bits": 4}
    assert spec.search.enqueue[1] == {"magnitude.sparsity": 0.5}


@pytest.mark.parametrize(("edit", "message"), [
    ({"constraints": [{"metric": "ppl", "max": 1, "min": 0}]}, r"constraints\[0\]: give exactly one of `max` and `min`"),
    ({"constraints": [{"metric": "ppl", "max_ratio_to": "wanda", "max": 1.1}]}, r"constraints\[0\].max_ratio_to"),
    ({"constraints": [{"metric": "ppl", "min_ratio_to": "none", "max": 1.1}]}, "min_ratio_to goes with `min`"),
    ({"constraints": [{"metric": "acc", "min": 0.4}]}, "constraints"),
    ({"search": {**GOOD["search"], "enqueue": [{"magnitude.sparsty": 0.5}]}}, "did you mean 'magnitude.sparsity'"),
    ({"search": {**GOOD["search"], "enqueue": [{"magnitude.sparsity": 1.5}]}}, "outside its range"),
    ({"search": {**GOOD["search"], "sampler": "grid", "enqueue": ["none"]}, "stages": [GOOD["stages"][1]]}, "a grid runs every point"),
])
def test_wrong_constraints_and_enqueued_points_are_refused_with_the_field(edit, message):
    with pytest.raises(ConfigError, match=message):
        parse_spec({**GOOD, **edit})


def test_a_relative_bound_is_judged_against_the_earliest_complete_trial_of_its_arm():
    spec = parse_spec({**GOOD, "constraints": [{"metric": "ppl", "max_ratio_to": "none", "max": 1.1}]})
    none = {"stage1.method": "none", "magnitude.sparsity": 0.1}
    assert references(spec.constraints, [(3, none, {"ppl": 30.0}), (1, {"stage1.method": "none"}, {"ppl": 20.0})]) == {0: 20.0}

    class Study:  # the complete trials a driver would read: only the reference so far
        def get_trials(self, deepcopy, states):
            return []

    attrs, bounds = trial_verdict(spec.constraints, Study(), 0, {"stage1.method": "none"}, {"ppl": 20.0})
    assert attrs["feasible"] and bounds == {"0": pytest.approx(-2.0)}  # the reference judges itself: 20 <= 22


def test_the_median_pruner_stops_a_trial_behind_the_finished_ones_and_a_resumed_board_agrees():
    board = PruneBoard(_search().search.pruner)
    for number, curve in enumerate([[5.0, 4.0, 3.0], [5.2, 4.1, 3.1]]):  # two finished trials: the median's startup
        assert not any(board.report(number, 4 * (i + 1), {"val_loss": v}) for i, v in enumerate(curve))
        board.finish(number, "COMPLETE", curve[-1])
    assert not board.report(2, 4, {"val_loss": 4.9})  # ahead of the median at step 4: goes on
    assert board.report(2, 8, {"val_loss": 9.0})  # far behind at step 8: stop
    kept = board.finish(2, "PRUNED")
    assert kept["intermediate"] == {4: 4.9, 8: 9.0} and kept["value"] == 9.0

    history = [{"state": "COMPLETE", "value": c[-1], "intermediate": {4 * (i + 1): v for i, v in enumerate(c)}, "attrs": {}}
               for c in ([5.0, 4.0, 3.0], [5.2, 4.1, 3.1])]
    resumed = PruneBoard(_search().search.pruner, history)
    assert resumed.report(7, 4, {"val_loss": 4.9}) is False and resumed.report(7, 8, {"val_loss": 9.0}) is True


class _Logged:
    """What MLflow holds of the trials a dead driver left RUNNING: trial 0 finished, trial 1 pruned, trial 2 nothing."""

    tags: dict = {}

    def finished_trial(self, number):
        return ("run-0", {"ppl": 30.0, "size_bytes": 1e5}) if number == 0 else None

    def failed_trial(self, number):
        return None

    def pruned_trial(self, number):
        return ("run-1", 12) if number == 1 else None

    def set_tags(self, run_id, tags):
        self.tags[run_id] = tags


def test_a_resume_recovers_a_finished_trial_with_its_verdict_and_a_pruned_one_as_pruned():
    import optuna

    from paretolab.study.optuna_study import stale_trials

    spec = parse_spec({**GOOD, "constraints": [{"metric": "ppl", "max": 25.0}]})
    study = optuna.create_study(directions=["minimize", "minimize"])
    for _ in range(3):
        study.ask()
    redo = stale_trials(study, _Logged(), spec, log=lambda *_: None)
    finished, pruned, again = study.get_trials()
    assert finished.state == optuna.trial.TrialState.COMPLETE and finished.user_attrs["mlflow_run_id"] == "run-0"
    assert finished.user_attrs["feasible"] is False and finished.constraints == {"0": 5.0}  # judged, not silently feasible
    assert _Logged.tags["run-0"]["paretolab.feasible"] == "false"
    assert pruned.state == optuna.trial.TrialState.PRUNED and pruned.user_attrs == {"mlflow_run_id": "run-1", "pruned_at_step": 12}
    assert [t.number for t, _ in redo] == [again.number]
