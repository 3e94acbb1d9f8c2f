"""``paretolab.pick``: the cheapest configuration of a study whose quality holds (see :mod:`paretolab.results.pick`),
its record (Markdown + JSON) and, with ``export``, its model as ``paretolab export`` writes it plus a model card::

    d = paretolab.pick("demo", keep="ppl no_worse 2 % vs none", where="size_bytes <= 0.5 x none")
    print(d.choice.name() if d.choice else d.why)
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

from paretolab.data.outputs import write_atomic
from paretolab.errors import ConfigError
from paretolab.results.decision_record import candidate_effect, decide_study, decision_lines, decision_record
from paretolab.results.pick import Candidate, Decision
from paretolab.results.source import BundleSource
from paretolab.stores.locations import Stores

SERVE = {"gguf": "python -m llama_cpp.server --model {artifact} --host 127.0.0.1",
         "compressed-tensors": "vllm serve {artifact} --host 127.0.0.1"}


def pick(study: str, *, keep: str, where: str | list[str] | tuple[str, ...] = (), cost: str | None = None,
         bundle: str | Path | list[str | Path] | None = None, stores: Stores | None = None, confirm: bool | None = None,
         progress: Any = print) -> Decision:
    """Judge every configuration of ``study`` by ``keep`` (``"ppl no_worse 2 % vs none"``) under the budgets
    ``where`` (``"size_bytes <= 80 MB"``) and return the decision; read from ``bundle`` file(s), else the stores.

    ``confirm``: re-measure the choice (and rivals, and the baseline) on the pipeline's confirm part
    (:mod:`paretolab.api.confirm`); default: when the study has a ``confirm:`` split and is read from stores."""
    budgets = [where] if isinstance(where, str) else list(where)
    if bundle is not None:
        if confirm:
            raise ConfigError("pick: confirming re-applies trials, which needs the study's stores, not a bundle: "
                              "import it first (paretolab bundle import FILE)")
        source: Any = BundleSource([bundle] if isinstance(bundle, (str, Path)) else bundle)
    else:
        from paretolab.stores.locations import resolve_stores

        source = stores = stores or resolve_stores(create=False)
    decision = decide_study(study, source, keep=keep, budgets=budgets, cost=cost)
    if confirm is None:
        confirm = bundle is None and decision.split is not None and decision.choice is not None
    if confirm:
        from paretolab.api.confirm import confirm as confirm_on

        confirm_on(decision, stores=stores, progress=progress)
    return decision


def write_record(decision: Decision, out: str | Path) -> list[Path]:
    """``decision.json`` and ``decision.md`` in folder ``out`` (made if missing); the paths written."""
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    page, data = folder / "decision.md", folder / "decision.json"
    write_atomic(page, "\n".join(decision_lines(decision)))
    write_atomic(data, json.dumps(decision_record(decision), indent=1, default=str) + "\n")
    return [page, data]


def representative(c: Candidate, metric: str) -> dict[str, Any]:
    """The replicate to ship: the trial whose ``metric`` is the median of its configuration's (lower middle when even)."""
    ordered = sorted(c.trials, key=lambda t: (float(t[metric]), int(t["trial"])))
    return ordered[(len(ordered) - 1) // 2]


def export_choice(decision: Decision, out: str | Path, *, stores: Stores | None = None, force: bool = False,
                  command: str = "", progress: Any = print) -> Any:
    """Export the choice's representative replicate (``paretolab export``) with a model card as its README.md."""
    from paretolab.api.export import export

    if decision.choice is None:
        raise ConfigError(f"pick --export: nothing to export: {decision.why}")
    trial = representative(decision.choice, decision.rule.metric)
    return export(decision.study, int(trial["trial"]), out, stores=stores, force=force, progress=progress,
                  card=lambda exported: model_card(decision, trial, exported, command))


def model_card(decision: Decision, trial: dict[str, Any], exported: Any, command: str = "") -> str:
    """The Hugging Face README.md of an exported choice: what it is, the evidence that chose it, its bytes, how to serve it."""
    from paretolab.plugin_api.numbers import metric_value, number, param_value
    from paretolab.version import __version__, code_version

    c = decision.choice
    assert c is not None
    model = f"`{decision.model}`" if decision.model else "the study's base model"
    layers = {k: v for k, v in c.settings.items() if "/" in k.split(".")[-1]}  # per-layer-group settings (bits/attn ...)
    values = [float(t[decision.rule.metric]) for t in c.trials]
    lines = ["---", "library_name: transformers", "tags:", "- paretolab", *[f"- {m}" for m in c.label.split("+") if m != "none"],
             "---", "", f"# {decision.study}: `{c.name()}`", "",
             f"Chosen by paretolab {__version__} (code {code_version()}) from study `{decision.study}`: the "
             f"{'lowest' if decision.lower_cost else 'highest'} `{decision.cost}` among the configurations that keep "
             f"`{decision.rule.words()}`" + (f" within {'; '.join(b.words(decision.references.get(str(b.ratio_to))) for b in decision.budgets)}"
                                            if decision.budgets else "") + ".", ""]
    if command:
        lines += ["Reproduce the decision:", "", "```", command, "```", ""]
    lines += ["## Method and parameters", "", *[f"- `{k}` = {param_value(v)}" for k, v in sorted(c.settings.items())], "",
              f"This directory holds trial {trial['trial']}" + (f", the median replicate of trials {', '.join(map(str, c.numbers))} "
                                                               f"on `{decision.rule.metric}`." if len(c.numbers) > 1 else
                                                               ", the configuration's one trial."), ""]
    if layers:
        lines += ["Per-layer settings:", "", *[f"- `{k}` = {param_value(v)}" for k, v in sorted(layers.items())], ""]
    lines += ["## Evidence", "",
              f"- `{decision.rule.metric}`: {metric_value(decision.rule.metric, statistics.fmean(values))} (mean of "
              f"{len(values)} replicate(s)); against `{decision.rule.baseline}`: "
              + candidate_effect(decision, c) + (" (95 % interval)" if c.low is not None and c.high is not None else "")
              + f" over {c.replicates} pair(s): {c.verdict}",
              f"- `{decision.cost}`: {metric_value(decision.cost, c.cost)} (mean)", *_confirmed(decision), ""]
    lines += ["## Size", "", *[f"- {k}: {number(v, 'bytes')}" for k, v in exported.sizes.items()], ""]
    lines += ["## Serve", "", *_serve(exported), ""]
    lines += [f"Base model: {model}. The full record: `paretolab.json` in this directory.", ""]
    return "\n".join(lines)


def _confirmed(decision: Decision) -> list[str]:
    """The card's line for the confirm part: its evidence, or that the choice was not confirmed on held-out examples."""
    c, conf = decision.choice, decision.confirmation
    again = conf.candidates.get(c.name()) if conf is not None and c is not None else None
    if again is None:
        return ["- not confirmed on examples the search never scored (the interval above is the one that selected it)"]
    held = "held: confirmed" if conf.survived(c) else f"{again.verdict}: NOT confirmed"
    return [f"- on the confirm part ({conf.examples}, never scored by the search): `{decision.rule.metric}` "
            f"{candidate_effect(decision, again)} against `{decision.rule.baseline}`: {held}"]


def _serve(exported: Any) -> list[str]:
    from paretolab.plugin_api import artifacts

    out = exported.out
    kind = exported.artifact.get(artifacts.KIND, "")
    if exported.artifact.get(artifacts.PATH) and kind in SERVE:
        path = out / "artifact" / Path(exported.artifact[artifacts.PATH]).name
        return [f"The method's own {kind} file, as its library wrote it:", "", "```", SERVE[kind].format(artifact=path), "```"]
    compact = any("pack-quantized" in k for k in exported.compact.values())
    return ["vLLM (the dense weights" + (", or compact/ in compressed-tensors" if compact else "") + "):", "", "```",
            f"vllm serve {out / 'compact' if compact else out} --host 127.0.0.1", "```", "",
            "llama.cpp (convert once, then serve):", "", "```",
            f"python convert_hf_to_gguf.py {out} --outfile {out.name}.gguf --outtype f16",
            f"python -m llama_cpp.server --model {out.name}.gguf --host 127.0.0.1", "```"]
