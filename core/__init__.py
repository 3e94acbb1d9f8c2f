"""paretolab: map the quality/cost Pareto frontier of ML efficiency methods.

Public API for plugin authors::

    from paretolab import Method, hookimpl
"""

from __future__ import annotations

from paretolab import _moved
from paretolab.errors import ConfigError, ParetolabError, PluginError, UnknownNameError
from paretolab.plugin_api.context import TrialContext
from paretolab.plugin_api.hookspec import hookimpl
from paretolab.plugin_api.method import KINDS, Method, Paper
from paretolab.plugin_api.metrics import Metric
from paretolab.plugin_api.storage import TensorStorage
from paretolab.plugin_api.subject import Subject
from paretolab.version import __version__

_moved.install()  # the old paths of the plugin-facing modules (paretolab.subject, ...) keep importing

__all__ = [
    "KINDS",
    "ConfigError",
    "Method",
    "Metric",
    "Paper",
    "ParetolabError",
    "PluginError",
    "Subject",
    "TensorStorage",
    "TrialContext",
    "UnknownNameError",
    "__version__",
    "hookimpl",
]
