"""A pipeline's ``stages:``: each stage one method or a ``choice`` of methods, each parameter fixed, a list or a range.

Values are checked against the method's own search space (a range inside it, a listed value of the
right type) when the pipeline is parsed, before any trial.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, replace
from typing import Any

from paretolab.errors import ConfigError
from paretolab.study.fields import is_int, is_number, lookup, no_unknown


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
MAX_GROUPS = 1024  # layer groups in one stage: each is its own parameters, checked pairwise for overlap


@dataclass(frozen=True)
class LayerGroup:
    """One group of a per-layer stage (``layers:``): its own values, the stage's ``params`` filling in the rest."""

    name: str  # the canonical selector (``attention``, ``0-9 mlp``, ``3``) or ``rest``
    params: dict[str, ParamSpec]
    keep: bool = False  # ``keep``: the method leaves these modules as they are


@dataclass(frozen=True)
class StageOption:
    method: str
    params: dict[str, ParamSpec]
    layers: tuple[LayerGroup, ...] = ()  # empty: one setting for the whole model


@dataclass(frozen=True)
class Stage:
    id: str
    options: tuple[StageOption, ...]  # one for `method:`, several for `choice:`


def param_prefix(stages: tuple[Stage, ...], stage_id: str, method: str) -> str:
    """Optuna parameter names are `method.param`, or `stage.method.param` if a method occurs twice."""
    count = sum(1 for s in stages for o in s.options if o.method == method)
    return method if count == 1 else f"{stage_id}.{method}"


def layer_param_name(prefix: str, key: str, group: str) -> str:
    """The Optuna name of a parameter given per layer group: ``rtn.bits/attention``, ``rtn.bits/0-9 mlp``."""
    return f"{prefix}.{key}/{group}"


def group_params(option: StageOption, prefix: str) -> list[tuple[str, LayerGroup, str, ParamSpec]]:
    """(Optuna name, group, parameter, value spec) of every value a per-layer stage gives a group, in a fixed order."""
    return [(layer_param_name(prefix, key, group.name), group, key, spec)
            for group in option.layers for key, spec in sorted(group.params.items())]


def to_distribution(param: Choices | Range) -> Any:
    """The Optuna distribution of a searched parameter."""
    from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

    if isinstance(param, Choices):
        return CategoricalDistribution(list(param.values))
    if param.integer:
        return IntDistribution(int(param.low), int(param.high), log=param.log, step=int(param.step or 1))
    return FloatDistribution(float(param.low), float(param.high), log=param.log, step=param.step)


def check_composition(stages: tuple[Stage, ...], regs: Any) -> None:
    """Refuse a method that runs after one that replaced the modules it works on (``Method.works_on`` / ``replaces``):
    it would find nothing to change, and its trials would record the earlier method's numbers under its name."""
    for i, early in enumerate(stages):
        for first in early.options:
            replaced = set(regs.methods.get(first.method).replaces)
            for j, late in enumerate(stages[i + 1:], start=i + 1):
                for then in late.options:
                    gone = sorted(replaced & set(regs.methods.get(then.method).works_on))
                    if gone:
                        raise ConfigError(
                            f"stages[{j}] ({then.method!r}, stage {late.id!r}) runs after stages[{i}] ({first.method!r}, stage {early.id!r}), "
                            f"which replaces the {', '.join(gone)} modules {then.method!r} works on: it would change nothing and its "
                            f"trials would measure {first.method!r} alone; put {then.method!r} first, or drop one of them")


def parse_stage(raw: Any, index: int, regs: Any) -> Stage:
    where = f"stages[{index}]"
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: expected {{method: NAME, params: {{...}}}} or {{choice: [...]}}, got {raw!r}")
    no_unknown(raw, ("method", "params", "layers", "choice", "id"), where + ".")
    stage_id = raw.get("id", f"stage{index}")
    if "choice" in raw:
        if "method" in raw or "params" in raw or "layers" in raw:
            raise ConfigError(f"{where}: give either `method` (with `params`, `layers`) or `choice`, not both")
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
    no_unknown(raw, ("method", "params", "layers", "id"), where + ".")
    method = lookup(regs.methods, raw["method"], f"{where}.method")
    params_raw = raw.get("params") or {}
    if not isinstance(params_raw, dict):
        raise ConfigError(f"{where}.params: expected a mapping, got {params_raw!r}")
    params = _option_params(method, params_raw, f"{where}.params")
    layers = _parse_layers(method, raw["layers"], f"{where}.layers") if "layers" in raw else ()
    return StageOption(method=method.name, params=params, layers=layers)


def _option_params(method: Any, raw: dict[str, Any], where: str) -> dict[str, ParamSpec]:
    known = set(method.search_space()) | set(method.defaults())
    params = {}
    for key, value in raw.items():
        if key not in known:
            close = difflib.get_close_matches(str(key), sorted(known), n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise ConfigError(
                f"{where}.{key}: method {method.name!r} has no parameter {key!r}{hint} "
                f"(known: {', '.join(sorted(known)) or 'none'})"
            )
        params[key] = _check_param(method, key, _parse_param(value, f"{where}.{key}"), f"{where}.{key}")
    return params


def _parse_layers(method: Any, raw: Any, where: str) -> tuple[LayerGroup, ...]:
    """``layers: {GROUP: {param: value | [values] | {low, high}} | keep, ..., rest: keep}`` of one stage."""
    from paretolab.plugin_api.layers import HELP, REST, check_disjoint, parse_selector

    if not method.layerwise:
        from paretolab.plugin_api.manager import registries

        able = sorted(m.name for m in registries().methods if getattr(m, "layerwise", False))
        raise ConfigError(f"{where}: method {method.name!r} takes one setting for the whole model (it is not `layerwise`); "
                          f"drop `layers:`, or use a method that applies per layer group ({', '.join(able) or 'none'})")
    if not isinstance(raw, dict) or not raw:
        raise ConfigError(f"{where}: expected a mapping of layer groups to parameters, like {{attention: {{bits: [4, 8]}}, mlp: {{bits: [2, 3, 4]}}}}; "
                          f"each group is {HELP}")
    groups: list[LayerGroup] = []
    selectors = []
    for key, value in raw.items():
        at = f"{where}.{key}"
        if key == REST:
            if value != "keep":
                raise ConfigError(f"{at}: {value!r}: `rest` takes only `keep` (leave the modules no group names as they are); "
                                  "without it they get the stage's `params`")
            groups.append(LayerGroup(REST, {}, keep=True))
            continue
        found = parse_selector(key, at)
        if value == "keep":
            params: dict[str, ParamSpec] = {}
        elif isinstance(value, dict) and value:
            params = _option_params(method, value, at)
        else:
            raise ConfigError(f"{at}: expected this group's parameters, like {{bits: [2, 3, 4]}}, or `keep`; got {value!r}")
        groups += [LayerGroup(sel.name, params, keep=value == "keep") for sel in found]
        selectors += found
        if len(selectors) > MAX_GROUPS:
            raise ConfigError(f"{at}: {len(selectors)} layer groups in one stage, more than the {MAX_GROUPS} a stage may give "
                              "(each group is its own searched parameters); use wider ranges ('0-9 mlp') instead of 'each'")
    check_disjoint(selectors, where)
    if not selectors:
        raise ConfigError(f"{where}: `rest: keep` alone leaves every module as it is; name at least one group ({HELP})")
    return tuple(groups)


def fixed_params(method: Any, params: dict[str, Any], where: str) -> dict[str, Any]:
    """One setting of ``method`` (``paretolab.apply``): names and values checked as a pipeline's are, defaults filled in."""
    known = set(method.search_space()) | set(method.defaults())
    for key, value in params.items():
        if key not in known:
            close = difflib.get_close_matches(key, sorted(known), n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise ConfigError(f"{where}: method {method.name!r} has no parameter {key!r}{hint} (known: {', '.join(sorted(known)) or 'none'})")
        problem = _value_problem(value, method.search_space().get(key), method.defaults().get(key))
        if problem:
            raise ConfigError(f"{where}.{key}: {value!r} {problem}")
    merged = {**method.defaults(), **params}
    missing = sorted(set(method.search_space()) - set(merged))
    if missing:
        raise ConfigError(f"{where}: method {method.name!r} has no default for {', '.join(missing)}; give "
                          + ", ".join(f"{k}=<value>" for k in missing))
    return merged


def fixed_layers(method: Any, layers: Any, where: str) -> dict[str, dict[str, Any] | None]:
    """One per-layer setting (``paretolab.apply``'s ``layers``) as a StagePlan's: each group one value, checked as a pipeline's."""
    out: dict[str, dict[str, Any] | None] = {}
    for group in _parse_layers(method, layers, where):
        if group.keep:
            out[group.name] = None
            continue
        searched = [k for k, spec in group.params.items() if not isinstance(spec, Fixed)]
        if searched:
            raise ConfigError(f"{where}.{group.name}.{searched[0]}: one setting takes one value, not a list or a range; give a single value")
        out[group.name] = {k: spec.value for k, spec in group.params.items()}
    return out


def _check_param(method: Any, key: str, param: ParamSpec, where: str) -> ParamSpec:
    """Refuse values of the wrong type or outside the method's search space; a float parameter's range stays a float range."""
    from optuna.distributions import (
        CategoricalDistribution,
        FloatDistribution,
        IntDistribution,
    )

    dist = method.search_space().get(key)
    if isinstance(param, Range):
        if isinstance(dist, FloatDistribution) and param.integer:
            param = replace(param, integer=False)  # {low: 0, high: 1} on a float parameter means 0.0..1.0
        default = method.defaults().get(key)
        integer = (isinstance(dist, IntDistribution) or dist is None and is_int(default)
                   or isinstance(dist, CategoricalDistribution) and all(is_int(c) for c in dist.choices))
        if integer and not param.integer:
            step = f" step {param.step}" if param.step is not None else ""
            bad = next(v for v in (param.low, param.high, param.step) if v is not None and not is_int(v))
            raise ConfigError(f"{where}: {bad!r} is not an integer; {method.name}.{key} is an integer: give integer low, high and step, "
                              f"got {param.low}..{param.high}{step} (a fractional value would be recorded as searched but run as an integer)")
        if isinstance(dist, CategoricalDistribution) and not all(is_number(c) for c in dist.choices):
            raise ConfigError(f"{where}: {method.name}.{key} is one of {', '.join(map(repr, dist.choices))}, not a range; give a list")
        values: tuple[Any, ...] = (param.low, param.high)
    else:
        values = param.values if isinstance(param, Choices) else (param.value,)
    default = method.defaults().get(key)
    for value in values:
        problem = _value_problem(value, dist, default)
        if problem:
            raise ConfigError(f"{where}: {value!r} {problem}")
    return param


def _value_problem(value: Any, dist: Any, default: Any) -> str | None:
    """Why ``value`` cannot be this parameter (None when it can), judged by the method's distribution, else its default's type."""
    from optuna.distributions import (
        CategoricalDistribution,
        FloatDistribution,
        IntDistribution,
    )

    if isinstance(dist, (FloatDistribution, IntDistribution)):
        integer = isinstance(dist, IntDistribution)
        if not (is_int(value) if integer else is_number(value)):
            return f"is not {'an integer' if integer else 'a number'}; give {'an integer' if integer else 'a number'} from {dist.low} to {dist.high}"
        if not dist.low <= value <= dist.high:
            return f"is outside the method's search space; give a value from {dist.low} to {dist.high}"
        return None
    if isinstance(dist, CategoricalDistribution):
        choices = list(dist.choices)
        if value in choices:
            return None
        if all(isinstance(c, bool) for c in choices):
            return "is not true or false; give true or false"
        if all(isinstance(c, str) for c in choices):
            close = difflib.get_close_matches(str(value), choices, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            return f"is not one of {', '.join(map(repr, choices))}{hint}; pick one of them"
        if all(is_int(c) for c in choices) and not is_int(value):
            return f"is not an integer; give an integer like {', '.join(map(repr, choices))}"
        if all(is_number(c) for c in choices) and not is_number(value):
            return f"is not a number; give a number like {', '.join(map(repr, choices))}"
        if all(is_number(c) for c in choices) and is_number(value):
            return _sign_problem(value, choices)
        return None  # numeric choices are the method's default search space, not its validity range: the method checks the value
    if default is None or value is None:
        return None
    expected = (
        ("true or false", isinstance(value, bool)) if isinstance(default, bool)
        else ("an integer", is_int(value)) if isinstance(default, int)
        else ("a number", is_number(value)) if isinstance(default, float)
        else ("a string", isinstance(value, str)) if isinstance(default, str)
        else ("", True)
    )
    return None if expected[1] else f"is not {expected[0]} (the default is {default!r}); give {expected[0]}"


def _sign_problem(value: Any, choices: list[Any]) -> str | None:
    """A number of the wrong sign for numeric choices: other numbers than the listed ones are allowed (rtn.bits: 5), but
    where every choice is positive (bits, group sizes, ranks) zero and negatives are refused, but for those listed as
    special values (rtn.group_size's -1: a whole row): every trial would fail on them (or, worse, run)."""
    if not any(c > 0 for c in choices) or value > 0:
        return None
    special = sorted({c for c in choices if c <= 0})
    if value in special:
        return None
    listed = ", ".join(map(repr, choices))
    allowed = "a number greater than 0" + (f" or {' or '.join(map(repr, special))}" if special else "")
    return f"is outside the method's search space ({listed}: other values are allowed, but only {allowed}); give {allowed}"


def _parse_param(value: Any, where: str) -> ParamSpec:
    if isinstance(value, list):
        if not value:
            raise ConfigError(f"{where}: a list means 'choose one of these' and cannot be empty")
        return Choices(tuple(value))
    if isinstance(value, dict):
        no_unknown(value, ("low", "high", "log", "step"), where + ".")
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
        if step is not None:
            if not isinstance(step, (int, float)) or isinstance(step, bool) or not step > 0:
                raise ConfigError(f"{where}.step: expected a number greater than 0, got {step!r}; give a positive step or drop it")
            if log:
                raise ConfigError(f"{where}: a log range cannot have a step (got step {step!r}); drop `step` or `log`")
        integer = isinstance(low, int) and isinstance(high, int) and (step is None or isinstance(step, int))
        return Range(low=low, high=high, log=log, step=step, integer=integer)
    return Fixed(value)
