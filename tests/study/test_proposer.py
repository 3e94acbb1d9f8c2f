"""Search that does not repeat itself: per-trial seeds, no duplicate sets in discrete spaces, grids by size."""

from __future__ import annotations

import optuna
import pytest

from paretolab.errors import ConfigError
from paretolab.stores import resolve_stores
from paretolab.study.driver import run_study
from paretolab.study.preflight import planned_trials
from paretolab.study.proposer import Proposer, params_key
from paretolab.study.search import make_sampler, plan_trial, space_size
from paretolab.study.spec import parse_spec
from tests.study.test_spec import GOOD, broken

optuna.logging.set_verbosity(optuna.logging.WARNING)
DISCRETE = [{"choice": [{"method": "rtn", "params": {"bits": [2, 3, 4, 8], "group_size": [32, 64]}}, {"method": "none"}]}]


def drive(study: optuna.Study, spec, n: int) -> None:
    """What the driver does per trial, with a made-up objective: propose, enqueue, ask, plan, tell."""
    proposer = Proposer(spec, study)  # a new one per call: a resumed or extended study
    for _ in range(n):
        trial = proposer.ask()
        if trial is None:
            return
        plan_trial(trial, spec)
        bits = trial.params.get("rtn.bits", 16)
        study.tell(trial, [1.0 / bits + trial.params.get("magnitude.sparsity", 0.0), float(bits)])


@pytest.mark.parametrize("sampler", ["random", "tpe", "nsga2"])
def test_a_resumed_study_does_not_replay_its_first_points(sampler):
    spec = parse_spec(broken("search", {"sampler": sampler, "trials": 8, "seed": 0}))
    study = optuna.create_study(directions=["minimize", "minimize"])
    drive(study, spec, 4)
    drive(study, spec, 4)
    keys = [params_key(t.params) for t in study.trials]
    assert len(keys) == 8 and len(set(keys)) == 8


@pytest.mark.parametrize("sampler", ["random", "tpe", "nsga2"])
def test_a_discrete_space_gets_no_duplicate_until_it_is_exhausted(sampler):
    spec = parse_spec({**broken("stages", DISCRETE), "search": {"sampler": sampler, "trials": 14, "seed": 0}})
    assert space_size(spec) == 9
    study = optuna.create_study(directions=["minimize", "minimize"])
    drive(study, spec, 14)
    keys = [params_key(t.params) for t in study.trials]
    assert len(keys) == 9 and len(set(keys)) == 9  # every point once, then the proposer stops


def test_nsga2_population_leaves_room_for_generations():
    spec = parse_spec(broken("search", {"sampler": "nsga2", "trials": 14}))
    assert make_sampler(spec)._population_size == 7
    study = optuna.create_study(directions=["minimize", "minimize"])
    drive(study, spec, 14)  # the generation NSGA-II gives a trial reaches the study, so it breeds a second one
    assert [t.system_attrs.get("NSGAIISampler:generation") for t in study.trials] == [0] * 7 + [1] * 7


def test_a_grid_is_handed_out_in_order_and_its_size_is_the_trial_count():
    raw = {**broken("stages", DISCRETE), "search": {"sampler": "grid", "trials": 12, "seed": 0}}
    spec = parse_spec(raw)
    from paretolab.study.search import grid_points

    points = grid_points(spec)
    said: list[str] = []
    assert planned_trials(spec, None, said.append) == (points, 9)
    assert "search.trials is 12 but the grid has 9 points" in said[0]
    with pytest.raises(ConfigError, match="--trials 20: a grid study runs each of its 9 points once"):
        planned_trials(spec, 20, said.append)
    study = optuna.create_study(directions=["minimize", "minimize"])
    proposer = Proposer(spec, study, points)
    got = []
    while (p := proposer.next()) is not None:
        got.append(p)
    assert got == points


def test_a_large_grid_is_not_written_up_front(tmp_path):
    # 300 x 300 = 90k points: nothing is enqueued when the study is created (the old driver wrote one
    # WAITING trial per point, each after scanning all the others)
    raw = broken("stages", [{"method": "rtn", "params": {"bits": list(range(1, 301)), "group_size": list(range(1, 301))}}])  # bits 0 is refused
    spec = parse_spec({**raw, "search": {"sampler": "grid", "trials": 90_000}})
    from paretolab.study.optuna_study import open_study

    study = open_study(spec, resolve_stores(home=str(tmp_path)), resume=False, trials=None)
    assert study.trials == []


def test_an_invalid_grid_fails_before_the_study_is_created(tmp_path):
    spec = parse_spec(broken("search.sampler", "grid"))  # magnitude.sparsity is a continuous range
    with pytest.raises(ConfigError, match="continuous range"):
        run_study(spec, stores=resolve_stores(home=str(tmp_path / "home")), log=lambda *a: None)
    assert not (tmp_path / "home" / "optuna.db").exists()
