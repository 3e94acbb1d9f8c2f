"""``paretolab sensitivity``: what a method costs on each layer group alone, and which groups can take it.

For each group (each decoder layer, each layer's attention and MLP, or the groups named), the
method runs on that group only (a per-layer stage with ``rest: keep``, through the trial's own
``apply_plan``), the task scores the model on the same windows as the unmodified one, and the
quality cost is the paired difference (``ppl`` of the group's model minus the base's, with its
95 % paired-bootstrap interval over the windows) next to the bytes the group saves. The table,
ranked least sensitive first (the smallest cost per byte saved), goes to ``sensitivity.json`` and
``sensitivity.md``; the plot to ``sensitivity.png``/``.svg``.

The ranking seeds a search: ``greedy`` takes the groups in that order until the model fits a size
budget, and gives the result as a ``layers:`` block (and a ``search.enqueue`` point) for a
per-layer pipeline. Adding up single-group costs assumes they do not interact; the study that
runs the assignment is what measures it.
"""

from __future__ import annotations

import json
import math
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from paretolab.data.outputs import check_export_dir, write_text, writing
from paretolab.errors import ConfigError
from paretolab.plugin_api.numbers import interval_text, number
from paretolab.plugin_api.layers import REST, layer_index, parse_selector
from paretolab.plugin_api.subject import Subject
from paretolab.records import StagePlan

RECORD = "sensitivity.json"
BY = ("layer", "layer-kind", "kind")
TASK = {"name": "perplexity", "corpus": "pydoc", "max_tokens": 4096, "context": 512, "stride": 512}


@dataclass
class GroupCost:
    group: str
    modules: int
    metric: float  # the task's metric with the method on this group alone
    delta: float  # metric - the base's, on the same windows
    low: float  # its 95 % paired-bootstrap interval
    high: float
    bytes_saved: float  # size_bytes of the base minus this model's

    @property
    def per_mb(self) -> float:
        """Cost per MB saved (the greedy order); a group that saves nothing goes last."""
        return self.delta / (self.bytes_saved / 1e6) if self.bytes_saved > 0 else math.inf


@dataclass
class Sensitivity:
    model: str
    method: str
    params: dict[str, Any]
    metric: str
    base: float
    base_size: float
    windows: int
    task: dict[str, Any]
    groups: list[GroupCost] = field(default_factory=list)

    def ranking(self) -> list[GroupCost]:
        """Least sensitive first: the smallest quality cost per MB saved."""
        return sorted(self.groups, key=lambda g: (g.per_mb, g.delta))

    def greedy(self, budget_bytes: float) -> dict[str, Any]:
        """The groups to give the method, in ranking order, until size_bytes (predicted by adding the groups' savings) fits."""
        size, chosen = self.base_size, []
        for g in self.ranking():
            if size <= budget_bytes:
                break
            if g.bytes_saved > 0:
                chosen.append(g)
                size -= g.bytes_saved
        return {"budget_bytes": budget_bytes, "predicted_size_bytes": size, "fits": size <= budget_bytes,
                "predicted_delta": sum(g.delta for g in chosen), "groups": [g.group for g in chosen],
                "layers": {**{g.group: dict(self.params) for g in chosen}, REST: "keep"}}

    def to_json(self) -> dict[str, Any]:
        return {**{k: v for k, v in asdict(self).items() if k != "groups"},
                "groups": [{**asdict(g), "per_mb": None if math.isinf(g.per_mb) else g.per_mb} for g in self.ranking()]}

    def markdown(self) -> str:
        from paretolab.results.extras import sensitivity_table

        setting = ", ".join(f"{k}={v}" for k, v in sorted(self.params.items()))
        head = (f"Sensitivity of {self.model} to {self.method} ({setting}) on one layer group at a time: {self.metric} "
                f"{number(self.base)} unmodified ({number(self.base_size, 'bytes')}), over {self.windows} windows of "
                f"{self.task.get('corpus')}; Δ is paired over the same windows, least sensitive per MB saved first.")
        return head + "\n\n" + sensitivity_table(self.to_json()) + "\n"


def layer_groups(by: str | list[str], n_layers: int) -> list[str]:
    """The groups ``--by`` names: each layer, each layer's attention and MLP, the two kinds, or the selectors given."""
    top = n_layers - 1
    if by == "layer":
        names = [f"each 0-{top}"]
    elif by == "layer-kind":
        names = [f"each 0-{top} attention", f"each 0-{top} mlp"]
    elif by == "kind":
        names = ["attention", "mlp"]
    elif isinstance(by, list) and by:
        names = by
    else:
        raise ConfigError(f"--by {by!r}: give one of {', '.join(BY)}, or --group SELECTOR (repeatable)")
    return [sel.name for name in names for sel in parse_selector(name, "--group")]


def sensitivity(model: str | Subject, method: str, params: dict[str, Any], *, by: str | list[str] = "layer",
                task: dict[str, Any] | None = None, seed: int = 0, progress: Any = print) -> Sensitivity:
    """Measure ``method`` with ``params`` on each group alone (see the module's docstring)."""
    from paretolab.models import load_subject
    from paretolab.plugin_api.manager import registries
    from paretolab.study.fields import lookup
    from paretolab.study.stages import fixed_params

    methods, tasks = registries().methods, registries().tasks
    found = lookup(methods, method, "--method")
    if not found.layerwise:
        able = sorted(m.name for m in methods if getattr(m, "layerwise", False))
        raise ConfigError(f"--method {method}: it changes the whole model at once (not `layerwise`); pick one of {', '.join(able)}")
    setting = fixed_params(found, params, "--params")
    task = {**TASK, **(task or {})}
    scorer = lookup(tasks, task["name"], "task.name")
    metric = scorer.metrics[0]
    base = load_subject(model) if isinstance(model, str) else model
    name = model if isinstance(model, str) else base.model_name
    n_layers = 1 + max((i for m in found.layer_modules(base) if (i := layer_index(m)) is not None), default=-1)
    if n_layers == 0:
        raise ConfigError(f"{name}: its modules have no numbered layers (model.layers.N...); give the groups as --group SELECTOR")
    groups = layer_groups(by, n_layers)
    progress(f"scoring {name} unmodified on {task.get('corpus')} ...")
    ref, ref_size, ref_samples = _score(base.copy(), [], scorer, task, seed)
    out = Sensitivity(model=name, method=found.name, params=setting, metric=metric, base=ref[metric], base_size=ref_size,
                      windows=ref_samples.n, task=task)
    from paretolab.stats import paired_difference

    for i, group in enumerate(groups):
        plan = [StagePlan("s0", found.name, dict(setting), layers={group: {}, REST: None})]
        got, size, samples = _score(base.copy(), plan, scorer, task, seed)
        diff = paired_difference(samples, ref_samples)
        modules = sum(1 for m in found.layer_modules(base) if _holds(group, m))
        out.groups.append(GroupCost(group, modules, got[metric], diff.diff, diff.low, diff.high, ref_size - size))
        progress(f"  [{i + 1}/{len(groups)}] {group}: {metric} {number(got[metric])} (Δ {interval_text(diff.diff, diff.low, diff.high, signed=True)}), "
                 f"saves {number(ref_size - size, 'bytes')}")
    return out


def _holds(group: str, module: str) -> bool:
    return any(sel.matches(module) for sel in parse_selector(group, "group"))


def _score(subject: Subject, plan: list[StagePlan], scorer: Any, task: dict[str, Any], seed: int) -> tuple[dict[str, float], float, Any]:
    """The task's metrics, size_bytes and the per-window samples of ``subject`` after ``plan``."""
    import torch

    from paretolab.measure.measures import NoOptions, Size
    from paretolab.plugin_api.context import TrialContext
    from paretolab.plugin_api.options import parse_options
    from paretolab.stats import ARTIFACT, samples
    from paretolab.study.trial import apply_plan

    with tempfile.TemporaryDirectory(prefix="paretolab-sensitivity-") as tmp:
        ctx = TrialContext(seed=seed, workdir=Path(tmp), device=subject.device, task=dict(task))
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            subject, _ = apply_plan(subject, plan, ctx, {})
            subject.model.eval()
            metrics = scorer.evaluate(subject, parse_options(scorer.options, {k: v for k, v in task.items() if k != "name"}, where="task"), ctx)
        size = Size().measure(subject, NoOptions(), ctx)["size_bytes"]
        payload = json.loads((Path(tmp) / ARTIFACT).read_text())
    metric = scorer.metrics[0]
    found = samples(payload, metric)
    if found is None:
        raise ConfigError(f"task {task['name']!r} keeps no per-window scores of {metric!r}; sensitivity needs them for paired intervals (use perplexity)")
    return dict(metrics), float(size), found


def plot(result: Sensitivity, base: Path) -> list[Path]:
    """``base``.png and .svg: Δ metric per group with its interval, in layer order (fixed metadata: reproducible files)."""
    import matplotlib.pyplot as plt

    fig = figure(result)
    png, svg = base.with_suffix(".png"), base.with_suffix(".svg")
    fig.savefig(png, dpi=110, metadata={"Software": None})
    fig.savefig(svg, metadata={"Date": None, "Creator": None})
    plt.close(fig)
    return [png, svg]


TITLE_PT = 9  # the title's font size; a character of it is about 0.6 of that wide


def title_lines(text: str, width_in: float) -> str:
    """``text`` wrapped to the lines a figure ``width_in`` inches wide holds (an inch kept for the y-axis' label), so a
    long model name (a hub id, a local folder) or many parameters are never cut off at the figure's edges."""
    import textwrap

    chars = max(20, int((width_in - 1.0) * 72 / (0.6 * TITLE_PT)))
    return textwrap.fill(text, width=chars)


def figure(result: Sensitivity) -> Any:
    """The plot as a matplotlib figure (the caller saves and closes it)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams["svg.hashsalt"] = "paretolab"
    kinds = sorted({g.group.split(" ", 1)[1] if " " in g.group else "" for g in result.groups})
    fig, ax = plt.subplots(figsize=(max(6.0, 0.25 * len(result.groups) + 2), 3.6))
    width = 0.8 / max(1, len(kinds))
    labels: dict[str, int] = {}
    for k, kind in enumerate(kinds):
        mine = [g for g in result.groups if (g.group.split(" ", 1)[1] if " " in g.group else "") == kind]
        xs = [labels.setdefault(g.group.split(" ", 1)[0] if kind else g.group, len(labels)) + (k - (len(kinds) - 1) / 2) * width for g in mine]
        ax.bar(xs, [g.delta for g in mine], width=width, label=kind or None,
               yerr=[[g.delta - g.low for g in mine], [g.high - g.delta for g in mine]], capsize=2)
    ax.set_xticks(range(len(labels)), list(labels), rotation=90 if len(labels) > 12 else 0, fontsize=7)
    ax.axhline(0, color="black", linewidth=0.6)
    setting = ", ".join(f"{k}={v}" for k, v in sorted(result.params.items()))
    ax.set_xlabel("layer" if kinds != [""] or all(g.group.isdigit() for g in result.groups) else "group")
    ax.set_ylabel(f"Δ {result.metric} vs unmodified (95 % interval)")
    title = f"{result.model}: {result.method} ({setting}) on one group at a time"
    ax.set_title(title_lines(title, fig.get_figwidth()), fontsize=TITLE_PT)
    if any(kinds):
        ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def write(result: Sensitivity, out: str | Path, *, force: bool = False, budget_bytes: float | None = None) -> list[Path]:
    """``sensitivity.json`` (with the greedy assignment under ``budget_bytes``), ``sensitivity.md`` and the plot, in ``out``."""
    folder = check_export_dir(out, force=force, record=RECORD)
    with writing(folder):
        folder.mkdir(parents=True, exist_ok=True)
        data = result.to_json()
        if budget_bytes is not None:
            data["greedy"] = result.greedy(budget_bytes)
        write_text(folder / RECORD, json.dumps(data, indent=1), "--out")
        text = result.markdown()
        if budget_bytes is not None:
            text += "\n" + greedy_text(data["greedy"], result) + "\n"
        write_text(folder / "sensitivity.md", text, "--out")
        return [folder / RECORD, folder / "sensitivity.md", *plot(result, folder / "sensitivity")]


def greedy_text(greedy: dict[str, Any], result: Sensitivity) -> str:
    """The greedy assignment in words and as the `layers:` block of a per-layer pipeline stage."""
    import yaml

    fits = "fits" if greedy["fits"] else "does NOT fit even with every group"
    block = yaml.safe_dump({"layers": greedy["layers"]}, sort_keys=False, default_flow_style=None).rstrip()
    return (f"Greedy under {number(greedy['budget_bytes'], 'bytes')}: {len(greedy['groups'])} group(s), predicted "
            f"{number(greedy['predicted_size_bytes'], 'bytes')} ({fits}), predicted Δ {result.metric} {number(greedy['predicted_delta'], signed=True)} "
            f"(a sum of single-group costs: interactions not counted). As a stage of {result.method}:\n\n```yaml\n{block}\n```")
