"""paretolab: map the quality/cost Pareto frontier of ML efficiency methods.

Public API for plugin authors::

    from paretolab import Method, hookimpl
    from paretolab import Measure, Metric, option   # a measure, its metrics, its options (docs/plugins.md)

and for users, from Python (imported on first use from :mod:`paretolab.api`, so that a plugin's
``import paretolab`` stays light and below every layer of the core)::

    paretolab.apply(model, "wanda", tokenizer=tok, sparsity=0.5)   # a method (or a chain) on any HF causal LM
    paretolab.load_study("demo")                                  # trials, frontier, verdicts as data frames
    paretolab.export("demo", 7, "out/")                           # a trial's model, loadable by transformers
    paretolab.pick("demo", keep="ppl no_worse 2 % vs none", where="size_bytes <= 0.5 x none")  # the cheapest that keeps quality
"""

from __future__ import annotations

from paretolab import _moved
from paretolab.errors import ConfigError, ParetolabError, PluginError, UnknownNameError
from paretolab.version import __version__

# The names a plugin is written against: name -> the module that defines it. Imported on first use (PEP 562),
# so that `import paretolab` (and `paretolab --help`, which imports the CLI's parser) does not import torch.
PUBLIC = {
    "KINDS": "paretolab.plugin_api.method",
    "Measure": "paretolab.plugin_api.measure",
    "Method": "paretolab.plugin_api.method",
    "Metric": "paretolab.plugin_api.metrics",
    "NoOptions": "paretolab.plugin_api.measure",
    "Paper": "paretolab.plugin_api.method",
    "Subject": "paretolab.plugin_api.subject",
    "TensorStorage": "paretolab.plugin_api.storage",
    "TrialContext": "paretolab.plugin_api.context",
    "hookimpl": "paretolab.plugin_api.hookspec",
    "option": "paretolab.plugin_api.options",
}
# user-facing entry points: name -> the module in paretolab.api that defines it (a registration, see ARCHITECTURE.md)
LAZY = {"apply": "paretolab.api.apply", "load_study": "paretolab.api.frames", "export": "paretolab.api.export",
        "pick": "paretolab.api.pick"}


def __getattr__(name: str) -> object:
    module = PUBLIC.get(name) or LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'paretolab' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    if name in PUBLIC:
        globals()[name] = value  # found once: later lookups are plain attribute reads
    return value


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
    "pick",
]
