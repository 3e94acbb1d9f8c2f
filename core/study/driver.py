"""The study driver: asks Optuna, runs trials on Ray workers, records them in Optuna and MLflow.

The driver is the only writer of both stores. A trial is logged to MLflow first and told to
Optuna second; on ``--resume`` a trial that Optuna still calls RUNNING is either told from its
finished MLflow run or run again, so every trial ends up recorded exactly once in each store.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from typing import Any

import optuna

from paretolab.cluster.ray_init import init_ray, ray_auth_env
from paretolab.cluster.reach import require_reachable
from paretolab.errors import ParetolabError, first_line
from paretolab.models.lookup import model_is_cached
from paretolab.plugin_api.manager import plugin_manager, registries
from paretolab.records import StagePlan, TrialInfo, TrialResult, TrialSettings
from paretolab.stores.locations import Stores
from paretolab.stores.open import guarded
from paretolab.stores.ownership import own_study
from paretolab.stores.tracking import Tracker
from paretolab.study.optuna_study import (
    ATTEMPTS,
    count_in_state,
    finished_count,
    open_study,
    requeue_failed,
    stale_trials,
)
from paretolab.study.interrupt import INTERRUPTED, StopSignal, requeue_interrupted
from paretolab.study.pool import WorkerPool
from paretolab.study.reasons import readable_reason
from paretolab.study.recording import call_hook, record_trial, study_tags, trial_tags
from paretolab.study.confirm import search_split
from paretolab.study.constraints import missing_references, reference_arms
from paretolab.study.proposer import ENQUEUED, Proposer
from paretolab.study.pruning import start_board
from paretolab.study.preflight import planned_trials
from paretolab.study.search import plan_trial
from paretolab.study.session import session_ended, session_started
from paretolab.study.spec import StudySpec
from paretolab.study.trial import STOPPED
from paretolab.study.warm import copied_count, copy_from, open_source


@dataclass
class StudyOutcome:
    """What a finished (or interrupted) run of the driver did."""

    study: str
    planned: int
    completed: int = 0
    failed: int = 0
    retried: int = 0
    pruned: int = 0
    wall_s: float = 0.0
    overhead_s: list[float] = field(default_factory=list)
    interrupted: bool = False
    stopped_by: str = ""  # the signal that stopped it ("SIGINT", "SIGTERM"), "" when it ran to its end


@dataclass
class _Job:
    trial: optuna.Trial
    plan: list[StagePlan]
    worker: Any
    started: float
    attempt: int = 1


def run_study(
    spec: StudySpec,
    *,
    stores: Stores,
    address: str | None = None,
    resume: bool = False,
    trials: int | None = None,
    retry_failed: bool = False,
    from_study: str | None = None,
    progress: bool = True,
    log: Any = print,
    pipeline: str | None = None,
) -> StudyOutcome:
    """Run ``spec`` until the study holds ``trials`` finished trials (complete or failed).

    Everything that can be refused is refused before a store is written: the grid, ``--address``,
    and a study another live driver owns (StudyOwnedError naming it). This driver then owns the
    study until it returns or dies, so a RUNNING trial it finds was left by a driver that is gone.
    ``retry_failed`` queues the parameters of failed trials again (those no complete trial has),
    as new trials on top of the target; the failed ones stay in the history. ``from_study`` copies
    another study's finished trials in first (see :mod:`paretolab.study.warm`); they never run again
    and do not count against the target. ``pipeline``: the file it came from, kept with the study so
    `paretolab studies` can say how to resume it.

    A first Ctrl-C stops proposing trials and lets the running ones finish; a second one (or SIGTERM)
    cancels them, recorded as failed with the reason (see :mod:`paretolab.study.interrupt`).
    """
    points, _ = planned_trials(spec, trials, log)
    if address:
        require_reachable("--address", address)
    source = open_source(from_study, spec, stores) if from_study else None
    lock = guarded("Optuna", stores.optuna_url, lambda: own_study(stores.optuna_url, spec.name))
    try:
        return _drive(spec, stores=stores, address=address, resume=resume, trials=trials, retry_failed=retry_failed,
                      source=source, progress=progress, log=log, points=points, pipeline=pipeline)
    finally:
        lock.release()


def _drive(
    spec: StudySpec,
    *,
    stores: Stores,
    address: str | None = None,
    resume: bool = False,
    trials: int | None = None,
    retry_failed: bool = False,
    source: optuna.Study | None = None,
    progress: bool = True,
    log: Any = print,
    points: list[dict[str, Any]] | None = None,
    pipeline: str | None = None,
) -> StudyOutcome:
    """The driver loop of run_study, under the study's lock."""
    ray_auth_env(address)
    import ray

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    target = len(points) if points is not None else trials or spec.search.trials
    study = open_study(spec, stores, resume, trials)
    outcome = StudyOutcome(study=spec.name, planned=target)
    tracker = Tracker(stores, spec.name)
    parent = tracker.study_run(study_tags(spec), {"pipeline": spec.raw})
    if source is not None:
        copy_from(source, spec, study, tracker, parent, log)
    if points is None:  # copied trials come on top of the study's own (a grid's copied points are simply not run again)
        target += copied_count(study)
        outcome.planned = target
    first = [*reference_arms(spec.constraints), *((f"search.enqueue[{i}]", p) for i, p in enumerate(spec.search.enqueue))]
    proposer = Proposer(spec, study, points, first)
    regs = registries()
    hooks = plugin_manager().hook

    redo = stale_trials(study, tracker, spec, log)
    cancelled, again = requeue_interrupted(study)
    planned = target
    target += cancelled  # a trial cancelled by a signal is no result: its parameters run again, on top of the target
    outcome.planned = target
    if again:
        log(f"running the parameters of {again} trial(s) cancelled by a signal again")
    done = finished_count(study)
    if retry_failed:
        again = requeue_failed(study)
        if again:
            target = max(target, done) + again
            outcome.planned = target
            log(f"retrying the parameters of {again} failed trial(s)")
    waiting = count_in_state(study, optuna.trial.TrialState.WAITING)  # asked-for repeats (--retry-failed) go first
    if proposer.exhausted and not waiting and done < target:
        log(f"every one of the {proposer.size} distinct parameter sets of the search space has run; nothing new to try")
        target = done
    if done >= target and not redo:
        log(f"study {spec.name!r} already has {done} finished trials (target {target}); nothing to do")
        return outcome

    stop = StopSignal()  # before Ray starts: a Ctrl-C while the workers load the model stops at once
    pool: WorkerPool | None = None
    board = None
    in_flight: dict[Any, _Job] = {}
    bar = _progress(False, target, done, spec.name)
    start = time.perf_counter()
    session_started(study, pipeline, planned)
    try:
        init_ray(address)
        stop.install()  # ray.init replaced our SIGTERM handler with one that exits on the spot
        settings = TrialSettings(spec.name, spec.task, spec.task_options, spec.measures, spec.search.seed, cpus=spec.resources.cpus,
                                 timeout_s=spec.search.trial_timeout_s, models=dict(spec.models), prices=dict(spec.prices),
                                 split=search_split(spec.confirm))
        pool = WorkerPool(spec.model, settings, spec.resources)
        n_workers = pool.size_for(target - done)
        shown = stores.redacted()
        log(f"study {spec.name!r}: {done}/{target} trials finished; starting {n_workers} worker(s) with model {spec.model!r} "
            f"(Optuna {shown.optuna_url}, MLflow {shown.tracking_uri})")
        if not address and not model_is_cached(spec.model):
            log(f"the first run converts model {spec.model!r} into the cache once (about 20 s here); later runs load it from there")
        pool.start(n_workers)
        tags = trial_tags(spec, regs)
        board = start_board(spec.search.pruner, study)
        bar = _progress(progress, target, done, spec.name)
        start = time.perf_counter()
        stop.running = True  # from here a Ctrl-C lets the running trials finish, a second one cancels them

        def record(job: _Job, result: TrialResult, now: float) -> None:
            nonlocal done
            done += record_trial(study, tracker, parent, spec, job, result, tags, now, outcome, hooks, board)
            bar.update(1)
            if result.info.get(STOPPED):
                log(f"trial {job.trial.number}: {result.info[STOPPED]}")

        while not stop.cancel:
            if stop.requested and not stop.announced:
                stop.announced = True
                log(f"\n{stop.requested}: no new trials; waiting for the {len(in_flight)} running trial(s) to finish "
                    "(Ctrl-C again cancels them)")
            for problem in pool.poll():
                log(problem)
            while not stop.requested and pool.idle and (redo or done + len(in_flight) < target):
                if redo:
                    trial, attempt = redo.pop(0)
                elif waiting:
                    trial, attempt, waiting = study.ask(), 1, waiting - 1
                else:
                    if _awaiting_references(spec, study, proposer, in_flight):
                        break  # a relative constraint's reference is still running: later trials are judged against it
                    proposed = proposer.ask()
                    if proposed is None:  # a discrete space with no untried point left
                        log(f"every one of the {proposer.size} distinct parameter sets has run; stopping at {done + len(in_flight)} trials")
                        target = done + len(in_flight)
                        break
                    trial, attempt = proposed, 1
                plan = plan_trial(trial, spec)  # for a redone trial Optuna returns the values it already holds
                problem = call_hook(hooks, "trial_started", trial=TrialInfo(spec.name, trial.number, plan, dict(trial.params)))
                if problem:  # a plugin's hook raised: this trial fails with its reason, the study goes on
                    record(_Job(trial, plan, None, time.perf_counter(), attempt), TrialResult(error=problem), time.perf_counter())
                    continue
                worker = pool.take()
                ref = worker.run.remote(plan, trial.number, board)
                in_flight[ref] = _Job(trial, plan, worker, time.perf_counter(), attempt)
            if not in_flight and (stop.requested or not (pool.starting and (redo or done < target))):
                break
            if not in_flight:  # every worker is still loading the model after a replacement
                time.sleep(0.5)
            ready, _ = ray.wait(list(in_flight), num_returns=1, timeout=0.5) if in_flight else ([], None)
            now = time.perf_counter()
            for ref in ready:
                job = in_flight.pop(ref)
                try:
                    result = ray.get(ref)
                    pool.give_back(job.worker)
                except ray.exceptions.RayActorError as exc:
                    pool.lost(job.worker)
                    if job.attempt < 2 and not stop.requested:
                        log(f"trial {job.trial.number}: worker died ({first_line(exc)}); retrying once")
                        job.trial.set_user_attr(ATTEMPTS, job.attempt + 1)
                        redo.append((job.trial, job.attempt + 1))
                        outcome.retried += 1
                        continue
                    result = TrialResult(error=f"worker process died twice: {first_line(exc)}" if job.attempt >= 2 else
                                         f"worker process died while the driver was stopping: {first_line(exc)}")
                except ray.exceptions.RayError as exc:
                    pool.give_back(job.worker)
                    result = TrialResult(error=readable_reason(exc))  # the worker's own exception, without Ray's colour codes
                record(job, result, now)
            for ref, job in list(in_flight.items()):
                if now - job.started > spec.search.trial_timeout_s:
                    in_flight.pop(ref)
                    pool.lost(job.worker)
                    record(job, TrialResult(error=f"timed out after {spec.search.trial_timeout_s:g} s (search.trial_timeout_s)"), now)
        if stop.cancel and in_flight:
            log(f"{stop.cancelled_by}: cancelling the {len(in_flight)} running trial(s); they are recorded as failed")
            pool.shutdown()  # end the trials first, so no worker keeps computing while the stores are written
            now = time.perf_counter()
            for job in in_flight.values():
                job.trial.set_user_attr(INTERRUPTED, stop.cancelled_by)
                record(job, TrialResult(error=stop.reason()), now)
            in_flight.clear()
    except KeyboardInterrupt:
        stop.requested = stop.requested or "SIGINT"
        log(f"\n{stop.requested}: stopped at once; {len(in_flight)} running trial(s) are left unfinished (`--resume` runs them again)")
    finally:
        stop.restore()
        bar.close()
        if pool is not None:
            pool.shutdown()
        if board is not None:
            ray.kill(board)
        _end_session(study, stop.requested, sys.exc_info()[1], planned)
    outcome.wall_s = time.perf_counter() - start
    outcome.interrupted = bool(stop.requested)
    outcome.stopped_by = stop.requested
    if not outcome.interrupted:
        tracker.finish_study(parent, {"trials_complete": float(count_in_state(study, optuna.trial.TrialState.COMPLETE)), "trials_failed": float(count_in_state(study, optuna.trial.TrialState.FAIL))})
    return outcome


def _end_session(study: optuna.Study, signame: str, error: BaseException | None, target: int) -> None:
    """Keep how the session ended with the study; never mask the error that ended it."""
    try:
        session_ended(study, signame or None, target, error=first_line(error) if error is not None else None)
    except Exception:  # noqa: BLE001 - a store that fails here already failed the run; that error is the one to show
        if error is None:
            raise


def _awaiting_references(spec: StudySpec, study: optuna.Study, proposer: Proposer, in_flight: dict[Any, _Job]) -> bool:
    """Whether to wait for a reference arm's trial; an error once none of its trials can complete any more."""
    if not spec.constraints or proposer.first:
        return False
    missing = missing_references(spec.constraints, study)
    if not missing:
        return False
    if in_flight:
        return True
    failed = [f"trial {t.number}: {t.user_attrs.get('fail_reason', t.state.name.lower())}" for t in study.get_trials(deepcopy=False)
              if t.user_attrs.get(ENQUEUED, "") in missing]
    raise ParetolabError(f"{missing[0]} did not complete ({'; '.join(failed) or 'it never ran'}), so no trial can be judged against it; "
                         "fix its failure and run again with --resume, or drop the relative bound from constraints:")


def _progress(enabled: bool, total: int, initial: int, name: str) -> Any:
    from tqdm import tqdm

    return tqdm(total=total, initial=initial, desc=name, unit="trial", disable=not enabled, file=sys.stderr, dynamic_ncols=True)
