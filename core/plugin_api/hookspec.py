"""Every hook paretolab calls, in one place.

Plugins implement any subset of these with ``@paretolab.hookimpl``; an implementation may take
a subset of a hook's arguments, so hooks can grow new arguments without breaking plugins.
Registration hooks are called once per plugin manager, when the registries are built; each
implementation calls ``register(obj)`` once per object it contributes (no second list to keep
in sync). Lifecycle hooks are called by the study driver, never inside Ray workers.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import pluggy

if TYPE_CHECKING:
    from paretolab.plugin_api.method import Method
    from paretolab.plugin_api.metrics import Metric
    from paretolab.records import TrialInfo, TrialResult

hookspec = pluggy.HookspecMarker("paretolab")


@hookspec
def register_methods(register: Callable[[Method], None]) -> None:
    """Contribute methods: call ``register(method_instance)`` once per method.

    Called when the method registry is built. Results are ignored; a duplicate name is an error.
    """


@hookspec
def register_tasks(register: Callable[[Any], None]) -> None:
    """Contribute quality tasks (objects with ``name``, ``metrics`` and ``evaluate``)."""


@hookspec
def register_measures(register: Callable[[Any], None]) -> None:
    """Contribute cost measures (objects with ``name``, ``metrics`` and ``measure``)."""


@hookspec
def register_models(register: Callable[[Any], None]) -> None:
    """Contribute model sources (objects with ``name``, ``describe()`` and ``load()``)."""


@hookspec
def register_metrics(register: Callable[[Metric], None]) -> None:
    """Contribute metric definitions: name, unit, direction, measured or estimated.

    Every metric a task, measure or method reports must be registered exactly once.
    """


@hookspec
def trial_started(trial: TrialInfo) -> None:
    """Called in the driver right before a trial is sent to a worker. Results are ignored; a hook that raises fails the
    trial (it is not run) with a reason naming the plugin and the hook, and the study goes on."""


@hookspec
def trial_finished(trial: TrialInfo, result: TrialResult) -> None:
    """Called in the driver once a trial's result is known (complete or failed), right before it is recorded. Results are
    ignored; a hook that raises fails the trial with a reason naming the plugin and the hook, and the study goes on."""


hookimpl = pluggy.HookimplMarker("paretolab")
