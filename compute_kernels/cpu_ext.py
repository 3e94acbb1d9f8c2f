"""The optional C extensions of the CPU kernels: loading them, and the switch that turns them off.

``pip install`` builds them where a C compiler with OpenMP exists (pyproject.toml, ``optional``);
where it does not, or with ``PARETOLAB_CPU_KERNELS=0`` in the environment, every caller runs its
pure-PyTorch path instead. The variable is read at each call, so a test or a benchmark can
switch it inside one process.
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType

ENV = "PARETOLAB_CPU_KERNELS"


OFF = frozenset({"0", "false", "off", "no"})
_loaded: dict[str, ModuleType | None] = {}


def enabled() -> bool:
    """False when ``PARETOLAB_CPU_KERNELS`` is ``0`` (or ``false``/``off``/``no``): the C kernels are off."""
    value = os.environ.get(ENV)
    return value is None or value.strip().lower() not in OFF


def _import(name: str) -> ModuleType | None:
    if name not in _loaded:
        try:
            _loaded[name] = importlib.import_module(f"paretolab.kernels.{name}")
        except ImportError:
            _loaded[name] = None
    return _loaded[name]


def extension(name: str) -> ModuleType | None:
    """The built extension ``paretolab.kernels.<name>``, or None where it is not built or switched off."""
    return _import(name) if enabled() else None


def built(name: str) -> bool:
    """Whether ``paretolab.kernels.<name>`` was built (whatever the switch says)."""
    return _import(name) is not None


PATHS = ("scalar", "avx2", "avx512")  # the C kernels' cap levels 0, 1, 2 (compute_kernels/_cpu_paths.h)


def path_cap(ext: ModuleType, path: str | None) -> int:
    """The cap level for ``path`` (None: the best this CPU runs); a path this CPU cannot run is an error."""
    if path is None:
        return len(PATHS) - 1
    runs = ext.paths()
    if path not in runs:
        raise ValueError(f"path={path!r} is not one this CPU runs; it runs {', '.join(runs)} (None: the best of them)")
    return PATHS.index(path)


def runnable_paths(name: str) -> tuple[str, ...]:
    """The instruction paths extension ``name`` runs on this CPU, best first (("scalar",) where it is not built)."""
    ext = _import(name)
    return ("scalar",) if ext is None else tuple(ext.paths())
