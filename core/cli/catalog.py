"""Commands that list what is installed: `plugins` (methods, tasks, measures, metrics, models) and `models`."""

from __future__ import annotations

import argparse
import json
from typing import Any


def cmd_plugins(args: argparse.Namespace) -> int:
    from paretolab.plugin_api.manager import registries

    regs = registries()
    methods = [m.describe() | {"plugin": regs.methods.owner(m.name), "distribution": _distribution(regs, regs.methods.owner(m.name))} for m in regs.methods]
    if args.json:
        payload = {
            "methods": methods,
            "tasks": [{"name": t.name, "metrics": list(t.metrics)} for t in regs.tasks],
            "measures": [{"name": m.name, "metrics": list(m.metrics), "default": m.default} for m in regs.measures],
            "metrics": [vars(m) for m in regs.metrics],
            "models": [{"name": m.name, "weights": m.weights, "description": m.description} for m in regs.models],
        }
        print(json.dumps(payload, indent=2))
        return 0
    _say("methods:")
    for m in methods:
        dist = f" ({m['distribution']})" if m["distribution"] else ""
        _say(f"  {m['name']}  [{m['kind']}, cost {m['cost_is']}]  from {m['plugin']}{dist}")
        if m["paper"]:
            _say(f"      paper: {m['paper']}")
        if m.get("library"):
            _say(f"      run by: {m['library']}")
        for key, text in m["search_space"].items():
            _say(f"      {key}: {text}")
        if m.get("metrics"):
            _say(f"      reports: {', '.join(m['metrics'])}")
    _say("tasks:")
    for t in regs.tasks:
        _say(f"  {t.name}  -> {', '.join(t.metrics)}")
    _say("measures:")
    for ms in regs.measures:
        _say(f"  {ms.name}{' (default)' if ms.default else ''}  -> {', '.join(ms.metrics)}")
    _say("metrics:")
    for metric in regs.metrics:
        unit = f" [{metric.unit}]" if metric.unit else ""
        _say(f"  {metric.name}{unit}  {metric.direction}{', estimated' if metric.estimated else ''}: {metric.description}")
    _say("models:")
    for model in regs.models:
        _say(f"  {model.name} [weights: {model.weights}]: {model.description}")
    return 0


def _say(text: str) -> None:
    """One line of the listing: a plugin's names and descriptions are its author's text, escaped like any other."""
    from paretolab.data.names import printable

    print(printable(text))


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
