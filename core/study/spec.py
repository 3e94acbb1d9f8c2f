"""The pipeline YAML: parsed into a StudySpec and validated, with errors that name field and value."""

from __future__ import annotations

import difflib
import hashlib
import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from paretolab.errors import ConfigError
from paretolab.models import check_model_name
from paretolab.plugin_api.manager import registries
from paretolab.plugin_api.metrics import TRIAL_METRICS
from paretolab.plugin_api.options import parse_options
from paretolab.study.arms import check_claim_arms, enqueue_params
from paretolab.study.confirm import parse_confirm
from paretolab.study.constraints import Constraint, parse_constraints
from paretolab.study.fields import lookup, no_unknown, refuse_nan, require
from paretolab.study.pruning import PrunerSpec, parse_pruner
from paretolab.study.report_spec import Claim, parse_claims, parse_frontiers
from paretolab.study.stages import Stage, check_composition, parse_stage
from paretolab.data.names import check_name
from paretolab.data.yaml_read import MAX_PIPELINE_BYTES, read_yaml_file
from paretolab.tasks.held_out import check_calibration_corpus
from paretolab.training.method import check_train_stages

SAMPLERS = ("nsga2", "tpe", "random", "grid")
MAX_TRIALS = 100_000  # trials one study may plan (search.trials, --trials, a grid's size): bounded work for any pipeline
MAX_TRIAL_TIMEOUT_S = 30 * 24 * 3600.0  # a trial's time limit: finite, at most 30 days
MAX_SEED = 2**31 - 1  # numpy's and every sampler's seed range, with room for seed + trial number
# Top-level keys and search settings that do not change a trial's result: left out of the hash that
# guards --resume, so editing them does not turn a study into "a different pipeline".
HASH_IGNORES_TOP = ("description", "resources", "claim", "claims", "frontiers")  # claims and frontiers are read by the report, never by a trial
HASH_IGNORES_SEARCH = ("trials", "trial_timeout_s", "enqueue")  # enqueued points choose trials, they change no trial's result


@dataclass(frozen=True)
class Objective:
    metric: str
    direction: str


@dataclass(frozen=True)
class SearchSpec:
    sampler: str = "nsga2"
    trials: int = 12
    seed: int = 0
    trial_timeout_s: float = 600.0
    population_size: int | None = None  # nsga2 only; default: about a third of the trials
    pruner: PrunerSpec | None = None  # stops trials whose reported values fall behind (see paretolab.study.pruning)
    enqueue: tuple[dict[str, Any], ...] = ()  # partial Optuna parameter sets run first, in order (see paretolab.study.arms)


@dataclass(frozen=True)
class Resources:
    cpus: float = 1.0
    gpus: float = 0.0
    memory_gb: float | None = None
    workers: int | None = None  # concurrent trials; default: as many as the resources allow


@dataclass(frozen=True)
class StudySpec:
    name: str
    model: str
    task: str
    task_options: dict[str, Any]
    stages: tuple[Stage, ...]
    objectives: tuple[Objective, ...]
    search: SearchSpec = field(default_factory=SearchSpec)
    resources: Resources = field(default_factory=Resources)
    measures: dict[str, dict[str, Any]] | None = None  # None: the default measures
    claims: tuple[Claim, ...] = ()  # what the study is to check; `paretolab report` gives each its verdict
    raw: dict[str, Any] = field(default_factory=dict, compare=False)
    models: dict[str, str] = field(default_factory=dict)  # `models:` by role, loaded once per worker (see paretolab.routing)
    prices: dict[str, float] = field(default_factory=dict)  # role -> price per token (a simulated cost)
    constraints: tuple[Constraint, ...] = ()  # bounds a trial must meet to sit on a frontier (see paretolab.study.constraints)
    confirm: dict[str, Any] | None = None  # examples kept from the search for `pick` to confirm on (see paretolab.study.confirm)

    @property
    def claim(self) -> Claim | None:
        """The first claim (the one a ``claim:`` block gives), or None."""
        return self.claims[0] if self.claims else None

    def pipeline_hash(self) -> str:
        """Identity of what decides the study's results: not its description, resources, trial count or timeout."""
        return pipeline_hash(self.raw)

    def legacy_pipeline_hash(self) -> str:
        """The hash studies created before the pipeline hash ignored description and resources (only `trials` left out)."""
        data = json.loads(json.dumps(self.raw, sort_keys=True, default=str))
        data.get("search", {}).pop("trials", None)
        return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]

    def matches_hash(self, stored: str | None) -> bool:
        """Whether a study stored with hash ``stored`` was started from this pipeline (old hashes still match)."""
        return stored in (self.pipeline_hash(), self.legacy_pipeline_hash())

    def methods(self) -> list[str]:
        return sorted({o.method for s in self.stages for o in s.options})


def with_subject(raw: dict[str, Any]) -> dict[str, Any]:
    """The pipeline with its trials' subject filled in: without `model`, the `models` small role's, else the first role's."""
    models = raw.get("models")
    if "model" in raw or not isinstance(models, dict) or not models:
        return raw
    entry = models.get("small", next(iter(models.values())))
    return {**raw, "model": entry.get("name") if isinstance(entry, dict) else entry}


def pipeline_hash(raw: dict[str, Any]) -> str:
    """The hash of a pipeline as read (``StudySpec.pipeline_hash``); the results targets compare it without validating."""
    data = json.loads(json.dumps(with_subject(raw), sort_keys=True, default=str))
    for key in HASH_IGNORES_TOP:
        data.pop(key, None)
    search = data.get("search")
    for key in HASH_IGNORES_SEARCH if isinstance(search, dict) else ():
        search.pop(key, None)
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]


TOP_KEYS = ("name", "model", "models", "task", "stages", "objectives", "search", "resources", "measures", "description", "claim", "claims", "frontiers",
            "constraints", "confirm")


def load_spec(path: str | Path) -> StudySpec:
    """Read and validate a pipeline file."""
    return parse_spec(read_yaml_file(path, "pipeline file", MAX_PIPELINE_BYTES), source=str(path))


def parse_spec(raw: Any, *, source: str = "pipeline") -> StudySpec:
    """Validate plain data against the registries and build a StudySpec."""
    regs = registries()
    if not isinstance(raw, dict):
        raise ConfigError(f"{source}: expected a mapping at the top level, got {type(raw).__name__}")
    no_unknown(raw, TOP_KEYS, "")
    refuse_nan(raw, "")
    name = check_name(require(raw, "name", str, ""), "name")
    if not isinstance(raw.get("description", ""), str):
        raise ConfigError(f"description: expected text, got {type(raw['description']).__name__}; write it as one string")
    models, prices = parse_models(raw.get("models"))
    raw = with_subject(raw)
    model = require(raw, "model", str, "")
    check_model_name(model)
    task_raw = raw.get("task")
    if isinstance(task_raw, str):
        task_raw = {"name": task_raw}
    if not isinstance(task_raw, dict) or "name" not in task_raw:
        raise ConfigError(f"task: expected a mapping with a `name` (e.g. {{name: perplexity, corpus: pydoc}}), got {task_raw!r}")
    task_options = {k: v for k, v in task_raw.items() if k != "name"}
    task_name = task_raw["name"]
    task = lookup(regs.tasks, task_name, "task.name")
    parse_options(task.options, task_options, where="task")  # validate now, parse again in workers

    stages_raw = raw.get("stages")
    if not isinstance(stages_raw, list) or not stages_raw:
        raise ConfigError("stages: expected a non-empty list of {method: ...} or {choice: [...]} entries")
    stages = tuple(parse_stage(s, i, regs) for i, s in enumerate(stages_raw))
    check_composition(stages, regs)
    ids = [s.id for s in stages]
    if len(set(ids)) != len(ids):
        raise ConfigError(f"stages: stage ids must be unique, got {ids}")

    check_calibration_corpus(stages, task_name, task_options)  # before any trial calibrates on the test text
    check_train_stages(stages, task_name, task_options)  # train params in range; no training on the test text
    measures = _parse_measures(raw.get("measures"), regs)
    objectives = _parse_objectives(raw.get("objectives"), regs)
    search = _parse_search(raw.get("search") or {}, stages, regs)
    resources = _parse_resources(raw.get("resources") or {})
    _check_objectives_produced(objectives, task, measures, stages, resources, regs)
    _check_one_owner_per_metric(measures, stages, regs)
    constraints = parse_constraints(raw.get("constraints"), stages, regs)
    _check_objectives_produced(constraints, task, measures, stages, resources, regs, where="constraints")
    claims = parse_claims(raw, stages, regs)
    check_claim_arms(raw, claims, stages, regs)  # arms the search produces, two different ones
    parse_frontiers(raw.get("frontiers"), regs)  # the report prints them; refuse a typo now
    return StudySpec(
        name=name,
        model=model,
        task=task_name,
        task_options=task_options,
        stages=stages,
        objectives=objectives,
        search=search,
        resources=resources,
        measures=measures,
        claims=claims,
        raw=raw,
        models=models,
        prices=prices,
        constraints=constraints,
        confirm=parse_confirm(raw.get("confirm"), task_name, regs),
    )


ROLE_RE = re.compile(r"^[a-z][a-z0-9_]{0,31}$")


def parse_models(raw: Any) -> tuple[dict[str, str], dict[str, float]]:
    """``models: {small: NAME, large: {name: NAME, price_per_token: 2e-6}}`` -> (role -> model, role -> price)."""
    if raw is None:
        return {}, {}
    if not isinstance(raw, dict) or not raw:
        raise ConfigError(f"models: expected a mapping of roles to model names (e.g. {{small: smollm2-135m, large: gemma3-270m}}), got {raw!r}")
    models: dict[str, str] = {}
    prices: dict[str, float] = {}
    for role, entry in raw.items():
        where = f"models.{role}"
        if not isinstance(role, str) or not ROLE_RE.match(role):
            raise ConfigError(f"{where}: a role is a lower-case name (letters, digits, _), got {role!r}")
        if isinstance(entry, dict):
            no_unknown(entry, ("name", "price_per_token"), where + ".")
            name = require(entry, "name", str, where + ".")
            if "price_per_token" in entry:
                price = entry["price_per_token"]
                if isinstance(price, bool) or not isinstance(price, (int, float)) or not math.isfinite(price) or price < 0:
                    raise ConfigError(f"{where}.price_per_token: expected a number >= 0, got {price!r}")
                prices[role] = float(price)
        elif isinstance(entry, str) and entry.strip():
            name = entry
        else:
            raise ConfigError(f"{where}: expected a model name or {{name: ..., price_per_token: ...}}, got {entry!r}")
        check_model_name(name)
        models[role] = name
    return models, prices


def _parse_measures(raw: Any, regs: Any) -> dict[str, dict[str, Any]] | None:
    if raw is None:
        return None
    if isinstance(raw, list):
        raw = {name: {} for name in raw}
    if not isinstance(raw, dict):
        raise ConfigError(f"measures: expected a list of measure names or a mapping name -> options, got {raw!r}")
    out = {}
    for name, options in raw.items():
        measure = lookup(regs.measures, name, f"measures.{name}")
        parse_options(measure.options, options or {}, where=f"measures.{name}")
        out[name] = dict(options or {})
    return out


def _parse_objectives(raw: Any, regs: Any) -> tuple[Objective, ...]:
    if not isinstance(raw, list) or not raw:
        raise ConfigError("objectives: expected a list like [{metric: ppl, direction: minimize}, {metric: size_bytes}]")
    out = []
    for i, item in enumerate(raw):
        where = f"objectives[{i}]"
        if isinstance(item, str):
            item = {"metric": item}
        if not isinstance(item, dict) or "metric" not in item:
            raise ConfigError(f"{where}: expected {{metric: NAME, direction: minimize|maximize}}, got {item!r}")
        no_unknown(item, ("metric", "direction"), where + ".")
        metric = lookup(regs.metrics, item["metric"], f"{where}.metric")
        direction = item.get("direction", metric.direction)
        if direction not in ("minimize", "maximize"):
            raise ConfigError(f"{where}.direction: expected minimize or maximize, got {direction!r}")
        out.append(Objective(metric.name, direction))
    names = [o.metric for o in out]
    if len(set(names)) != len(names):
        raise ConfigError(f"objectives: each metric may appear once, got {names}")
    return tuple(out)


def _parse_search(raw: Any, stages: tuple[Stage, ...], regs: Any) -> SearchSpec:
    if not isinstance(raw, dict):
        raise ConfigError(f"search: expected a mapping, got {raw!r}")
    no_unknown(raw, ("sampler", "trials", "seed", "trial_timeout_s", "population_size", "pruner", "enqueue"), "search.")
    sampler = raw.get("sampler", "nsga2")
    if sampler not in SAMPLERS:
        close = difflib.get_close_matches(str(sampler), SAMPLERS, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise ConfigError(f"search.sampler: unknown sampler {sampler!r}{hint} (known: {', '.join(SAMPLERS)})")
    trials = raw.get("trials", 12)
    if not isinstance(trials, int) or isinstance(trials, bool) or trials < 1:
        raise ConfigError(f"search.trials: expected a positive integer, got {trials!r}")
    if trials > MAX_TRIALS:
        raise ConfigError(f"search.trials: {trials} is more than the {MAX_TRIALS} trials a study may plan; give at most {MAX_TRIALS}")
    seed = raw.get("seed", 0)
    if not isinstance(seed, int) or isinstance(seed, bool) or not 0 <= seed <= MAX_SEED:
        raise ConfigError(f"search.seed: expected an integer from 0 to {MAX_SEED}, got {seed!r}")
    timeout = raw.get("trial_timeout_s", 600)
    if not isinstance(timeout, (int, float)) or isinstance(timeout, bool) or not 0 < timeout <= MAX_TRIAL_TIMEOUT_S:
        raise ConfigError(f"search.trial_timeout_s: expected a positive number of seconds, at most {MAX_TRIAL_TIMEOUT_S:g} (30 days), "
                          f"got {timeout!r}")
    population = raw.get("population_size")
    if population is not None and (not isinstance(population, int) or isinstance(population, bool) or population < 2):
        raise ConfigError(f"search.population_size: expected an integer >= 2, got {population!r}")
    enqueue = raw.get("enqueue") or []
    if not isinstance(enqueue, list):
        raise ConfigError(f"search.enqueue: expected a list of points like [{{magnitude.sparsity: 0.5}}, 'wanda[sparsity=0.5]'], got {enqueue!r}")
    if enqueue and sampler == "grid":
        raise ConfigError("search.enqueue: a grid runs every point of its space already; drop search.enqueue or use another sampler")
    points = tuple(enqueue_params(stages, regs, e, f"search.enqueue[{i}]") for i, e in enumerate(enqueue))
    return SearchSpec(sampler=sampler, trials=trials, seed=seed, trial_timeout_s=float(timeout), population_size=population,
                      pruner=parse_pruner(raw.get("pruner"), stages, regs), enqueue=points)


def _parse_resources(raw: Any) -> Resources:
    if not isinstance(raw, dict):
        raise ConfigError(f"resources: expected a mapping, got {raw!r}")
    no_unknown(raw, ("cpus", "gpus", "memory_gb", "workers"), "resources.")
    values = {}
    for key in ("cpus", "gpus", "memory_gb"):
        if key in raw:
            v = raw[key]
            if not isinstance(v, (int, float)) or isinstance(v, bool) or not 0 <= v < math.inf:
                raise ConfigError(f"resources.{key}: expected a non-negative number, got {v!r}")
            values[key] = float(v)
    if values.get("cpus", 1.0) <= 0:
        raise ConfigError("resources.cpus: must be greater than 0")
    if "workers" in raw:
        w = raw["workers"]
        if not isinstance(w, int) or isinstance(w, bool) or w < 1:
            raise ConfigError(f"resources.workers: expected a positive integer, got {w!r}")
        values["workers"] = w
    return Resources(**values)


def _measure_names(measures: dict[str, Any] | None, regs: Any) -> list[str]:
    """The measures a trial of this pipeline runs: those listed, or the default ones when it lists none."""
    return list(measures) if measures is not None else [m.name for m in regs.measures if getattr(m, "default", False)]


def _check_one_owner_per_metric(measures: dict[str, Any] | None, stages: tuple[Stage, ...], regs: Any) -> None:
    """Refuse a method that declares a metric one of the pipeline's measures reports: every trial of it would fail
    (a method may not replace a measure's number, paretolab.study.metric_owners), so say so before any runs."""
    names = _measure_names(measures, regs)
    by_measure = {metric: name for name in names for metric in regs.measures.get(name).metrics}
    for i, stage in enumerate(stages):
        for option in stage.options:
            for metric in regs.methods.get(option.method).metrics:
                if metric in by_measure:
                    raise ConfigError(
                        f"stages[{i}]: method {option.method!r} reports {metric!r}, which measures.{by_measure[metric]} reports "
                        f"too, and a method may not replace a measure's number: drop the measure or the method's metric"
                    )


def _check_objectives_produced(objectives: tuple[Any, ...], task: Any, measures: dict[str, Any] | None, stages: tuple[Stage, ...], resources: Resources, regs: Any,
                               where: str = "objectives") -> None:
    """Refuse an objective (or a constrained metric) that no trial of this pipeline would report (each trial would fail on it)."""
    produced = set(task.metrics) | set(TRIAL_METRICS) | ({"peak_gpu_mb"} if resources.gpus > 0 else set())
    names = _measure_names(measures, regs)
    for name in names:
        produced |= set(regs.measures.get(name).metrics)
    partial: dict[str, str] = {}
    for stage in stages:
        per_option = [set(regs.methods.get(o.method).metrics) for o in stage.options]
        always = set.intersection(*per_option)
        produced |= always
        for metric in set.union(*per_option) - always:
            partial.setdefault(metric, stage.id)
    for i, objective in enumerate(objectives):
        if objective.metric in produced:
            continue
        if objective.metric in partial:
            why = f"only some choices of stage {partial[objective.metric]!r} report it"
        else:
            why = f"neither task {task.name!r} ({', '.join(task.metrics)}), the measures nor the methods of this pipeline report it"
        raise ConfigError(
            f"{where}[{i}].metric: {objective.metric!r} would be missing from trials: {why}; "
            f"pick one of {', '.join(sorted(produced))}"
        )


