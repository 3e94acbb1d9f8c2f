"""The study as Optuna holds it: opened or created (refusing a different pipeline), and the bookkeeping of a resume.

Every trial is enqueued by the Proposer, so the study's own sampler is never asked. On ``--resume``
a trial a dead driver left RUNNING is told from its MLflow run when that run finished, marked
failed when it failed, or queued again.
"""

from __future__ import annotations

from typing import Any

import optuna

from paretolab.errors import ConfigError
from paretolab.stores.locations import Stores
from paretolab.stores.open import guarded, optuna_storage
from paretolab.study.attrs import QUALITY_NOTE
from paretolab.study.constraints import STUDY_ATTR, keep_verdict, trial_verdict, verdict_tags
from paretolab.study.proposer import held_params, params_key
from paretolab.study.spec import StudySpec

FAIL_REASON = "fail_reason"


MLFLOW_RUN = "mlflow_run_id"


ATTEMPTS = "attempts"


PRUNED_AT = "pruned_at_step"  # user attr of a pruned trial: the step its pruner stopped it at


def open_study(spec: StudySpec, stores: Stores, resume: bool, trials: int | None = None) -> optuna.Study:
    storage = optuna_storage(stores, create=True)
    directions = [o.direction for o in spec.objectives]
    sampler = optuna.samplers.RandomSampler()  # never asked: every trial is enqueued by the Proposer
    try:
        study = guarded("Optuna", stores.optuna_url, lambda: optuna.load_study(study_name=spec.name, storage=storage, sampler=sampler))
    except KeyError:
        refuse_twin(spec.name, storage, stores)
        study = optuna.create_study(study_name=spec.name, storage=storage, sampler=sampler, directions=directions)
        study.set_user_attr("pipeline_hash", spec.pipeline_hash())
        study.set_user_attr("objectives", [[o.metric, o.direction] for o in spec.objectives])
        study.set_user_attr("model", spec.model)
        from paretolab.models import quality_note

        study.set_user_attr(QUALITY_NOTE, quality_note(spec.model, spec.raw))
        study.set_user_attr("methods", spec.methods())
        study.set_user_attr("pipeline", spec.raw)
        study.set_user_attr(STUDY_ATTR, [c.describe() for c in spec.constraints])
        return study
    check_same_pipeline(spec, study, stores)
    if not resume and study.trials:
        finished = finished_count(study)
        if trials is None:
            raise ConfigError(
                f"study {spec.name!r} already has {len(study.trials)} trial(s) in {stores.redacted().optuna_url}; "
                f"pass --resume to continue it, --trials N (N > {finished}) to extend it, or give the pipeline a new `name`"
            )
        if trials <= finished:
            raise ConfigError(
                f"--trials {trials}: study {spec.name!r} already holds {finished} finished trial(s); "
                f"give a larger N to extend it (--trials is the total, e.g. --trials {finished + spec.search.trials})"
            )
    if study.user_attrs.get("pipeline") != spec.raw:  # the same hash: only the description, claim, resources or budget changed
        study.set_user_attr("pipeline", spec.raw)  # the report reads the claim and description from here
    return study


def refuse_twin(name: str, storage: Any, stores: Stores) -> None:
    """Refuse to create study ``name`` beside a study whose name is the same under Unicode normalisation (``ｄｅｍｏ``
    for ``demo``, from an old bundle or Optuna's own API): two studies a reader cannot tell apart (`run` and `check`)."""
    from paretolab.data.names import twin_of

    names = [s.study_name for s in guarded("Optuna", stores.optuna_url, lambda: optuna.get_all_study_summaries(storage, include_best_trial=False))]
    twin = twin_of(name, names)
    if twin is not None:
        raise ConfigError(f"study {name!r}: {stores.redacted().optuna_url} already holds study {twin!r}, the same name under Unicode "
                          f"normalisation (NFKC); resume that one under its own name, or remove it (`paretolab studies delete NAME`)")


def check_same_pipeline(spec: StudySpec, study: optuna.Study, stores: Stores) -> None:
    """Refuse a study of this name that a different pipeline started (`run` and `check` alike)."""
    stored = study.user_attrs.get("pipeline_hash")
    if not spec.matches_hash(stored):
        raise ConfigError(
            f"study {spec.name!r} in {stores.redacted().optuna_url} was started from a different pipeline "
            f"(hash {stored} != {spec.pipeline_hash()}); give the changed pipeline a new `name`, or remove the old study "
            f"(`paretolab studies delete {spec.name}`: an updated paretolab's demo, say) and run it again"
        )


def stale_trials(study: optuna.Study, tracker: Any, spec: StudySpec, log: Any) -> list[tuple[optuna.Trial, int]]:
    """Trials a dead driver left RUNNING: told from MLflow when it logged them, else queued again."""
    redo = []
    for frozen in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
        trial = optuna.Trial(study, frozen._trial_id)
        finished = tracker.finished_trial(frozen.number)
        if finished is not None:
            run_id, metrics = finished
            trial.set_user_attr(MLFLOW_RUN, run_id)
            verdict, bounds = trial_verdict(spec.constraints, study, frozen.number, frozen.params, metrics)
            tracker.set_tags(run_id, verdict_tags(verdict))
            keep_verdict(trial, verdict, bounds)
            study.tell(trial, [metrics[o.metric] for o in spec.objectives])
            log(f"trial {frozen.number}: recovered from its MLflow run")
            continue
        reason = tracker.failed_trial(frozen.number)
        if reason is not None:
            trial.set_user_attr(FAIL_REASON, reason)
            study.tell(trial, state=optuna.trial.TrialState.FAIL)
            continue
        pruned = tracker.pruned_trial(frozen.number)
        if pruned is not None:
            run_id, step = pruned
            trial.set_user_attr(MLFLOW_RUN, run_id)
            trial.set_user_attr(PRUNED_AT, step)
            study.tell(trial, state=optuna.trial.TrialState.PRUNED)
            log(f"trial {frozen.number}: recovered as pruned (at step {step}) from its MLflow run")
            continue
        attempt = int(frozen.user_attrs.get(ATTEMPTS, 1))
        redo.append((trial, attempt))
    if redo:
        log(f"resuming {len(redo)} unfinished trial(s): {', '.join(str(t.number) for t, _ in redo)}")
    return redo


def requeue_failed(study: optuna.Study) -> int:
    """Enqueue the params of each failed trial that no complete or waiting trial has; how many."""
    trials = study.get_trials(deepcopy=False)
    seen = {params_key(held_params(t)) for t in trials if t.state in (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.WAITING)}
    count = 0
    for t in trials:
        if t.state == optuna.trial.TrialState.FAIL and t.params and params_key(t.params) not in seen:
            study.enqueue_trial(dict(t.params))
            seen.add(params_key(t.params))
            count += 1
    return count


def finished_count(study: optuna.Study) -> int:
    states = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.FAIL, optuna.trial.TrialState.PRUNED)
    return len(study.get_trials(deepcopy=False, states=states))


def count_in_state(study: optuna.Study, state: optuna.trial.TrialState) -> int:
    return len(study.get_trials(deepcopy=False, states=(state,)))
