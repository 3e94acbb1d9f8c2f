"""Sections a results document adds after its studies' (``extras:`` in results/documents.yaml).

    extras:
      - {sensitivity: results/layers/sensitivity_rtn3}      # a `paretolab sensitivity` run: its table and plot
      - {interaction: layers_prune_x_quant, a: wanda, b: rtn, metrics: [ppl, size_bytes]}
      - {decision: wanda_vs_magnitude, keep: "ppl no_worse 25 % vs none", where: ["size_bytes <= 0.8 x none"]}

``sensitivity`` is a path without suffix, from the repository root, to ``.json`` (the ``sensitivity.json`` that
``paretolab sensitivity`` wrote) and ``.png`` beside it; the document shows the ranked table and links the plot.
``interaction`` is a study of the document, read from its bundle (:mod:`paretolab.results.interaction`).
``decision`` is ``paretolab pick`` on a study of the document, read from its bundle (a bundle re-applies no trial, so
the decision is not confirmed on held-out examples, and says so).
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

from paretolab.errors import ConfigError
from paretolab.plugin_api.numbers import interval_text, number

KINDS = {"sensitivity": ("sensitivity",), "interaction": ("interaction", "a", "b", "metrics", "relative"),
         "decision": ("decision", "keep", "where", "cost")}


def check_extras(raw: Any, studies: tuple[str, ...], where: str) -> tuple[dict[str, Any], ...]:
    """The document's ``extras`` as plain mappings, each checked: one kind, its fields, an interaction of its own studies."""
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise ConfigError(f"{where}.extras: expected a list like [{{sensitivity: results/layers/sens}}, {{interaction: STUDY, a: A, b: B}}]")
    out = []
    for i, item in enumerate(raw):
        at = f"{where}.extras[{i}]"
        kinds = [k for k in KINDS if isinstance(item, dict) and k in item]
        if len(kinds) != 1:
            raise ConfigError(f"{at}: expected one of {{sensitivity: PATH}}, {{interaction: STUDY, a: METHOD, b: METHOD}} or "
                              f"{{decision: STUDY, keep: RULE, where: [BUDGET]}}, got {item!r}")
        allowed = KINDS[kinds[0]]
        unknown = sorted(set(item) - set(allowed))
        if unknown:
            raise ConfigError(f"{at}: unknown field {unknown[0]!r} (fields: {', '.join(allowed)})")
        if kinds[0] == "decision":
            if item["decision"] not in studies:
                raise ConfigError(f"{at}.decision: {item['decision']!r} is not among the document's studies; add it to `studies`")
            if not isinstance(item.get("keep"), str) or not isinstance(item.get("where", []), list):
                raise ConfigError(f"{at}: give keep: RULE and where: [BUDGET, ...] as `paretolab pick` takes them")
        if kinds[0] == "interaction":
            if item["interaction"] not in studies:
                raise ConfigError(f"{at}.interaction: {item['interaction']!r} is not among the document's studies; add it to `studies`")
            if not isinstance(item.get("a"), str) or not isinstance(item.get("b"), str):
                raise ConfigError(f"{at}: give both methods' labels, a: METHOD and b: METHOD")
        out.append(dict(item))
    return tuple(out)


def render_extras(extras: tuple[dict[str, Any], ...], source: Any, root: Path, document: str) -> list[str]:
    """The Markdown sections of ``extras`` for the document at ``root / document``."""
    sections = []
    for item in extras:
        if "sensitivity" in item:
            sections.append(sensitivity_section(root / item["sensitivity"], root / document))
        elif "decision" in item:
            sections.append(decision_section(item, source))
        else:
            sections.append(interaction_section(item, source))
    return sections


def sensitivity_section(base: Path, document: Path) -> str:
    data = json.loads(base.with_suffix(".json").read_text(encoding="utf-8"))
    setting = ", ".join(f"{k}={v}" for k, v in sorted(data["params"].items()))
    head = [f"## Sensitivity: {data['method']} ({setting}) on {len(data['groups'])} layer groups, one at a time", "",
            f"`paretolab sensitivity` on {data['model']}: {data['metric']} {number(data['base'])} unmodified "
            f"({number(data['base_size'], 'bytes')}) over {data['windows']} windows of {data['task'].get('corpus')} "
            f"({data['task'].get('max_tokens')} tokens); each group alone, Δ paired over the same windows with its 95 % "
            "bootstrap interval, ranked by Δ per MB saved (least sensitive first).", ""]
    png = base.with_suffix(".png")
    if png.is_file():
        head += [f"![{data['metric']} change per layer group]({os.path.relpath(png, document.parent)})", ""]
    return "\n".join(head + [sensitivity_table(data), ""])


def sensitivity_table(data: dict[str, Any]) -> str:
    """The ranked table of a ``sensitivity.json`` payload."""
    from paretolab.results.section import markdown_table

    metric = data["metric"]
    rows = [{"rank": i + 1, "group": g["group"], "modules": g["modules"], metric: g["metric"], f"Δ {metric}": g["delta"],
             "95 % interval": f"[{number(g['low'], signed=True)}, {number(g['high'], signed=True)}]", "saves": number(g["bytes_saved"], "bytes"),
             f"Δ {metric} per MB": "" if g.get("per_mb") is None or not math.isfinite(g["per_mb"]) else g["per_mb"],
             "within noise": "yes" if g["low"] <= 0 <= g["high"] else ""} for i, g in enumerate(data["groups"])]
    return markdown_table(rows, list(rows[0]) if rows else ["group"])


def interaction_section(item: dict[str, Any], source: Any) -> str:
    from paretolab.results.interaction import interaction, markdown

    metrics = list(item.get("metrics") or ["ppl", "size_bytes"])
    study = item["interaction"]
    try:
        found = interaction(study, source, item["a"], item["b"], metrics, tuple(item.get("relative") or ()))
    except ConfigError as exc:
        return f"## Interaction: {item['a']} × {item['b']} ({study})\n\nNot available: {exc}\n"
    return f"## Interaction: {item['a']} × {item['b']} ({study})\n\n" + markdown(study, item["a"], item["b"], found)


def decision_section(item: dict[str, Any], source: Any) -> str:
    """``paretolab pick`` on a study of the document, as it prints it (its own heading replaced by the section's)."""
    from paretolab.results.decision_record import decide_study, decision_lines

    study, where = item["decision"], list(item.get("where") or [])
    head = f"## Decision: {study}, keeping `{item['keep']}`" + (f" within `{'; '.join(where)}`" if where else "")
    try:
        decision = decide_study(study, source, keep=item["keep"], budgets=where, cost=item.get("cost"))
    except ConfigError as exc:
        return f"{head}\n\nNot available: {exc}\n"
    command = f"paretolab pick {study} --keep '{item['keep']}'" + "".join(f" --where '{w}'" for w in where)
    return "\n".join([head, "", f"`{command}` on the study's bundle:", "", *decision_lines(decision)[2:]])

