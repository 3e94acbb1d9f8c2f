"""Refuse a pipeline whose methods calibrate on the corpus its task evaluates on.

A method fitted on the evaluation text (``calib_corpus: wikitext2`` with ``task: {corpus: wikitext2}``)
is scored on tokens it has seen, so its quality is overstated. ``check_calibration_corpus`` runs
when the pipeline is parsed, before any trial.
"""

from __future__ import annotations

from typing import Any

from paretolab.data.corpora import corpus_identity
from paretolab.errors import CalibrationLeakError


def evaluation_corpus(task_name: str, task_options: dict[str, Any]) -> str | None:
    """The corpus a task scores on (its ``corpus`` option or that option's default), or None if it has none."""
    from dataclasses import fields

    from paretolab.plugin_api.manager import registries

    task = registries().tasks.get(task_name)
    defaults = {f.name: f.default for f in fields(task.options)} if hasattr(task.options, "__dataclass_fields__") else {}
    corpus = task_options.get("corpus", defaults.get("corpus"))
    return str(corpus) if corpus is not None else None


def check_calibration_corpus(stages: Any, task_name: str, task_options: dict[str, Any]) -> None:
    """Raise CalibrationLeakError when a stage's ``calib_corpus`` (set, among the choices, or by default) is the task's corpus."""
    from paretolab.plugin_api.manager import registries

    evaluated = evaluation_corpus(task_name, task_options)
    if evaluated is None:
        return
    target = corpus_identity(evaluated)
    methods = registries().methods
    for stage in stages:
        for option in stage.options:
            default = methods.get(option.method).defaults().get("calib_corpus")
            spec = option.params.get("calib_corpus")
            values = [default] if spec is None else list(getattr(spec, "values", None) or [getattr(spec, "value", None)])
            for value in values:
                if value is not None and corpus_identity(str(value)) == target:
                    raise CalibrationLeakError(
                        f"stages.{stage.id}.{option.method}.params.calib_corpus: {value!r} is the corpus task.corpus evaluates on "
                        f"({evaluated!r}); a method calibrated on its test text is scored on tokens it has seen. "
                        f"Calibrate on another corpus (e.g. {'wikitext2' if evaluated == 'pydoc' else 'pydoc'}) or evaluate on another one"
                    )
