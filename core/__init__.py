"""paretolab: map the quality/cost Pareto frontier of ML efficiency methods.

Public API for plugin authors::

    from paretolab import Method, hookimpl
    from paretolab import Measure, Metric, option   # a measure, its metrics, its options (docs/plugins.md)

and for users, from Python (imported on first use from :mod:`paretolab.api`, so that a plugin's
``import paretolab`` stays light and below every layer of the core)::

    paretolab.apply(model, "wanda", tokenizer=tok, sparsity=0.5)   # a method (or a chain) on any HF causal LM
    paretolab.load_study("demo")                                  # trials, frontier, verdicts as data frames
    paretolab.export("demo", 7, "out/")                           # a trial's model, loadable by transformers
"""

from __future__ import annotations

from paretolab import _moved
from paretolab.errors import ConfigError, ParetolabError, PluginError, UnknownNameError
from paretolab.plugin_api.context import TrialContext
from paretolab.plugin_api.hookspec import hookimpl
from paretolab.plugin_api.measure import Measure, NoOptions
from paretolab.plugin_api.method import KINDS, Method, Paper
from paretolab.plugin_api.metrics import Metric
from paretolab.plugin_api.options import option
from paretolab.plugin_api.storage import TensorStorage
from paretolab.plugin_api.subject import Subject
from paretolab.version import __version__

# user-facing entry points: name -> the module in paretolab.api that defines it (a registration, see ARCHITECTURE.md)
LAZY = {"apply": "paretolab.api.apply", "load_study": "paretolab.api.frames", "export": "paretolab.api.export"}


def __getattr__(name: str) -> object:
    if name in LAZY:
        import importlib

        return getattr(importlib.import_module(LAZY[name]), name)
    raise AttributeError(f"module 'paretolab' has no attribute {name!r}")


_moved.install()  # the old paths of the plugin-facing modules (paretolab.subject, ...) keep importing

__all__ = [
    "KINDS",
    "ConfigError",
    "Measure",
    "Method",
    "Metric",
    "NoOptions",
    "Paper",
    "ParetolabError",
    "PluginError",
    "Subject",
    "TensorStorage",
    "TrialContext",
    "UnknownNameError",
    "__version__",
    "apply",
    "export",
    "hookimpl",
    "load_study",
    "option",
]
