"""Arms of a study as Optuna parameters: what ``constraints:`` are relative to and ``search.enqueue`` asks for.

An arm is written as claims write it: the methods the choice stages picked (``none`` for the
unmodified model, ``magnitude``, ``magnitude+rtn``), optionally ending in ``[param=value, ...]``;
or as a mapping of Optuna parameter names to values (``{magnitude.sparsity: 0.5}``). Either
becomes the *partial* set of Optuna parameters that selects it: each choice stage's
``<stage>.method`` (the method the label names, else ``none`` where the stage offers it) and each
given value of a searched parameter. A trial belongs to the arm when its parameters hold every
one of those values; an enqueued arm runs with those values and the sampler picks the rest.
"""

from __future__ import annotations

import difflib
from typing import Any

from paretolab.errors import ConfigError
from paretolab.study.report_spec import split_label
from paretolab.study.stages import Fixed, Stage, group_params, param_prefix, to_distribution

NONE = "none"


def searched(stages: tuple[Stage, ...], regs: Any) -> dict[str, tuple[str, str, Any]]:
    """Every Optuna parameter of the stages: name -> (method, param, distribution or Fixed)."""
    out: dict[str, tuple[str, str, Any]] = {}
    for stage in stages:
        if len(stage.options) > 1:
            from optuna.distributions import CategoricalDistribution

            out[f"{stage.id}.method"] = ("", "method", CategoricalDistribution([o.method for o in stage.options]))
        for option in stage.options:
            method = regs.methods.get(option.method)
            prefix = param_prefix(stages, stage.id, option.method)
            space = method.search_space()
            defaults = method.defaults()
            for key in sorted({*space, *option.params, *defaults}):
                given = option.params.get(key)
                if isinstance(given, Fixed):
                    dist: Any = given
                elif given is not None:
                    dist = to_distribution(given)
                elif key in space:
                    dist = space[key]
                else:
                    dist = Fixed(defaults[key])  # a default no search touches
                out[f"{prefix}.{key}"] = (option.method, key, dist)
            for name, group, key, given in group_params(option, prefix):  # per layer group: key ``bits/attention``
                out[name] = (option.method, f"{key}/{group.name}", given if isinstance(given, Fixed) else to_distribution(given))
    return out


def arm_params(stages: tuple[Stage, ...], regs: Any, label: str, where: str) -> dict[str, Any]:
    """The Optuna parameters that select arm ``label`` (``none``, ``wanda``, ``magnitude[sparsity=0.0]``)."""
    if not isinstance(label, str) or not label.strip():
        raise ConfigError(f"{where}: expected an arm like 'none' or 'magnitude[sparsity=0.0]', got {label!r}")
    base, wanted = split_label(label, where=where)
    methods = [m.strip() for m in base.split("+") if m.strip()]
    offered = {o.method for s in stages for o in s.options}
    unknown = [m for m in methods if m != NONE and m not in offered]
    if unknown:
        raise ConfigError(f"{where}: {label!r} names {', '.join(map(repr, unknown))}, which no stage of this pipeline runs "
                          f"(its methods: {', '.join(sorted(offered))})")
    params: dict[str, Any] = {}
    for stage in stages:
        if len(stage.options) < 2:
            continue
        choices = [o.method for o in stage.options]
        picked = [m for m in methods if m in choices]
        if len(picked) > 1:
            raise ConfigError(f"{where}: {label!r} picks {' and '.join(picked)} in the one choice stage {stage.id!r}")
        if picked:
            params[f"{stage.id}.method"] = picked[0]
        elif NONE in choices:
            params[f"{stage.id}.method"] = NONE
    if methods == [NONE] and not params:
        raise ConfigError(f"{where}: arm 'none' needs a choice stage that offers {{method: none}}; add one or name another arm")
    space = searched(stages, regs)
    for key, text in wanted.items():
        names = [n for n, (m, k, _) in space.items() if k == key and m in methods]
        if not names:
            raise ConfigError(f"{where}: no method of {label!r} has a parameter {key!r}")
        for name in names:
            dist = space[name][2]
            if isinstance(dist, Fixed):
                if not same(dist.value, text):
                    raise ConfigError(f"{where}: {name} is fixed at {dist.value!r} in this pipeline, so {key}={text} never runs")
                continue
            params[name] = _value(dist, text, f"{where}: {name}")
    return params


def enqueue_params(stages: tuple[Stage, ...], regs: Any, entry: Any, where: str) -> dict[str, Any]:
    """One ``search.enqueue`` entry (an arm label or {optuna name: value}) as Optuna parameters, checked against the space."""
    if isinstance(entry, str):
        return arm_params(stages, regs, entry, where)
    if not isinstance(entry, dict) or not entry:
        raise ConfigError(f"{where}: expected parameters like {{magnitude.sparsity: 0.5}} or an arm like 'wanda[sparsity=0.5]', got {entry!r}")
    space = searched(stages, regs)
    out = {}
    for name, value in entry.items():
        if name not in space:
            close = difflib.get_close_matches(str(name), [n for n, v in space.items() if not isinstance(v[2], Fixed)], n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise ConfigError(f"{where}.{name}: not a parameter this pipeline searches{hint}")
        dist = space[name][2]
        if isinstance(dist, Fixed):
            raise ConfigError(f"{where}.{name}: fixed at {dist.value!r} in the pipeline; leave it out of the enqueued point")
        out[name] = _value(dist, value, f"{where}.{name}")
    for stage in stages:  # a parameter of a method in a choice stage implies that method's pick
        picked = {space[n][0] for n in out if space[n][0] in {o.method for o in stage.options}}
        if len(stage.options) > 1 and picked:
            if len(picked) > 1 or out.get(f"{stage.id}.method", next(iter(picked))) not in picked:
                raise ConfigError(f"{where}: gives parameters of {', '.join(sorted(picked))} but one trial runs one method of stage {stage.id!r}")
            out[f"{stage.id}.method"] = next(iter(picked))
    return out


def in_arm(params: dict[str, Any], wanted: dict[str, Any]) -> bool:
    """Whether a trial with Optuna ``params`` belongs to the arm selected by ``wanted``."""
    return all(name in params and same(params[name], value) for name, value in wanted.items())


def same(value: Any, other: Any) -> bool:
    """Equal as numbers when both read as numbers (0.3 == '0.3'), else as text."""
    try:
        return abs(float(value) - float(other)) <= 1e-9 * max(1.0, abs(float(other)))
    except (TypeError, ValueError):
        return str(value) == str(other)


def _value(dist: Any, given: Any, where: str) -> Any:
    """``given`` (a value, or the text of a label's bracket) as a value of ``dist``; refused when outside it."""
    from optuna.distributions import CategoricalDistribution, IntDistribution

    if isinstance(dist, CategoricalDistribution):
        for choice in dist.choices:
            if same(choice, given):
                return choice
        raise ConfigError(f"{where}: {given!r} is not one of its values {list(dist.choices)}")
    try:
        value: Any = float(given)
    except (TypeError, ValueError):
        raise ConfigError(f"{where}: expected a number, got {given!r}") from None
    if isinstance(dist, IntDistribution):
        if value != int(value):
            raise ConfigError(f"{where}: expected an integer, got {given!r}")
        value = int(value)
    if not dist._contains(dist.to_internal_repr(value)):
        step = f" in steps of {dist.step}" if getattr(dist, "step", None) else ""
        raise ConfigError(f"{where}: {given!r} is outside its range [{dist.low}, {dist.high}]{step}")
    return value


def check_claim_arms(raw: dict[str, Any], claims: tuple[Any, ...], stages: tuple[Stage, ...], regs: Any) -> None:
    """Each claim compares arms the search produces, and two different ones: ``gptq`` where no stage runs gptq,
    ``cat[transform=hadamard]`` where transform is fixed to cat, or ``rtn`` against ``rtn[bits=4]`` (the same trials on
    both sides) would never get a verdict, so they are refused with the pipeline. Two settings of one method
    (``kquant[type=Q4_K_M]`` against ``kquant[type=Q4_0]``) are two arms when the search gives both values."""
    places = [f"claims[{i}]" for i in range(len(claims))] if "claims" in raw else ["claim"]
    for where, claim in zip(places, claims):
        if claim.target is not None:  # a value claim compares no arms
            continue
        arms = {}
        for key in ("method", "baseline", "reference"):
            label = getattr(claim, key)
            if not label:
                continue
            try:
                arms[key] = arm_params(stages, regs, label, f"{where}.{key}")
            except ConfigError as exc:
                raise ConfigError(f"{exc} (claim {claim.text!r}); name an arm the search runs, or add the value to the "
                                  "method's params") from None
        method, baseline = arms["method"], arms["baseline"]
        if not any(not same(method[k], baseline[k]) for k in method.keys() & baseline.keys()):
            raise ConfigError(f"{where}.baseline: claim {claim.text!r} compares {claim.method!r} with {claim.baseline!r}, which "
                              "select the same trials (no parameter tells them apart); name a setting in which they differ, "
                              "e.g. method[param=a] against method[param=b]")
