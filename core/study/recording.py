"""How the driver records a finished trial: MLflow first, then Optuna, with the verdicts both stores keep."""

from __future__ import annotations

import math
from typing import Any

import optuna

from paretolab.records import StagePlan, TrialInfo, TrialResult
from paretolab.stores.open import guarded
from paretolab.study.optuna_study import FAIL_REASON, MLFLOW_RUN, PRUNED_AT

SIMULATED_BY = "simulated_by"  # user attr: the methods whose saving this trial only simulated ("" when every saving is real)
ENGINE = "engine"  # user attr: the engine measure's figures and labels (llama_*, vllm_*), as MLflow holds them too
from paretolab.study.constraints import keep_verdict, trial_verdict, verdict_tags
from paretolab.study.pruning import keep_reports
from paretolab.study.reasons import readable_reason
from paretolab.study.spec import StudySpec
from paretolab.version import code_version


def record_trial(study: optuna.Study, tracker: Any, parent: str, spec: StudySpec, job: Any, result: TrialResult, tags: dict[str, str],
                 now: float, outcome: Any, hooks: Any, board: Any = None) -> int:
    """Log one trial to MLflow, then tell Optuna (complete, failed or pruned). Returns 1 (one more finished trial).

    ``board``: the study's PruneBoard actor (with ``search.pruner``); the trial's reports are stored with it.
    """
    if not result.failed and not result.pruned:
        result.error = _objective_problem(spec, result.metrics)
    info = TrialInfo(spec.name, job.trial.number, job.plan, dict(job.trial.params))
    problem = call_hook(hooks, "trial_finished", trial=info, result=result)  # before the stores: a raising hook fails the trial
    if problem:
        result.error = f"{result.error}; and {problem}" if result.failed else problem
        result.pruned_at = None
    if board is not None and spec.search.pruner is not None:
        keep_reports(board, study, job.trial, result, spec.search.pruner.metric)
    inside = sum(result.metrics.get(k, 0.0) for k in ("transform_s", "evaluate_s", "measure_s"))
    wall = now - job.started
    if result.metrics:
        result.metrics["overhead_s"] = max(wall - inside, 0.0)
        outcome.overhead_s.append(result.metrics["overhead_s"])
    verdict, bounds = ({}, {}) if result.failed or result.pruned else trial_verdict(spec.constraints, study, job.trial.number, job.trial.params, result.metrics)
    params = {**_flat_params(job.plan), "trial.attempt": job.attempt}
    run_tags = {**tags, "paretolab.study.worker": result.worker, **verdict_tags(verdict)}
    run_id = guarded("MLflow", getattr(tracker, "uri", ""), lambda: tracker.log_trial(parent, job.trial.number, params, result, run_tags))
    storage = getattr(study, "_storage", None)
    url = str(getattr(storage, "url", "") or getattr(getattr(storage, "_backend", None), "url", "") or "")
    # a full disk or a broken store is one line (``guarded``); the trial is not COMPLETE in Optuna, so resume runs it again
    guarded("Optuna", url, lambda: _tell(study, job, result, spec, outcome, run_id, verdict, bounds))
    return 1


def call_hook(hooks: Any, name: str, **kwargs: Any) -> str:
    """Call every plugin's ``name`` hook; what raised, as one line naming each plugin and the hook ("" when none did).

    A plugin cannot take the study down: each implementation is called on its own (the others still run), and an
    exception (SystemExit included; a Ctrl-C is the driver's own) becomes the returned reason.
    """
    caller = getattr(hooks, name)
    impls = caller.get_hookimpls() if hasattr(caller, "get_hookimpls") else None
    if impls is None or any(getattr(i, "hookwrapper", False) or getattr(i, "wrapper", False) for i in impls):
        try:  # a stand-in for the plugin manager, or hook wrappers: called as pluggy calls them
            caller(**kwargs)
        except (Exception, SystemExit) as exc:  # noqa: BLE001 - any plugin's failure
            return f"a plugin's {name} hook raised {readable_reason(exc)}"
        return ""
    problems = []
    for impl in reversed(impls):  # pluggy's order: the last registered first
        try:
            impl.function(*[kwargs[arg] for arg in impl.argnames])
        except (Exception, SystemExit) as exc:  # noqa: BLE001 - any plugin's failure
            problems.append(f"plugin {impl.plugin_name!r}'s {name} hook raised {readable_reason(exc)}")
    return "; ".join(problems)


def _tell(study: optuna.Study, job: Any, result: TrialResult, spec: StudySpec, outcome: Any, run_id: str, verdict: Any, bounds: Any) -> None:
    job.trial.set_user_attr(MLFLOW_RUN, run_id)
    job.trial.set_user_attr(SIMULATED_BY, ",".join(result.simulated_by))  # this trial's label: real, or simulated by these methods
    keep_verdict(job.trial, verdict, bounds)
    from paretolab.study.trial import STOPPED  # here: results.read imports this module without torch

    if result.info.get(STOPPED):  # the child processes the trial left, stopped at its end
        job.trial.set_user_attr(STOPPED, str(result.info[STOPPED]))
    engine = engine_attrs(result.metrics, result.info)
    if engine:
        job.trial.set_user_attr(ENGINE, engine)
    if result.failed:
        job.trial.set_user_attr(FAIL_REASON, result.error)
        study.tell(job.trial, state=optuna.trial.TrialState.FAIL)
        outcome.failed += 1
    elif result.pruned:
        job.trial.set_user_attr(PRUNED_AT, result.pruned_at)
        study.tell(job.trial, state=optuna.trial.TrialState.PRUNED)
        outcome.pruned += 1
    else:
        study.tell(job.trial, [result.metrics[o.metric] for o in spec.objectives])
        outcome.completed += 1


def engine_attrs(metrics: dict[str, float], info: dict[str, Any]) -> dict[str, Any]:
    """The engine measure's metrics and its labels (what was served, a refusal, why no perplexity), with the task's window count."""
    from paretolab.measure.engine_measure import ENGINES

    prefixes = tuple(f"{e}_" for e in ENGINES)
    out: dict[str, Any] = {k: float(v) for k, v in metrics.items() if k.startswith(prefixes) and math.isfinite(v)}
    if not out:
        return {}
    out.update({k: v for k, v in info.items() if k.startswith(prefixes)})
    if "n_windows" in metrics:
        out["n_windows"] = metrics["n_windows"]
    return out


def _objective_problem(spec: StudySpec, metrics: dict[str, float]) -> str | None:
    for objective in spec.objectives:
        value = metrics.get(objective.metric)
        if value is None:
            return f"objective metric {objective.metric!r} was not reported (reported: {', '.join(sorted(metrics))})"
        if not math.isfinite(value):
            return f"objective metric {objective.metric!r} is {value}"
    return None


def _flat_params(plan: list[StagePlan]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for stage in plan:
        out[f"{stage.stage}.method"] = stage.method
        for key, value in stage.params.items():
            out[f"{stage.stage}.{stage.method}.{key}"] = value
        for group, values in stage.layers.items():  # a per-layer stage: each group's own values, or keep
            for key, value in (values or {"": "keep"}).items():
                out[f"{stage.stage}.{stage.method}.{key}/{group}" if key else f"{stage.stage}.{stage.method}/{group}"] = value
    return out


def study_tags(spec: StudySpec) -> dict[str, str]:
    return {"paretolab.pipeline_hash": spec.pipeline_hash(), "paretolab.model": spec.model, "paretolab.code_version": code_version()}


def trial_tags(spec: StudySpec, regs: Any) -> dict[str, str]:
    versions = ",".join(f"{k}={v}" for k, v in sorted(regs.plugin_versions.items()) if not k.startswith("paretolab."))
    return {
        **study_tags(spec),
        "paretolab.methods": ",".join(spec.methods()),
        "paretolab.plugin_versions": versions or "builtin only",
    }
