"""From a StudySpec to Optuna: samplers, and the define-by-run plan of one trial."""

from __future__ import annotations

import itertools
import math
from typing import Any

import optuna
from optuna.distributions import (
    BaseDistribution,
    CategoricalDistribution,
    FloatDistribution,
    IntDistribution,
)

from paretolab.errors import ConfigError
from paretolab.records import StagePlan
from paretolab.study.spec import StudySpec
from paretolab.study.stages import Fixed, group_params, param_prefix, to_distribution


def plan_trial(trial: optuna.Trial | optuna.trial.FixedTrial, spec: StudySpec) -> list[StagePlan]:
    """Ask ``trial`` for every searched value and return the stages to run, in order."""
    from paretolab.plugin_api.manager import registries

    methods = registries().methods
    plan = []
    for stage in spec.stages:
        option = stage.options[0]
        if len(stage.options) > 1:
            chosen = trial.suggest_categorical(f"{stage.id}.method", [o.method for o in stage.options])
            option = next(o for o in stage.options if o.method == chosen)
        method = methods.get(option.method)
        prefix = param_prefix(spec.stages, stage.id, option.method)
        params = dict(method.defaults())
        space = method.search_space()
        for key in sorted(set(space) | set(option.params)):
            given = option.params.get(key)
            if isinstance(given, Fixed):
                params[key] = given.value
                continue
            dist = to_distribution(given) if given is not None else space[key]
            params[key] = _suggest(trial, f"{prefix}.{key}", dist)
        layers: dict[str, dict[str, Any] | None] = {g.name: None if g.keep else {} for g in option.layers}
        for name, group, key, given in group_params(option, prefix):
            layers[group.name][key] = given.value if isinstance(given, Fixed) else _suggest(trial, name, to_distribution(given))
        plan.append(StagePlan(stage=stage.id, method=option.method, params=params, layers=layers))
    return plan


def _suggest(trial: Any, name: str, dist: BaseDistribution) -> Any:
    if isinstance(dist, CategoricalDistribution):
        return trial.suggest_categorical(name, list(dist.choices))
    if isinstance(dist, IntDistribution):
        return trial.suggest_int(name, dist.low, dist.high, step=dist.step, log=dist.log)
    if isinstance(dist, FloatDistribution):
        return trial.suggest_float(name, dist.low, dist.high, step=dist.step, log=dist.log)
    raise ConfigError(f"parameter {name!r}: unsupported distribution {dist!r}")


def make_sampler(spec: StudySpec, number: int | None = None) -> optuna.samplers.BaseSampler:
    """The sampler named by ``search.sampler``, seeded by ``search.seed`` and, when given, the trial number.

    Seeding per trial number keeps a resumed or extended study from replaying the points its
    first session drew (a sampler made again with the same seed starts its sequence over).
    """
    s = spec.search
    seed = s.seed if number is None else trial_seed(s.seed, number)
    if s.sampler == "nsga2":
        # at least two generations within the budget: a population of trials//2 (4..50)
        population = s.population_size or max(4, min(50, s.trials // 2))
        return optuna.samplers.NSGAIISampler(seed=seed, population_size=population)
    if s.sampler == "tpe":
        import warnings

        with warnings.catch_warnings():  # multivariate/group/constant_liar are "experimental" in Optuna
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            return optuna.samplers.TPESampler(seed=seed, multivariate=True, group=True, constant_liar=True)
    # random, and grid (whose points the driver hands out in order; see grid_points)
    return optuna.samplers.RandomSampler(seed=seed)


def trial_seed(seed: int, number: int) -> int:
    """A seed for trial ``number`` of a study seeded ``seed``: the same on every run, distinct per trial."""
    return (seed * 1_000_003 + number * 7_919 + 1) % 2**32


def grid_points(spec: StudySpec) -> list[dict[str, Any]]:
    """Every combination of the (conditional) search space, as Optuna parameter dicts."""
    per_stage: list[list[dict[str, Any]]] = [[] for _ in spec.stages]
    for stage, _option, base, axes in _option_axes(spec, enumerate_values=True):
        names = [name for name, _ in axes]
        for combo in itertools.product(*(values for _, values in axes)):
            per_stage[stage].append({**base, **dict(zip(names, combo))})
    return [{k: v for part in combo for k, v in part.items()} for combo in itertools.product(*per_stage)]


def space_size(spec: StudySpec) -> int | None:
    """How many distinct parameter sets the (conditional) space has; None when a range is continuous."""
    totals = [0 for _ in spec.stages]
    try:
        for stage, _option, _base, axes in _option_axes(spec, enumerate_values=False):
            totals[stage] += math.prod(len(values) for _, values in axes)
    except ConfigError:
        return None
    return math.prod(totals)


def _option_axes(spec: StudySpec, *, enumerate_values: bool) -> Any:
    """(stage index, option, fixed part, [(param name, values)]) for every option of every stage."""
    from paretolab.plugin_api.manager import registries

    methods = registries().methods
    for index, stage in enumerate(spec.stages):
        for option in stage.options:
            method = methods.get(option.method)
            prefix = param_prefix(spec.stages, stage.id, option.method)
            space = method.search_space()
            axes: list[tuple[str, Any]] = []
            for key in sorted(set(space) | set(option.params)):
                given = option.params.get(key)
                if isinstance(given, Fixed):
                    continue
                dist = to_distribution(given) if given is not None else space[key]
                name = f"{prefix}.{key}"
                axes.append((name, _enumerate(dist, name) if enumerate_values else _Count(_count(dist, name))))
            for name, _group, _key, given in group_params(option, prefix):
                if not isinstance(given, Fixed):
                    dist = to_distribution(given)
                    axes.append((name, _enumerate(dist, name) if enumerate_values else _Count(_count(dist, name))))
            base = {f"{stage.id}.method": option.method} if len(stage.options) > 1 else {}
            yield index, option, base, axes


class _Count:
    """Stands in for a list of values when only its length is wanted (a range of 10^9 integers stays cheap)."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n


def _count(dist: BaseDistribution, name: str) -> int:
    if isinstance(dist, CategoricalDistribution):
        return len(dist.choices)
    if isinstance(dist, IntDistribution):
        return (dist.high - dist.low) // dist.step + 1
    if isinstance(dist, FloatDistribution) and dist.step:
        return int(round((dist.high - dist.low) / dist.step)) + 1
    return len(_enumerate(dist, name))  # raises the continuous-range error


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
