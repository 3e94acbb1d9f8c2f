"""What a claim's verdict needs to know of its metric beyond the numbers: the range its values cannot leave, whether
it is exact (no replicate or example noise), and what a uniform guess scores on it (chance). Read from the registries
and, for a base trained here, from its record in the study's source; one place for the report, the documents and the
Python API's verdicts."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from paretolab.plugin_api.manager import registries
from paretolab.plugin_api.numbers import number
from paretolab.results.source import Source


def metric_bounds(metric: str) -> tuple[float, float] | None:
    """The range a registered metric's values cannot leave (fractions: 0..1), for clipping intervals."""
    metrics = registries().metrics
    return metrics.get(metric).bounds if metric in metrics else None


def metric_exact(metric: str) -> bool:
    """Whether a registered metric is exact (a count or size the configuration fixes: no replicate or example noise)."""
    metrics = registries().metrics
    return metric in metrics and metrics.get(metric).exact


def is_perplexity(metric: str) -> bool:
    """A perplexity of next-token prediction: ``ppl`` or a metric registered in unit ``ppl`` (``wiki_ppl``, ``early_exit_ppl_50``)."""
    metrics = registries().metrics
    return metric == "ppl" or (metric in metrics and metrics.get(metric).unit == "ppl")


def vocabulary(model: str, source: Source | None = None) -> int | None:
    """The vocabulary of the study's model, as its model source declares it (``vocab_size``); a base trained here
    (``train.save_as``) has its own base's, found through its record (the bundle's copy). None when not declared."""
    models = registries().models
    for _ in range(4):  # a base trained from a base trained here: follow the records a few steps
        found = source.trained_base(model) if source is not None else None
        base = found[1].get("base") if found is not None and isinstance(found[1], dict) else None
        if not isinstance(base, str) or not base or base == model:
            return models.get(model).vocab_size if model in models else None
        model = base
    return None


def chance_levels(pipeline: dict[str, Any], source: Source | None = None) -> Callable[[str], tuple[float, str] | None]:
    """metric -> (what a uniform guess scores, how it is known) for a study's claims: a perplexity's chance is the model's
    vocabulary (every token equally likely); an accuracy's is the chance rate its task declares (``Task.chance``)."""
    task = pipeline.get("task")
    name = task.get("name") if isinstance(task, dict) else task
    tasks = registries().tasks
    rates = dict(tasks.get(name).chance) if isinstance(name, str) and name in tasks else {}
    model = pipeline.get("model")
    vocab = vocabulary(model, source) if isinstance(model, str) else None

    def chance(metric: str) -> tuple[float, str] | None:
        if metric in rates:
            return float(rates[metric]), f"chance {number(rates[metric])} ({name})"
        if vocab and is_perplexity(metric):
            return float(vocab), f"vocabulary {vocab}"
        return None

    return chance
