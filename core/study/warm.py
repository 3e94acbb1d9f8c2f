"""``paretolab run --from-study OTHER``: start a study from another study's finished trials.

The other study must search the same space (every copied parameter has the same distribution
here), on the same model and task, towards the same objectives: otherwise its numbers mean
something else and copying them would mislead the sampler and the frontier. Its complete and
pruned trials are copied into both stores as they are (values, parameters, reports, MLflow
metrics, curves and tags), each labelled ``copied_from = "OTHER#n"`` in Optuna and
``paretolab.copied_from`` in MLflow, and judged against this study's own ``constraints:``.
They are never run again, they are not counted against ``search.trials`` (the study runs that
many trials of its own on top), and a second ``--from-study`` of the same study copies nothing twice.
"""

from __future__ import annotations

from typing import Any

import optuna

from paretolab.errors import ConfigError
from paretolab.stores.locations import Stores
from paretolab.stores.open import exists, guarded, optuna_storage
from paretolab.study.arms import in_arm
from paretolab.study.constraints import keep_verdict, reference_arms, trial_verdict, verdict_tags
from paretolab.study.optuna_study import MLFLOW_RUN
from paretolab.study.spec import StudySpec

COPIED = "copied_from"  # user attr of a copied trial: "<study>#<its number there>"
STATES = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED)  # the trials that are copied


def copied_count(study: optuna.Study) -> int:
    return sum(1 for t in study.get_trials(deepcopy=False) if COPIED in t.user_attrs)


def open_source(source: str, spec: StudySpec, stores: Stores) -> optuna.Study:
    """Study ``source``, checked before anything is written: same model, task, objectives and search space."""
    if source == spec.name:
        raise ConfigError(f"--from-study {source}: that is this study; --resume continues it")
    other = _load(source, stores)
    _check_same_study(source, other, spec)
    for t in other.get_trials(deepcopy=False, states=STATES):
        _check_space(source, t, spec)
    return other


def copy_from(other: optuna.Study, spec: StudySpec, study: optuna.Study, tracker: Any, parent: str, log: Any = print) -> int:
    """Copy ``other``'s complete and pruned trials into ``study`` (and its MLflow experiment); how many were new."""
    source = other.study_name
    have = {t.user_attrs[COPIED] for t in study.get_trials(deepcopy=False) if COPIED in t.user_attrs}
    copied = 0
    arms = [arm for _, arm in reference_arms(spec.constraints)]  # a relative bound's reference is copied first: the rest are judged against it
    for t in sorted(other.get_trials(deepcopy=False, states=STATES), key=lambda t: (not any(in_arm(t.params, a) for a in arms), t.number)):
        label = f"{source}#{t.number}"
        if label in have:
            continue
        number = len(study.get_trials(deepcopy=False))  # this driver owns the study: no one else adds a trial meanwhile
        run_id, metrics = tracker.copy_trial(t.user_attrs.get(MLFLOW_RUN, ""), parent, number, {"paretolab.copied_from": label})
        user = {**t.user_attrs, COPIED: label, MLFLOW_RUN: run_id}
        verdict: dict[str, Any] = {}
        bounds: dict[str, float] = {}
        if t.state == optuna.trial.TrialState.COMPLETE:
            verdict, bounds = trial_verdict(spec.constraints, study, number, t.params, {**metrics, **_objective_values(spec, t)})
            tracker.set_tags(run_id, verdict_tags(verdict))
        copy = optuna.trial.create_trial(
            state=t.state, values=t.values if t.state == optuna.trial.TrialState.COMPLETE else None, params=t.params,
            distributions=t.distributions, user_attrs=user, intermediate_values=t.intermediate_values)
        keep_verdict(copy, verdict, bounds)
        study.add_trial(copy)
        copied += 1
    log(f"copied {copied} trial(s) from study {source!r}" + (f" ({len(have)} copied before)" if have else ""))
    return copied


def _load(source: str, stores: Stores) -> optuna.Study:
    if not exists(stores.optuna_url):
        raise ConfigError(f"--from-study {source}: no study has run with these stores yet; check --home / --storage")
    storage = optuna_storage(stores, create=False)
    try:
        return guarded("Optuna", stores.optuna_url, lambda: optuna.load_study(study_name=source, storage=storage))
    except KeyError:
        names = [s.study_name for s in optuna.get_all_study_summaries(storage)]
        raise ConfigError(f"--from-study {source}: no such study in {stores.redacted().optuna_url} (studies: {', '.join(names) or 'none'})") from None


def _check_same_study(source: str, other: optuna.Study, spec: StudySpec) -> None:
    """The same model, task and objectives; else the copied numbers would mean something else here."""
    raw = other.user_attrs.get("pipeline") or {}
    ours = [[o.metric, o.direction] for o in spec.objectives]
    for what, theirs, mine in (("model", other.user_attrs.get("model"), spec.model),
                               ("task", raw.get("task"), spec.raw.get("task")),
                               ("objectives", other.user_attrs.get("objectives"), ours)):
        if theirs != mine:
            raise ConfigError(f"--from-study {source}: its {what} is {theirs!r}, this pipeline's is {mine!r}; "
                              "trials are copied only between studies of the same model, task and objectives")


def _check_space(source: str, trial: optuna.trial.FrozenTrial, spec: StudySpec) -> None:
    from paretolab.plugin_api.manager import registries
    from paretolab.study.arms import searched

    space = searched(spec.stages, registries())
    for name, dist in trial.distributions.items():
        mine = space.get(name)
        if mine is None or mine[2] != dist:
            here = "not searched here" if mine is None else f"searched here as {mine[2]}"
            raise ConfigError(f"--from-study {source}: trial {trial.number}'s {name} is {dist}, {here}; "
                              "copy only from a study with the same search space")


def _objective_values(spec: StudySpec, trial: optuna.trial.FrozenTrial) -> dict[str, float]:
    return {o.metric: v for o, v in zip(spec.objectives, trial.values or [])}
