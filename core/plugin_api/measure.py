"""What a measure plugin is written against: ``Measure`` and ``NoOptions``.

A measure reports cost (or any number about the transformed model) for every trial of a study
that lists it under ``measures:`` (or for every study, when it is ``default``), after the task
has evaluated the subject. The built-in ones (``params``, ``size``, ``latency``) live in
:mod:`paretolab.measure.measures`; they subclass this like any third-party measure.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from paretolab.plugin_api.context import TrialContext
from paretolab.plugin_api.subject import Subject


class Measure:
    """A cost measure. ``default`` measures run in every study unless the pipeline lists others.

    ``options`` is a frozen dataclass whose fields (declared with
    :func:`paretolab.plugin_api.options.option`) are the measure's options in a pipeline's
    ``measures:`` block; paretolab parses and range-checks them before any trial and hands
    ``measure`` the parsed object. ``metrics`` names every key ``measure`` returns; each must be
    registered once through the ``register_metrics`` hook.
    """

    name: str = ""
    metrics: tuple[str, ...] = ()
    options: type = object
    default: bool = False

    def measure(self, subject: Subject, options: Any, ctx: TrialContext) -> dict[str, float]:
        raise NotImplementedError


@dataclass(frozen=True)
class NoOptions:
    """The options of a measure that takes none (``measures: {size: {}}``)."""
