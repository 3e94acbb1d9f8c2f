"""The task interface: what every quality task implements (perplexity, multiple choice, generation, retrieval, ...)."""

from __future__ import annotations

from typing import Any, ClassVar

from paretolab.plugin_api.context import TrialContext
from paretolab.plugin_api.subject import Subject


class Task:
    """A quality task: ``options`` is a dataclass parsed from the pipeline's ``task:`` block."""

    name: str = ""
    metrics: tuple[str, ...] = ()
    options: type = object
    # What a uniform guess scores on a metric, where the task fixes it (recall of one of 26 letters: acc 1/26). The
    # verdicts read an arm at or below it as at chance: a comparison of guesses is no evidence. Multiple-choice tasks
    # leave it out: their options per row (1/k) come with the dataset, not the task.
    chance: ClassVar[dict[str, float]] = {}
    # Whether the task scores only ``ctx.examples(n)`` of its examples, so that a pipeline's ``confirm:`` split can keep a
    # part of them from the search for ``paretolab pick`` to confirm its choice on.
    splits: ClassVar[bool] = False

    def evaluate(self, subject: Subject, options: Any, ctx: TrialContext) -> dict[str, float]:
        raise NotImplementedError


