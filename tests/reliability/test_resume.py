"""A resumed study runs exactly the trials an uninterrupted one would: a point enqueued twice runs twice."""

from __future__ import annotations

import optuna
import yaml
from optuna.distributions import CategoricalDistribution
from optuna.trial import create_trial

from paretolab.study.proposer import ENQUEUED, Proposer
from paretolab.study.spec import parse_spec
from tests.reliability.conftest import TINY

BITS = {"rtn.bits": CategoricalDistribution([4, 8])}


def spec_with(enqueue):
    raw = yaml.safe_load(TINY)
    raw["search"]["enqueue"] = enqueue
    raw["search"]["trials"] = 4
    return parse_spec(raw)


def first_of(spec):
    return [(f"search.enqueue[{i}]", p) for i, p in enumerate(spec.search.enqueue)]


def study_with(*trials):
    study = optuna.create_study(directions=["minimize", "minimize"])
    for bits, label in trials:
        study.add_trial(create_trial(params={"rtn.bits": bits}, distributions=BITS, values=[1.0, 1.0],
                                     user_attrs={ENQUEUED: label} if label else {}))
    return study


def test_a_repeated_enqueue_point_runs_again_after_a_resume():
    spec = spec_with([{"rtn.bits": 4}, {"rtn.bits": 4}])
    assert [label for label, _ in Proposer(spec, study_with(), None, first_of(spec)).first] == ["search.enqueue[0]", "search.enqueue[1]"]
    resumed = Proposer(spec, study_with((4, "search.enqueue[0]")), None, first_of(spec))
    assert [label for label, _ in resumed.first] == ["search.enqueue[1]"]


def test_every_enqueued_point_that_ran_is_not_run_again():
    spec = spec_with([{"rtn.bits": 4}, {"rtn.bits": 8}])
    assert Proposer(spec, study_with((4, "search.enqueue[0]"), (8, "search.enqueue[1]")), None, first_of(spec)).first == []


def test_a_copied_unlabelled_trial_still_stands_for_one_entry():
    spec = spec_with([{"rtn.bits": 4}, {"rtn.bits": 4}])
    assert [label for label, _ in Proposer(spec, study_with((4, None)), None, first_of(spec)).first] == ["search.enqueue[1]"]
