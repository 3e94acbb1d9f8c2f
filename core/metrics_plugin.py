"""Registers the core's metric definitions."""

from __future__ import annotations

from collections.abc import Callable

from paretolab.hookspec import hookimpl
from paretolab.metrics import BUILTIN_METRICS, Metric


@hookimpl
def register_metrics(register: Callable[[Metric], None]) -> None:
    for metric in BUILTIN_METRICS:
        register(metric)
