"""paretolab: map the quality/cost Pareto frontier of ML efficiency methods.

Public API for plugin authors::

    from paretolab import Method, hookimpl
"""

from __future__ import annotations

from paretolab.context import TrialContext
from paretolab.errors import ConfigError, ParetolabError, PluginError, UnknownNameError
from paretolab.hookspec import hookimpl
from paretolab.method import KINDS, Method, Paper
from paretolab.metrics import Metric
from paretolab.storage import TensorStorage
from paretolab.subject import Subject

__version__ = "0.1.0"

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
