"""Commands that list what is installed: `plugins` (methods, tasks, measures, metrics, models) and `models`."""

from __future__ import annotations

import argparse
import json
from typing import Any


def cmd_plugins(args: argparse.Namespace) -> int:
    """Everything registered; ``NAME``: one method's details (or one task, measure, metric or model); ``--kind``: one kind's methods."""
    from paretolab.plugin_api.manager import registries

    regs = registries()
    name, kind = getattr(args, "name", None), getattr(args, "kind", None)
    found = _find(regs, name, kind)
    methods = [_described(regs, m) for m in regs.methods if (not kind or m.kind == kind) and (not name or m.name == name)]
    if args.json:
        payload: dict[str, list[Any]] = {"methods": methods}
        if not kind and found != "method":
            payload.update({
                "tasks": [{"name": t.name, "metrics": list(t.metrics)} for t in regs.tasks],
                "measures": [{"name": m.name, "metrics": list(m.metrics), "default": m.default} for m in regs.measures],
                "metrics": [vars(m) for m in regs.metrics],
                "models": [{"name": m.name, "weights": m.weights, "description": m.description} for m in regs.models],
            })
        if name:  # one entry: the lists that hold it
            payload = {key: hits for key, entries in payload.items() if (hits := [e for e in entries if e["name"] == name])}
        print(json.dumps(payload, indent=2))
        return 0
    if kind or found == "method":
        _methods(methods, regs, detail=bool(name))
        return 0
    if name:  # a task, measure, metric or model
        _others(regs, found, name)
        return 0
    _methods(methods, regs, detail=False)
    _others(regs, None, None)
    return 0


def _find(regs: Any, name: str | None, kind: str | None) -> str | None:
    """Which registry holds ``name`` ("method", "task", ...); a name or kind nothing registered is one line with the closest."""
    from paretolab.errors import ConfigError

    kinds = sorted({m.kind for m in regs.methods})
    if kind and kind not in kinds:
        raise ConfigError(f"no method of kind {kind!r}; kinds: {', '.join(kinds)}")
    if not name:
        return None
    for where, registry in (("method", regs.methods), ("task", regs.tasks), ("measure", regs.measures), ("metric", regs.metrics),
                            ("model", regs.models)):
        if name in registry:
            if kind and where != "method" or kind and regs.methods.get(name).kind != kind:
                raise ConfigError(f"{name!r} is no method of kind {kind!r}; `paretolab plugins {name}` shows it")
            return where
    close = regs.methods.closest(name) or regs.metrics.closest(name)
    hint = f"; did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
    raise ConfigError(f"nothing installed is named {name!r}{hint} (`paretolab plugins` lists every method, task, measure, metric and model)")


def _described(regs: Any, method: Any) -> dict[str, Any]:
    owner = regs.methods.owner(method.name)
    return method.describe() | {"plugin": owner, "distribution": _distribution(regs, owner)}


DETAILS = ("works_on", "replaces", "lossless", "lossless_setting", "preserves_output", "inert_params")


def _methods(methods: list[dict[str, Any]], regs: Any, *, detail: bool) -> None:
    """Each method: kind, cost, per-layer where it takes ``layers:``, paper, library, search space, what it reports (its
    metric families once each); ``detail``: also what else it declares and each reported metric's unit and meaning."""
    from paretolab.cli.listing import names_text

    _say("methods:")
    for m in methods:
        dist = f" ({m['distribution']})" if m["distribution"] else ""
        marks = ", ".join([m["kind"], f"cost {m['cost_is']}", *(["per-layer"] if m.get("layerwise") else [])])
        _say(f"  {m['name']}  [{marks}]  from {m['plugin']}{dist}")
        if m["paper"]:
            _say(f"      paper: {m['paper']}")
        if m.get("library"):
            _say(f"      run by: {m['library']}")
        if m.get("layerwise") and detail:
            _say("      per-layer: takes `layers:` in a pipeline and `paretolab sensitivity` (docs/guides/layers.md)")
        for key, text in m["search_space"].items():
            _say(f"      {key}: {text}")
        for key in DETAILS if detail else ():
            if key in m:
                _say(f"      {key.replace('_', ' ')}: {m[key] if not isinstance(m[key], list) else ', '.join(map(str, m[key]))}")
        if m.get("metrics"):
            _say(f"      reports: {names_text(m['metrics'])}")
            if detail:
                _metric_lines([regs.metrics.get(n) for n in m["metrics"] if n in regs.metrics], indent=8)


def _others(regs: Any, only: str | None, name: str | None) -> None:
    """Tasks, measures, metrics and models (``only``: the one registry ``name`` is in, that entry alone)."""
    from paretolab.cli.listing import names_text

    if only in (None, "task"):
        _say("tasks:")
        for t in (t for t in regs.tasks if name in (None, t.name)):
            _say(f"  {t.name}  -> {names_text(t.metrics)}")
    if only in (None, "measure"):
        _say("measures:")
        for ms in (ms for ms in regs.measures if name in (None, ms.name)):
            _say(f"  {ms.name}{' (default)' if ms.default else ''}  -> {names_text(ms.metrics)}")
    if only in (None, "metric"):
        _say("metrics:")
        _metric_lines([m for m in regs.metrics if name in (None, m.name)], indent=2)
    if only in (None, "model"):
        _say("models:")
        for model in (m for m in regs.models if name in (None, m.name)):
            _say(f"  {model.name} [weights: {model.weights}]: {model.description}")


def _metric_lines(metrics: list[Any], indent: int) -> None:
    """One line per metric family: its name pattern, unit, direction and the first member's description."""
    from paretolab.cli.listing import families

    by_name = {m.name: m for m in metrics}
    for family in families(by_name, same=lambda n: (by_name[n].unit, by_name[n].direction, by_name[n].estimated)):
        metric = by_name[family.first]
        unit = f" [{metric.unit}]" if metric.unit else ""
        described = {by_name[n].description for n in family.members}
        said = metric.description if len(described) == 1 else f"as {metric.name}: {metric.description}"
        _say(f"{' ' * indent}{family.text()}{unit}  {metric.direction}{', estimated' if metric.estimated else ''}: {said}")


def _say(text: str) -> None:
    """One listing entry, in lines of at most 200 characters: a plugin's names and descriptions are its author's text,
    escaped like any other."""
    from paretolab.cli.listing import lines
    from paretolab.data.names import printable

    shown = printable(text)
    for line in lines(shown, len(shown) - len(shown.lstrip(" "))):
        print(line)


def _distribution(regs: Any, owner: str) -> str:
    """A third-party plugin's "distribution version" ("" for paretolab's own)."""
    return "" if owner.startswith("paretolab.") else regs.plugin_versions.get(owner, "unknown")


def cmd_models_list(args: argparse.Namespace) -> int:
    from paretolab.data.names import printable
    from paretolab.plugin_api.manager import registries

    for model in registries().models:
        state = "cached" if model.is_cached() else "not cached (paretolab models pull " + model.name + ")"
        print(printable(f"{model.name:16s} {state}"), printable(f"    weights: {model.weights}"), printable(f"    {model.description}"), sep="\n")
    print("Any local model directory or Hugging Face id (org/name) also works as `model:`.")
    return 0


def cmd_models_pull(args: argparse.Namespace) -> int:
    import time

    from paretolab.models import resolve_model

    source = resolve_model(args.name)
    start = time.perf_counter()
    where = source.pull()
    print(f"{args.name}: ready at {where} ({time.perf_counter() - start:.1f} s)")
    return 0
