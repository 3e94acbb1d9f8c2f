"""The pipeline YAML: parsed into a StudySpec and validated, with errors that name field and value."""

from __future__ import annotations

import difflib
import hashlib
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from paretolab.errors import ConfigError, UnknownNameError

SAMPLERS = ("nsga2", "tpe", "random", "grid")
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$")


@dataclass(frozen=True)
class Fixed:
    value: Any


@dataclass(frozen=True)
class Choices:
    values: tuple[Any, ...]


@dataclass(frozen=True)
class Range:
    low: float
    high: float
    log: bool = False
    step: float | None = None
    integer: bool = False


ParamSpec = Fixed | Choices | Range


@dataclass(frozen=True)
class StageOption:
    method: str
    params: dict[str, ParamSpec]


@dataclass(frozen=True)
class Stage:
    id: str
    options: tuple[StageOption, ...]  # one for `method:`, several for `choice:`


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
    raw: dict[str, Any] = field(default_factory=dict, compare=False)

    def pipeline_hash(self) -> str:
        """Identity of the study's definition; `search.trials` is left out so a study can be extended."""
        data = json.loads(json.dumps(self.raw, sort_keys=True, default=str))
        data.get("search", {}).pop("trials", None)
        return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]

    def methods(self) -> list[str]:
        return sorted({o.method for s in self.stages for o in s.options})


TOP_KEYS = ("name", "model", "task", "stages", "objectives", "search", "resources", "measures", "description")


def load_spec(path: str | Path) -> StudySpec:
    """Read and validate a pipeline file."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"pipeline file {str(path)!r} does not exist")
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from exc
    return parse_spec(raw, source=str(path))


def parse_spec(raw: Any, *, source: str = "pipeline") -> StudySpec:
    """Validate plain data against the registries and build a StudySpec."""
    from paretolab.plugin_manager import registries

    regs = registries()
    if not isinstance(raw, dict):
        raise ConfigError(f"{source}: expected a mapping at the top level, got {type(raw).__name__}")
    _no_unknown(raw, TOP_KEYS, "")
    name = _require(raw, "name", str, "")
    if not NAME_RE.match(name):
        raise ConfigError(f"name: {name!r} must start with a letter or digit and use only letters, digits, _ . -")
    model = _require(raw, "model", str, "")
    task_raw = raw.get("task")
    if isinstance(task_raw, str):
        task_raw = {"name": task_raw}
    if not isinstance(task_raw, dict) or "name" not in task_raw:
        raise ConfigError(f"task: expected a mapping with a `name` (e.g. {{name: perplexity, corpus: pydoc}}), got {task_raw!r}")
    task_options = {k: v for k, v in task_raw.items() if k != "name"}
    task_name = task_raw["name"]
    task = _lookup(regs.tasks, task_name, "task.name")
    from paretolab.options import parse_options

    parse_options(task.options, task_options, where="task")  # validate now, parse again in workers

    stages_raw = raw.get("stages")
    if not isinstance(stages_raw, list) or not stages_raw:
        raise ConfigError("stages: expected a non-empty list of {method: ...} or {choice: [...]} entries")
    stages = tuple(_parse_stage(s, i, regs) for i, s in enumerate(stages_raw))
    ids = [s.id for s in stages]
    if len(set(ids)) != len(ids):
        raise ConfigError(f"stages: stage ids must be unique, got {ids}")

    from paretolab.calibration import check_calibration_corpus

    check_calibration_corpus(stages, task_name, task_options)  # before any trial calibrates on the test text
    measures = _parse_measures(raw.get("measures"), regs)
    objectives = _parse_objectives(raw.get("objectives"), regs)
    search = _parse_search(raw.get("search") or {})
    resources = _parse_resources(raw.get("resources") or {})
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
        raw=raw,
    )


def _parse_stage(raw: Any, index: int, regs: Any) -> Stage:
    where = f"stages[{index}]"
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: expected {{method: NAME, params: {{...}}}} or {{choice: [...]}}, got {raw!r}")
    _no_unknown(raw, ("method", "params", "choice", "id"), where + ".")
    stage_id = raw.get("id", f"stage{index}")
    if "choice" in raw:
        if "method" in raw or "params" in raw:
            raise ConfigError(f"{where}: give either `method` (with `params`) or `choice`, not both")
        choices = raw["choice"]
        if not isinstance(choices, list) or len(choices) < 2:
            raise ConfigError(f"{where}.choice: expected a list of at least two {{method: ...}} entries, got {choices!r}")
        options = tuple(_parse_option(c, f"{where}.choice[{j}]", regs) for j, c in enumerate(choices))
        methods = [o.method for o in options]
        if len(set(methods)) != len(methods):
            raise ConfigError(f"{where}.choice: each method may appear once, got {methods}")
    else:
        options = (_parse_option(raw, where, regs),)
    return Stage(id=str(stage_id), options=options)


def _parse_option(raw: Any, where: str, regs: Any) -> StageOption:
    if not isinstance(raw, dict) or "method" not in raw:
        raise ConfigError(f"{where}: expected a mapping with `method`, got {raw!r}")
    _no_unknown(raw, ("method", "params", "id"), where + ".")
    method = _lookup(regs.methods, raw["method"], f"{where}.method")
    params_raw = raw.get("params") or {}
    if not isinstance(params_raw, dict):
        raise ConfigError(f"{where}.params: expected a mapping, got {params_raw!r}")
    known = set(method.search_space()) | set(method.defaults())
    params = {}
    for key, value in params_raw.items():
        if key not in known:
            close = difflib.get_close_matches(key, sorted(known), n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise ConfigError(
                f"{where}.params.{key}: method {method.name!r} has no parameter {key!r}{hint} "
                f"(known: {', '.join(sorted(known)) or 'none'})"
            )
        params[key] = _parse_param(value, f"{where}.params.{key}")
    return StageOption(method=method.name, params=params)


def _parse_param(value: Any, where: str) -> ParamSpec:
    if isinstance(value, list):
        if not value:
            raise ConfigError(f"{where}: a list means 'choose one of these' and cannot be empty")
        return Choices(tuple(value))
    if isinstance(value, dict):
        _no_unknown(value, ("low", "high", "log", "step"), where + ".")
        if "low" not in value or "high" not in value:
            raise ConfigError(f"{where}: a range needs `low` and `high`, got {value!r}")
        low, high = value["low"], value["high"]
        for key, bound in (("low", low), ("high", high)):
            if not isinstance(bound, (int, float)) or isinstance(bound, bool):
                raise ConfigError(f"{where}.{key}: expected a number, got {bound!r}")
        if low > high:
            raise ConfigError(f"{where}: low ({low}) is greater than high ({high})")
        log = value.get("log", False)
        if not isinstance(log, bool):
            raise ConfigError(f"{where}.log: expected true or false, got {log!r}")
        if log and low <= 0:
            raise ConfigError(f"{where}: a log range needs low > 0, got {low}")
        step = value.get("step")
        integer = isinstance(low, int) and isinstance(high, int) and (step is None or isinstance(step, int))
        return Range(low=low, high=high, log=log, step=step, integer=integer)
    return Fixed(value)


def _parse_measures(raw: Any, regs: Any) -> dict[str, dict[str, Any]] | None:
    if raw is None:
        return None
    if isinstance(raw, list):
        raw = {name: {} for name in raw}
    if not isinstance(raw, dict):
        raise ConfigError(f"measures: expected a list of measure names or a mapping name -> options, got {raw!r}")
    from paretolab.options import parse_options

    out = {}
    for name, options in raw.items():
        measure = _lookup(regs.measures, name, f"measures.{name}")
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
        _no_unknown(item, ("metric", "direction"), where + ".")
        metric = _lookup(regs.metrics, item["metric"], f"{where}.metric")
        direction = item.get("direction", metric.direction)
        if direction not in ("minimize", "maximize"):
            raise ConfigError(f"{where}.direction: expected minimize or maximize, got {direction!r}")
        out.append(Objective(metric.name, direction))
    names = [o.metric for o in out]
    if len(set(names)) != len(names):
        raise ConfigError(f"objectives: each metric may appear once, got {names}")
    return tuple(out)


def _parse_search(raw: Any) -> SearchSpec:
    if not isinstance(raw, dict):
        raise ConfigError(f"search: expected a mapping, got {raw!r}")
    _no_unknown(raw, ("sampler", "trials", "seed", "trial_timeout_s", "population_size"), "search.")
    sampler = raw.get("sampler", "nsga2")
    if sampler not in SAMPLERS:
        close = difflib.get_close_matches(str(sampler), SAMPLERS, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise ConfigError(f"search.sampler: unknown sampler {sampler!r}{hint} (known: {', '.join(SAMPLERS)})")
    trials = raw.get("trials", 12)
    if not isinstance(trials, int) or isinstance(trials, bool) or trials < 1:
        raise ConfigError(f"search.trials: expected a positive integer, got {trials!r}")
    seed = raw.get("seed", 0)
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise ConfigError(f"search.seed: expected an integer, got {seed!r}")
    timeout = raw.get("trial_timeout_s", 600)
    if not isinstance(timeout, (int, float)) or isinstance(timeout, bool) or timeout <= 0:
        raise ConfigError(f"search.trial_timeout_s: expected a positive number of seconds, got {timeout!r}")
    population = raw.get("population_size")
    if population is not None and (not isinstance(population, int) or population < 2):
        raise ConfigError(f"search.population_size: expected an integer >= 2, got {population!r}")
    return SearchSpec(sampler=sampler, trials=trials, seed=seed, trial_timeout_s=float(timeout), population_size=population)


def _parse_resources(raw: Any) -> Resources:
    if not isinstance(raw, dict):
        raise ConfigError(f"resources: expected a mapping, got {raw!r}")
    _no_unknown(raw, ("cpus", "gpus", "memory_gb", "workers"), "resources.")
    values = {}
    for key in ("cpus", "gpus", "memory_gb"):
        if key in raw:
            v = raw[key]
            if not isinstance(v, (int, float)) or isinstance(v, bool) or v < 0:
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


def _require(raw: dict[str, Any], key: str, typ: type, prefix: str) -> Any:
    if key not in raw:
        raise ConfigError(f"{prefix}{key}: required field is missing")
    value = raw[key]
    if not isinstance(value, typ) or (isinstance(value, str) and not value.strip()):
        raise ConfigError(f"{prefix}{key}: expected a {typ.__name__}, got {value!r}")
    return value


def _no_unknown(raw: dict[str, Any], allowed: tuple[str, ...], prefix: str) -> None:
    for key in raw:
        if key not in allowed:
            close = difflib.get_close_matches(str(key), allowed, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise ConfigError(f"{prefix}{key}: unknown field{hint} (allowed: {', '.join(allowed)})")


def _lookup(registry: Any, name: Any, where: str) -> Any:
    if not isinstance(name, str):
        raise ConfigError(f"{where}: expected a name, got {name!r}")
    try:
        return registry.get(name)
    except UnknownNameError as exc:
        raise ConfigError(f"{where}: {exc}") from None
