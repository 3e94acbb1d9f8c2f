"""From a StudySpec to Optuna: samplers, and the define-by-run plan of one trial."""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

import optuna
from optuna.distributions import BaseDistribution, CategoricalDistribution, FloatDistribution, IntDistribution

from paretolab.errors import ConfigError
from paretolab.spec import Choices, Fixed, Range, StudySpec


@dataclass(frozen=True)
class StagePlan:
    """One stage of one trial: which method runs, with which parameters (unprefixed)."""

    stage: str
    method: str
    params: dict[str, Any]


def param_prefix(spec: StudySpec, stage_id: str, method: str) -> str:
    """Optuna parameter names are `method.param`, or `stage.method.param` if a method occurs twice."""
    count = sum(1 for s in spec.stages for o in s.options if o.method == method)
    return method if count == 1 else f"{stage_id}.{method}"


def plan_trial(trial: optuna.Trial | optuna.trial.FixedTrial, spec: StudySpec) -> list[StagePlan]:
    """Ask ``trial`` for every searched value and return the stages to run, in order."""
    from paretolab.plugin_manager import registries

    methods = registries().methods
    plan = []
    for stage in spec.stages:
        option = stage.options[0]
        if len(stage.options) > 1:
            chosen = trial.suggest_categorical(f"{stage.id}.method", [o.method for o in stage.options])
            option = next(o for o in stage.options if o.method == chosen)
        method = methods.get(option.method)
        prefix = param_prefix(spec, stage.id, option.method)
        params = dict(method.defaults())
        space = method.search_space()
        for key in sorted(set(space) | set(option.params)):
            given = option.params.get(key)
            if isinstance(given, Fixed):
                params[key] = given.value
                continue
            dist = to_distribution(given) if given is not None else space[key]
            params[key] = _suggest(trial, f"{prefix}.{key}", dist)
        plan.append(StagePlan(stage=stage.id, method=option.method, params=params))
    return plan


def to_distribution(param: Choices | Range) -> BaseDistribution:
    if isinstance(param, Choices):
        return CategoricalDistribution(list(param.values))
    if param.integer:
        return IntDistribution(int(param.low), int(param.high), log=param.log, step=int(param.step or 1))
    return FloatDistribution(float(param.low), float(param.high), log=param.log, step=param.step)


def _suggest(trial: Any, name: str, dist: BaseDistribution) -> Any:
    if isinstance(dist, CategoricalDistribution):
        return trial.suggest_categorical(name, list(dist.choices))
    if isinstance(dist, IntDistribution):
        return trial.suggest_int(name, dist.low, dist.high, step=dist.step, log=dist.log)
    if isinstance(dist, FloatDistribution):
        return trial.suggest_float(name, dist.low, dist.high, step=dist.step, log=dist.log)
    raise ConfigError(f"parameter {name!r}: unsupported distribution {dist!r}")


def make_sampler(spec: StudySpec) -> optuna.samplers.BaseSampler:
    """The sampler named by ``search.sampler``, seeded."""
    s = spec.search
    if s.sampler == "nsga2":
        population = s.population_size or max(4, min(50, s.trials // 3))
        return optuna.samplers.NSGAIISampler(seed=s.seed, population_size=population)
    if s.sampler == "tpe":
        import warnings

        with warnings.catch_warnings():  # multivariate/group/constant_liar are "experimental" in Optuna
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            return optuna.samplers.TPESampler(seed=s.seed, multivariate=True, group=True, constant_liar=True)
    # random, and grid (whose points are enqueued; see grid_points)
    return optuna.samplers.RandomSampler(seed=s.seed)


def grid_points(spec: StudySpec) -> list[dict[str, Any]]:
    """Every combination of the (conditional) search space, as Optuna parameter dicts."""
    from paretolab.plugin_manager import registries

    methods = registries().methods
    per_stage: list[list[dict[str, Any]]] = []
    for stage in spec.stages:
        stage_points: list[dict[str, Any]] = []
        for option in stage.options:
            method = methods.get(option.method)
            prefix = param_prefix(spec, stage.id, option.method)
            space = method.search_space()
            axes: list[list[tuple[str, Any]]] = []
            for key in sorted(set(space) | set(option.params)):
                given = option.params.get(key)
                if isinstance(given, Fixed):
                    continue
                dist = to_distribution(given) if given is not None else space[key]
                axes.append([(f"{prefix}.{key}", v) for v in _enumerate(dist, f"{prefix}.{key}")])
            base = {f"{stage.id}.method": option.method} if len(stage.options) > 1 else {}
            for combo in itertools.product(*axes):
                stage_points.append({**base, **dict(combo)})
        per_stage.append(stage_points)
    return [{k: v for part in combo for k, v in part.items()} for combo in itertools.product(*per_stage)]


def _enumerate(dist: BaseDistribution, name: str) -> list[Any]:
    if isinstance(dist, CategoricalDistribution):
        return list(dist.choices)
    if isinstance(dist, IntDistribution):
        return list(range(dist.low, dist.high + 1, dist.step))
    if isinstance(dist, FloatDistribution) and dist.step:
        n = int(round((dist.high - dist.low) / dist.step))
        return [round(dist.low + i * dist.step, 12) for i in range(n + 1)]
    raise ConfigError(
        f"search.sampler grid: parameter {name!r} is a continuous range; give it a list of values or a `step`"
    )
