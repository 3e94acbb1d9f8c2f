""""Reproduce": the study's pipeline with one trial's parameters fixed, as YAML to run again."""

from __future__ import annotations

import copy
from typing import Any

import yaml


def reproduce_pipeline(pipeline: dict[str, Any], params: dict[str, Any], *, study: str, number: int) -> dict[str, Any]:
    """The pipeline as plain data, each choice resolved and each searched parameter fixed to the trial's value.

    ``params`` are the trial's Optuna parameters: ``method.param`` (``stageN.method.param`` when
    a method occurs in two stages) and ``stageN.method`` for a choice.
    """
    out = copy.deepcopy(pipeline)
    stages = []
    for index, stage in enumerate(pipeline.get("stages") or []):
        stage_id = str(stage.get("id", f"stage{index}"))
        option = stage
        if "choice" in stage:
            chosen = params.get(f"{stage_id}.method")
            option = next((o for o in stage["choice"] if o.get("method") == chosen), stage["choice"][0])
        method = str(option["method"])
        fixed = dict(option.get("params") or {})
        layers = _each_expanded(option.get("layers"))
        prefixes = (f"{stage_id}.{method}.", f"{method}.")
        for name, value in params.items():
            for prefix in prefixes:
                if name.startswith(prefix) and not name.endswith(".method"):
                    key, _, group = name[len(prefix):].partition("/")  # ``bits/attention``: a per-layer group's value
                    if group:
                        layers.setdefault(group, {})[key] = value
                    else:
                        fixed[key] = value
                    break
        new: dict[str, Any] = {"method": method}
        if "id" in stage:
            new["id"] = stage["id"]
        if fixed:
            new["params"] = fixed
        if layers:
            new["layers"] = layers
        stages.append(new)
    out["stages"] = stages
    out["name"] = f"{pipeline.get('name', study)}-trial{number}"
    search = dict(out.get("search") or {})
    search.update(sampler="random", trials=1)
    for key in ("population_size", "enqueue", "pruner"):  # points and stopping rules of the search, not of one trial
        search.pop(key, None)
    out["search"] = search
    for key in ("claim", "claims", "frontiers"):  # they compare the choice's arms: one trial has only its own
        out.pop(key, None)
    kept = [c for c in out.get("constraints") or [] if not (isinstance(c, dict) and "max_ratio_to" in c)]  # a ratio to another arm
    if kept:
        out["constraints"] = kept
    else:
        out.pop("constraints", None)
    return out


def _each_expanded(layers: Any) -> dict[str, Any]:
    """A stage's ``layers:`` with each ``each A-B`` group written out as one group per layer (the trial's values go there)."""
    from paretolab.plugin_api.layers import parse_selector

    out: dict[str, Any] = {}
    for key, value in (layers or {}).items():
        if str(key).split()[0] == "each":
            for sel in parse_selector(key, "layers"):
                out[sel.name] = copy.deepcopy(value)
        else:
            out[str(key)] = copy.deepcopy(value)
    return out


def reproduce_yaml(pipeline: dict[str, Any], params: dict[str, Any], *, study: str, number: int) -> str:
    """``reproduce_pipeline`` as a YAML file with a header saying where it came from."""
    data = reproduce_pipeline(pipeline, params, study=study, number=number)
    header = f"# trial {number} of study {study!r} with its parameters fixed; run: paretolab run THIS_FILE\n"
    return header + yaml.safe_dump(data, sort_keys=False, default_flow_style=None)
