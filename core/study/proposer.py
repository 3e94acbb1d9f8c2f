"""Which parameters the next trial gets: grid points in order, else the sampler's pick without repeats.

The driver enqueues what ``Proposer.next`` returns and asks Optuna for it, so the study records
exactly the proposed set. The sampler proposes on an in-memory mirror of the study's trials,
made with a sampler seeded by the new trial's number: a resumed or extended study continues
its sequence instead of replaying it. A set that an earlier trial had is drawn again (up to
``RETRIES`` times); in a discrete space it is then replaced by an untried point, and once every
point has run the study stops there.

``first``: labelled partial points that go before any proposal (the reference arms of relative
``constraints:``, then ``search.enqueue``); the sampler fills in the parameters a point leaves
open, each trial keeps its label as the user attr ``enqueued_as``, and a point some earlier trial
already holds (a resumed study) is not run again.
"""

from __future__ import annotations

import copy
import random
from typing import Any

import optuna

from paretolab.study.arms import in_arm
from paretolab.study.search import (
    grid_points,
    make_sampler,
    plan_trial,
    space_size,
    trial_seed,
)
from paretolab.study.spec import StudySpec

RETRIES = 20
ENQUEUED = "enqueued_as"  # user attr: why a trial ran first (its search.enqueue entry, or the constraint it is the reference of)
ENUMERABLE = 200_000  # a discrete space up to this size may be listed to find an untried point


def params_key(params: dict[str, Any]) -> tuple:
    """A hashable identity of a parameter set."""
    # floats rounded: a stepped value Optuna computes (0.30000000000000004) is the grid's 0.3
    return tuple(sorted((k, repr(round(v, 10) if isinstance(v, float) else v)) for k, v in params.items()))


def held_params(trial: optuna.trial.FrozenTrial) -> dict[str, Any]:
    """A trial's parameters; for one still queued (WAITING), the parameters it was enqueued with."""
    if trial.state == optuna.trial.TrialState.WAITING:
        fixed = trial.system_attrs.get("fixed_params")
        return dict(fixed) if fixed is not None else {}
    return trial.params


class Proposer:
    """Proposes the parameters of each new trial of one study (the driver that owns it calls this)."""

    def __init__(self, spec: StudySpec, study: optuna.Study, points: list[dict[str, Any]] | None = None,
                 first: list[tuple[str, dict[str, Any]]] | None = None) -> None:
        self.spec = spec
        self.study = study
        self.points = points
        self.size = len(points) if points is not None else space_size(spec)
        self._next_point = 0
        self._attrs: dict[str, Any] = {}
        self.seen: set[tuple] = set()
        for t in study.get_trials(deepcopy=False):
            self.seen.add(params_key(held_params(t)))
        self.first = self._still_to_run(first or [])
        self._label = ""

    @property
    def exhausted(self) -> bool:
        """Every distinct parameter set of a discrete space has been tried."""
        return self.size is not None and len(self.seen) >= self.size

    def _still_to_run(self, first: list[tuple[str, dict[str, Any]]]) -> list[tuple[str, dict[str, Any]]]:
        """The entries of ``first`` no trial has run yet, each matched to one trial of its own: the trial labelled with it,
        else an unlabelled one holding its values (a copied trial). A point listed twice runs twice, resumed or not."""
        trials = [t for t in self.study.get_trials(deepcopy=False) if t.state != optuna.trial.TrialState.FAIL]
        used: set[int] = set()
        left = []
        for label, partial in first:
            match = next((t for t in trials if t.number not in used and t.user_attrs.get(ENQUEUED) == label), None) or next(
                (t for t in trials if t.number not in used and not t.user_attrs.get(ENQUEUED) and in_arm(held_params(t), partial)), None)
            if match is None:
                left.append((label, partial))
            else:
                used.add(match.number)
        return left

    def ask(self) -> optuna.Trial | None:
        """Enqueue the next proposal and ask the study for it; None when nothing untried is left."""
        params = self.next()
        if params is None:
            return None
        self.study.enqueue_trial(params)
        trial = self.study.ask()
        for key, value in self._attrs.items():  # the sampler's own bookkeeping, e.g. NSGA-II's generation
            self.study._storage.set_trial_system_attr(trial._trial_id, key, value)
        if self._label:
            trial.set_user_attr(ENQUEUED, self._label)
            self._label = ""
        return trial

    def next(self) -> dict[str, Any] | None:
        """Parameters for the next trial, or None when every point of a discrete space has run."""
        if self.first:
            self._label, partial = self.first.pop(0)
            params = self._fill(partial, len(self.study.get_trials(deepcopy=False)))
            self.seen.add(params_key(params))
            return params
        if self.points is not None:
            return self._next_grid_point()
        if self.exhausted:
            return None
        number = len(self.study.get_trials(deepcopy=False))
        params = self._sample(number)
        self.seen.add(params_key(params))
        return params

    def _next_grid_point(self) -> dict[str, Any] | None:
        assert self.points is not None
        while self._next_point < len(self.points):  # one pass over the grid in all: linear however large it is
            point = self.points[self._next_point]
            self._next_point += 1
            key = params_key(point)
            if key not in self.seen:
                self.seen.add(key)
                return point
        return None

    def _mirror(self, number: int) -> optuna.Study:
        """An in-memory copy of the study's trials with a sampler seeded by ``number``: where proposals are drawn."""
        mirror = optuna.create_study(directions=self.study.directions, sampler=make_sampler(self.spec, number))
        mirror.add_trials([_as_sampled(t, len(self.study.directions)) for t in self.study.get_trials(deepcopy=False)
                           if t.state != optuna.trial.TrialState.WAITING])
        return mirror

    def _fill(self, partial: dict[str, Any], number: int) -> dict[str, Any]:
        """A whole parameter set with ``partial``'s values: the grid's first point that has them, else the sampler's pick."""
        if self.points is not None:
            matching = [p for p in self.points if in_arm(p, partial)]
            if not matching:
                raise ValueError(f"no point of the grid has {partial}")
            return next((p for p in matching if params_key(p) not in self.seen), matching[0])
        mirror = self._mirror(number)
        mirror.enqueue_trial(partial, skip_if_exists=False)
        trial = mirror.ask()
        plan_trial(trial, self.spec)
        self._attrs = {}
        return dict(trial.params)

    def _sample(self, number: int) -> dict[str, Any]:
        mirror = self._mirror(number)
        params: dict[str, Any] = {}
        for attempt in range(2 * RETRIES):
            if attempt == RETRIES:  # the sampler keeps exploiting one point: explore at random instead
                mirror.sampler = optuna.samplers.RandomSampler(seed=trial_seed(self.spec.search.seed, number))
            trial = mirror.ask()
            plan_trial(trial, self.spec)
            params = dict(trial.params)
            if params_key(params) not in self.seen:  # also in a mixed space: a categorical branch repeats easily
                attrs = mirror._storage.get_trial(trial._trial_id).system_attrs
                self._attrs = {k: v for k, v in attrs.items() if k != "fixed_params"}
                return params
            mirror.tell(trial, state=optuna.trial.TrialState.FAIL)  # the mirror only: the sampler moves on
        self._attrs = {}
        return self._untried(number) or params

    def _untried(self, number: int) -> dict[str, Any] | None:
        """A random point of the discrete space that no trial had (None if the space is too large to list)."""
        if self.size is None or self.size > ENUMERABLE:
            return None
        left = [p for p in grid_points(self.spec) if params_key(p) not in self.seen]
        return random.Random(trial_seed(self.spec.search.seed, number)).choice(left) if left else None


def _as_sampled(trial: optuna.trial.FrozenTrial, objectives: int) -> optuna.trial.FrozenTrial:
    """A trial as the sampler may see it: a pruned trial of a multi-objective study loses its reports.

    TPE ranks pruned trials by their last report with ``study.direction``, which a study with several
    objectives does not have; without reports every pruned trial counts among the bad ones.
    """
    if objectives == 1 or trial.state != optuna.trial.TrialState.PRUNED or not trial.intermediate_values:
        return trial
    bare = copy.copy(trial)
    bare.intermediate_values = {}
    return bare
