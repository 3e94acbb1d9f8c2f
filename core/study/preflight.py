"""Everything `paretolab run` refuses before it starts work, in one place, and the plan `paretolab check` prints.

``validated_spec`` is the one path both commands take: the pipeline parsed and validated (``load_spec``),
its models loadable on this machine, and the trial count a grid allows (``planned_trials``). ``plan_lines``
describes what a run would do (trials, search, space, arms, resources, stores) reading the stores only:
it starts no Ray, loads no model and writes nothing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from paretolab.errors import ConfigError
from paretolab.study.spec import StudySpec, load_spec


def validated_spec(path: str, *, address: str | None = None, trials: int | None = None, log: Any = print) -> StudySpec:
    """The pipeline at ``path``, refused with the one line `run` prints if anything in it cannot run here.

    With a ``ray://`` address the workers load the model elsewhere, so it is not checked here.
    """
    try:
        spec = load_spec(path)
    except ConfigError as exc:
        raise ConfigError(_saved_model_hint(path, str(exc)) or str(exc)) from None
    if not (address or "").startswith("ray://"):
        from paretolab.models import check_model

        for name in dict.fromkeys([spec.model, *spec.models.values()]):
            check_model(name)
        check_measures_here(spec)
    planned_trials(spec, trials, log)
    return spec


def check_measures_here(spec: StudySpec) -> None:
    """A measure that cannot run on this machine (``Measure.check_here``: the engine measure's engine not installed) is
    refused now, in one line naming what to install, not found failing in every trial."""
    from paretolab.plugin_api.manager import registries
    from paretolab.plugin_api.options import parse_options

    regs = registries()
    for name, raw in (spec.measures or {}).items():
        measure = regs.measures.get(name)
        check = getattr(measure, "check_here", None)
        if check is not None:
            try:
                check(parse_options(measure.options, raw, where=f"measures.{name}"))
            except ConfigError as exc:
                raise ConfigError(f"measures.{name}: {exc}") from None


def planned_trials(spec: StudySpec, trials: int | None, log: Any = print) -> tuple[list[dict[str, Any]] | None, int]:
    """(a grid's points or None, the trials this run plans): a grid runs each of its points once, so its size is the count."""
    from paretolab.study.search import grid_points, space_size
    from paretolab.study.spec import MAX_TRIALS

    if trials is not None and not 1 <= trials <= MAX_TRIALS:
        raise ConfigError(f"--trials {trials}: give a whole number of trials from 1 to {MAX_TRIALS}")
    if spec.search.sampler != "grid":
        return None, trials or spec.search.trials
    size = space_size(spec)  # counted, not built: a grid of 10^12 points is refused before one is made
    if size is not None and size > MAX_TRIALS:
        raise ConfigError(f"search.sampler grid: the space has {size} points, more than the {MAX_TRIALS} trials a study may plan; "
                          "give fewer values or a coarser `step`, or use another sampler")
    points = grid_points(spec)
    if trials is not None and trials != len(points):
        raise ConfigError(f"--trials {trials}: a grid study runs each of its {len(points)} points once; drop --trials")
    if spec.search.trials != len(points):
        log(f"warning: search.trials is {spec.search.trials} but the grid has {len(points)} points; "
            f"the study runs {len(points)} trials (set search.trials: {len(points)} to silence this)")
    return points, len(points)


def _saved_model_hint(path: str, message: str) -> str | None:
    """For an unknown model that another pipeline beside this one saves (train.save_as): which one to run first."""
    if not message.startswith("model: unknown model"):
        return None
    from paretolab.study.yaml_read import read_yaml

    here = Path(path)
    try:
        name = read_yaml(here.read_text(encoding="utf-8"), str(here)).get("model")
    except Exception:  # noqa: BLE001 - the original error stands
        return None
    for other in sorted(here.parent.glob("*.yaml")):
        try:
            raw = read_yaml(other.read_text(encoding="utf-8"), str(other))
        except Exception:  # noqa: BLE001 - a broken neighbour says nothing about this pipeline
            continue
        for stage in raw.get("stages") or [] if isinstance(raw, dict) else []:
            params = stage.get("params") or {} if isinstance(stage, dict) else {}
            if isinstance(params, dict) and stage.get("method") == "train" and params.get("save_as") == name:
                return (f"model: {name!r} is the checkpoint that {other} saves (its train stage's save_as) and it is not on this "
                        f"machine yet; run `paretolab run {other}` first, then this pipeline")
    return None


def plan_lines(spec: StudySpec, path: str, stores: Any, trials: int | None = None) -> list[str]:
    """What `paretolab run PATH` would do, as lines: trials and search, the space, arms run first, resources, stores."""
    from paretolab.plugin_api.manager import registries
    from paretolab.study.arms import searched
    from paretolab.study.constraints import reference_arms
    from paretolab.study.search import space_size

    points, count = planned_trials(spec, trials, log=lambda *_: None)
    s = spec.search
    size = space_size(spec)
    pruner = f"pruner {s.pruner.name} on {s.pruner.metric} ({s.pruner.direction})" if s.pruner else "no pruner"
    population = f", population {s.population_size}" if s.population_size else ""
    lines = [
        f"pipeline {path}: valid",
        f"study {spec.name!r}: {count} trial(s), sampler {s.sampler} (seed {s.seed}{population}), {pruner}, "
        f"each trial at most {s.trial_timeout_s:g} s" + (f"; the space has {size} distinct point(s)" if size is not None else ""),
        f"  model {spec.model}" + "".join(f", {role}: {m}" for role, m in spec.models.items()) + f"; task {spec.task}"
        + (f" ({', '.join(f'{k}={v}' for k, v in spec.task_options.items())})" if spec.task_options else ""),
        "  objectives: " + ", ".join(f"{o.metric} ({o.direction})" for o in spec.objectives),
        *([f"  confirm split: {spec.confirm['share']:g} of the task's examples (seed {spec.confirm['seed']}) kept from the "
           "search; every trial scores the rest, `paretolab pick` confirms its choice on them"] if spec.confirm else []),
        "search space (Optuna parameter: values):",
    ]
    lines += [f"  {name}: {_values(dist)}" for name, (_m, _k, dist) in searched(spec.stages, registries()).items()]
    first = [*reference_arms(spec.constraints), *((f"search.enqueue[{i}]", p) for i, p in enumerate(s.enqueue))]
    if first:
        lines.append("run first, in order:")
        lines += [f"  {label}: {', '.join(f'{k}={v}' for k, v in params.items()) or 'the space as given'}" for label, params in first]
    r = spec.resources
    lines.append(f"resources per trial: cpus {r.cpus:g}, gpus {r.gpus:g}" + (f", memory {r.memory_gb:g} GB" if r.memory_gb else "")
                 + f"; {f'{r.workers} worker(s)' if r.workers else 'as many workers at once as the Ray cluster holds'}")
    lines += claim_lines(spec)
    lines += _store_lines(spec, path, stores, count)
    lines += _data_lines(spec.raw)
    lines.append("nothing was run: no Ray, no model loaded, no store written")
    return lines


def claim_lines(spec: StudySpec) -> list[str]:
    """The pipeline's claims as `paretolab report` will judge them: text, metric, method vs baseline, expect and margin."""
    from paretolab.plugin_api.numbers import number

    if not spec.claims:
        return []
    lines = [f"claims (`paretolab report {spec.name}` judges them on the stored trials):"]
    for claim in spec.claims:
        if claim.target is not None:
            lines.append(f"  \"{claim.text}\": {claim.metric} within {number(claim.target)} ± {number(claim.tolerance)}")
            continue
        margin = "" if claim.margin is None else \
            f" (margin {number(claim.margin * 100)} % on the ratio)" if claim.scale == "log" else f" (margin {number(claim.margin)})"
        ratio = ", judged as the ratio method ÷ baseline" if claim.scale == "log" and claim.margin is None else ""
        reference = f", reference {claim.reference}" if claim.reference else ""
        lines.append(f"  \"{claim.text}\": {claim.metric}, {claim.method} vs {claim.baseline}{reference}, expect {claim.expect}"
                     f"{margin}{ratio}; replicates: {claim.pair_by}")
    return lines


def _values(dist: Any) -> str:
    from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

    from paretolab.study.stages import Fixed

    if isinstance(dist, Fixed):
        return f"{dist.value!r} (fixed)"
    if isinstance(dist, CategoricalDistribution):
        return "one of " + ", ".join(repr(c) for c in dist.choices)
    if isinstance(dist, (FloatDistribution, IntDistribution)):
        kind = "integer" if isinstance(dist, IntDistribution) else "number"
        step = f" step {dist.step:g}" if dist.step not in (None, 1) else ""
        return f"{kind} from {dist.low:g} to {dist.high:g}{step}{' (log scale)' if dist.log else ''}"
    return repr(dist)


def _store_lines(spec: StudySpec, path: str, stores: Any, count: int) -> list[str]:
    """The stores a run would write and what they hold of this study, read without writing (a missing store stays missing)."""
    from paretolab.stores.open import exists, guarded, optuna_storage
    from paretolab.study.optuna_study import check_same_pipeline, finished_count, refuse_twin

    shown = stores.redacted()
    lines = [f"stores: Optuna {shown.optuna_url}, MLflow {shown.tracking_uri}"]
    study = None
    if exists(stores.optuna_url):
        import optuna

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        storage = optuna_storage(stores, create=False)
        try:
            study = guarded("Optuna", stores.optuna_url, lambda: optuna.load_study(study_name=spec.name, storage=storage))
        except KeyError:
            study = None
            refuse_twin(spec.name, storage, stores)  # `run` would refuse to create it beside its Unicode twin: so does `check`
    if study is None:
        return [*lines, f"  no study {spec.name!r} there yet: `paretolab run {path}` starts it"]
    check_same_pipeline(spec, study, stores)  # `run` refuses a changed pipeline under the same name: so does `check`
    trials = study.get_trials(deepcopy=False)
    states = ", ".join(f"{n} {state.name.lower()}" for state, n in _count(trials).items())
    finished = finished_count(study)
    return [*lines, f"  study {spec.name!r} is there with {len(trials)} trial(s) ({states or 'none'}): "
            f"`paretolab run {path} --resume` continues it (plain `run` refuses), or --trials N (N > {finished}) extends it"]


def _count(trials: list[Any]) -> dict[Any, int]:
    out: dict[Any, int] = {}
    for t in trials:
        out[t.state] = out.get(t.state, 0) + 1
    return out


def _data_lines(raw: Any) -> list[str]:
    """Named data files the pipeline uses (e.g. wikitext2) that are not on this machine: the trials would download them."""
    from paretolab.data import DATA_ENV, KNOWN_FILES, data_dirs

    named: set[str] = set()

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)
        elif isinstance(node, str) and node in KNOWN_FILES:
            named.add(node)

    walk(raw)
    lines = []
    for name in sorted(named):
        relative, url = KNOWN_FILES[name]
        if not any((d / relative).is_file() for d in data_dirs()):
            lines.append(f"note: data set {name!r} ({relative}) is not in {', '.join(str(d) for d in data_dirs())}; each worker "
                         f"downloads it from {url} on first use (no network: set {DATA_ENV} to a folder that has it)")
    return lines
