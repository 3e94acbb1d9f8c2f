"""Old import paths of the plugin-facing modules, kept working after the core was reorganised into packages.

Before the reorganisation these modules sat at the top of the package (``paretolab.subject``,
``paretolab.options``, ...). A plugin written against those paths still imports: the finder below
answers an old name with the module that now lives at the new one (the same module object, so
``isinstance`` and monkeypatching behave), with a DeprecationWarning that names the new path.
paretolab's own code never uses these names (tests/test_architecture.py refuses them).
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import warnings
from types import ModuleType
from typing import Any

# old module path -> the module it became (modules that were split are not aliased: no single new home)
MOVED: dict[str, str] = {
    "paretolab.context": "paretolab.plugin_api.context",
    "paretolab.costs": "paretolab.plugin_api.costs",
    "paretolab.decoding": "paretolab.generation.decoding",
    "paretolab.energy": "paretolab.measure.energy",
    "paretolab.hookspec": "paretolab.plugin_api.hookspec",
    "paretolab.measures": "paretolab.measure.measures",
    "paretolab.method": "paretolab.plugin_api.method",
    "paretolab.metrics": "paretolab.plugin_api.metrics",
    "paretolab.options": "paretolab.plugin_api.options",
    "paretolab.plugin_manager": "paretolab.plugin_api.manager",
    "paretolab.recorded": "paretolab.data.recorded",
    "paretolab.registry": "paretolab.plugin_api.registry",
    "paretolab.storage": "paretolab.plugin_api.storage",
    "paretolab.subject": "paretolab.plugin_api.subject",
    "paretolab.timing": "paretolab.measure.timing",
}


class _Alias(importlib.abc.Loader):
    """Loads an old name as the module at its new path (imported for real once, under its new name)."""

    def __init__(self, old: str, new: str) -> None:
        self.old, self.new = old, new

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        warnings.warn(f"{self.old} moved to {self.new}; import it from there", DeprecationWarning, stacklevel=2)
        module = importlib.import_module(self.new)
        self._spec = module.__spec__
        return module

    def exec_module(self, module: ModuleType) -> None:
        module.__spec__ = self._spec  # importlib set the alias's spec on it: the module keeps its own


class _MovedFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, name: str, path: Any = None, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        new = MOVED.get(name)
        return importlib.machinery.ModuleSpec(name, _Alias(name, new)) if new else None


def install() -> None:
    """Put the finder first on ``sys.meta_path`` (once per process)."""
    if not any(isinstance(f, _MovedFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _MovedFinder())
