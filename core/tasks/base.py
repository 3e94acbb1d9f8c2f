"""The task interface: what every quality task implements (perplexity, multiple choice, generation, retrieval, ...)."""

from __future__ import annotations

from typing import Any

from paretolab.plugin_api.context import TrialContext
from paretolab.plugin_api.subject import Subject


class Task:
    """A quality task: ``options`` is a dataclass parsed from the pipeline's ``task:`` block."""

    name: str = ""
    metrics: tuple[str, ...] = ()
    options: type = object

    def evaluate(self, subject: Subject, options: Any, ctx: TrialContext) -> dict[str, float]:
        raise NotImplementedError


