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
    print("methods:")
    for m in methods:
        dist = f" ({m['distribution']})" if m["distribution"] else ""
        print(f"  {m['name']}  [{m['kind']}, cost {m['cost_is']}]  from {m['plugin']}{dist}")
        if m["paper"]:
            print(f"      paper: {m['paper']}")
        for key, text in m["search_space"].items():
            print(f"      {key}: {text}")
        if m.get("metrics"):
            print(f"      reports: {', '.join(m['metrics'])}")
    print("tasks:")
    for t in regs.tasks:
        print(f"  {t.name}  -> {', '.join(t.metrics)}")
    print("measures:")
    for ms in regs.measures:
        print(f"  {ms.name}{' (default)' if ms.default else ''}  -> {', '.join(ms.metrics)}")
    print("metrics:")
    for metric in regs.metrics:
        unit = f" [{metric.unit}]" if metric.unit else ""
        print(f"  {metric.name}{unit}  {metric.direction}{', estimated' if metric.estimated else ''}: {metric.description}")
    print("models:")
    for model in regs.models:
        print(f"  {model.name} [weights: {model.weights}]: {model.description}")
    return 0


def _distribution(regs: Any, owner: str) -> str:
    """A third-party plugin's "distribution version" ("" for paretolab's own)."""
    return "" if owner.startswith("paretolab.") else regs.plugin_versions.get(owner, "unknown")


def cmd_models_list(args: argparse.Namespace) -> int:
    from paretolab.plugin_api.manager import registries

    for model in registries().models:
        state = "cached" if model.is_cached() else "not cached (paretolab models pull " + model.name + ")"
        print(f"{model.name:16s} {state}\n    weights: {model.weights}\n    {model.description}")
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
