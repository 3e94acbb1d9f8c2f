"""A per-layer stage as a trial runs it: the method applied group by group, and the assignment it made kept.

The stage's plan names each group's own values (``StagePlan.layers``); the modules the method
changes (``Method.layer_modules``) are assigned to the groups (``paretolab.plugin_api.layers.assign``),
and the method's ``transform`` runs once per group with ``subject.scope`` set to that group's
modules and the stage's parameters overlaid with the group's. The modules no group names (``rest``)
get the stage's parameters, or stay as they are under ``rest: keep``. The assignment, module by
module, is written as the trial's ``layers.<stage>.json`` artifact and summarised in ``info``.
"""

from __future__ import annotations

import json
from typing import Any

from paretolab.errors import ConfigError
from paretolab.plugin_api.context import TrialContext
from paretolab.plugin_api.layers import REST, assign, groups_of, parse_selector
from paretolab.plugin_api.subject import Subject
from paretolab.records import StagePlan

KEEP = "keep"


def artifact_name(stage: str) -> str:
    return f"layers.{stage}.json"


def apply_by_layer(method: Any, subject: Subject, stage: StagePlan, ctx: TrialContext) -> Subject:
    """Run ``method`` on each layer group of ``stage`` in turn; returns the subject (see the module's docstring)."""
    where = f"stage {stage.stage!r} ({stage.method}) layers"
    if not getattr(method, "layerwise", False):
        raise ConfigError(f"{where}: method {stage.method!r} is not layerwise (it changes the whole model at once); drop `layers`")
    selectors = [sel for name in stage.layers if name != REST for sel in parse_selector(name, where)]
    assignment = assign(method.layer_modules(subject), selectors, where)
    keys = sorted({k for values in stage.layers.values() if values for k in values})
    modules: dict[str, dict[str, Any]] = {}
    for group, members in groups_of(assignment).items():
        overrides = stage.layers.get(group, {})  # rest: the stage's params, unless `rest: keep` (None)
        if overrides is None:  # keep
            modules.update({m: {"group": group, KEEP: True} for m in members})
            continue
        params = {**stage.params, **overrides}
        subject.scope = frozenset(members)
        try:
            subject = method.transform(subject, params, ctx)
        finally:
            if isinstance(subject, Subject):
                subject.scope = None
        if not isinstance(subject, Subject):
            return subject  # apply_plan names the broken return
        modules.update({m: {"group": group, **{k: params.get(k) for k in keys}} for m in members})
    record = {"stage": stage.stage, "method": stage.method, "groups": stage.layers, "modules": modules}
    ctx.add_artifact(artifact_name(stage.stage), json.dumps(record, indent=1, default=str))
    subject.info[f"layers.{stage.stage}"] = summary(modules, keys)
    return subject


def summary(modules: dict[str, dict[str, Any]], keys: list[str]) -> str:
    """``attention: bits=3 (120 modules); mlp: bits=4 (90 modules)``: each group's values and size, in first-seen order."""
    counts: dict[str, int] = {}
    values: dict[str, str] = {}
    for entry in modules.values():
        group = entry["group"]
        counts[group] = counts.get(group, 0) + 1
        values[group] = KEEP if entry.get(KEEP) else ", ".join(f"{k}={entry.get(k)}" for k in keys)
    return "; ".join(f"{g}: {values[g]} ({n} module{'s' if n != 1 else ''})" for g, n in counts.items())
