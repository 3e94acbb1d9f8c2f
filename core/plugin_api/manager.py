"""Plugin discovery and the registries built from it.

The core's own features are plugins listed in BUILTIN_PLUGINS; third-party packages join
through the entry-point group ``paretolab.plugins``. Set ``PARETOLAB_DISABLE_PLUGIN_AUTOLOAD=1``
to load built-ins only.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import pluggy

from paretolab.errors import PluginError
from paretolab.plugin_api import hookspec
from paretolab.plugin_api.registry import Registry
from paretolab.version import __version__

ENTRY_POINT_GROUP = "paretolab.plugins"
AUTOLOAD_ENV = "PARETOLAB_DISABLE_PLUGIN_AUTOLOAD"

BUILTIN_PLUGINS: tuple[str, ...] = (
    "paretolab.plugin_api.metrics",
    "paretolab.tasks.perplexity",
    "paretolab.tasks.multiple_choice",
    "paretolab.tasks.generation",
    "paretolab.tasks.retrieval",
    "paretolab.tasks.lambada",
    "paretolab.tasks.assoc_recall",
    "paretolab.measure.measures",
    "paretolab.measure.engine_measure",
    "paretolab.models.lookup",
    "paretolab.training.models",
    "paretolab.plugins.baselines",
    "paretolab.plugins.incremental_bpe",
    "paretolab.plugins.wanda",
    "paretolab.plugins.incumbents",  # GPTQ, AWQ, SparseGPT, AutoRound, HQQ: run by their libraries in their own environment
    "paretolab.plugins.incumbents.kquant",  # llama.cpp's K-quants, run by llama.cpp
    "paretolab.plugins.macko",
    "paretolab.plugins.cat",
    "paretolab.plugins.catq",
    "paretolab.plugins.psumquant",
    "paretolab.plugins.layerdrop",
    "paretolab.plugins.depth_probe",
    "paretolab.plugins.parallel_probe",
    "paretolab.plugins.token_sparse_attention",
    "paretolab.plugins.speculative",
    "paretolab.training.method",
    "paretolab.plugins.layer_dropout",
    "paretolab.plugins.upipe",
    "paretolab.plugins.mup_upscale",
    "paretolab.plugins.norms",
    "paretolab.plugins.moe",
    "paretolab.plugins.kv_sharing",
    "paretolab.plugins.linear_attention",
    "paretolab.plugins.prac",
    "paretolab.plugins.tetrajet",
    "paretolab.plugins.l1_sparsity",
    "paretolab.plugins.cgls",
    "paretolab.plugins.plate",
    "paretolab.plugins.lora",
    "paretolab.plugins.forgetting",
    "paretolab.plugins.distill",
    "paretolab.plugins.stage_energy",
    "paretolab.training.rl",
    "paretolab.plugins.replay",
    "paretolab.plugin_api.costs",
    "paretolab.plugins.routing",
    "paretolab.plugins.select_to_think",
    "paretolab.plugins.bittokens",
    "paretolab.plugins.mtpc",
    "paretolab.tasks.compression",
    "paretolab.plugins.pmatic",
    "paretolab.tasks.tabular",
    "paretolab.plugins.tabpack",
    "paretolab.tasks.sequence",
    "paretolab.plugins.coda",
    "paretolab.plugins.omnisift_text",
    "paretolab.tasks.paired_retrieval",
    "paretolab.plugins.apm",
)


@dataclass
class Registries:
    """Everything the plugins contributed, by kind."""

    methods: Registry[Any]
    tasks: Registry[Any]
    measures: Registry[Any]
    models: Registry[Any]
    metrics: Registry[Any]
    plugin_versions: dict[str, str]


_DIST_VERSIONS: dict[str, str] = {}  # entry-point plugin name -> "distribution version"


def autoload_enabled() -> bool:
    return os.environ.get(AUTOLOAD_ENV, "").strip().lower() not in ("1", "true", "yes")


def make_plugin_manager(*, autoload: bool | None = None, extra: tuple[object, ...] = ()) -> pluggy.PluginManager:
    """A plugin manager with built-ins, entry points (unless disabled) and ``extra`` objects."""
    pm = pluggy.PluginManager("paretolab")
    pm.add_hookspecs(hookspec)
    for module_name in BUILTIN_PLUGINS:
        _register(pm, importlib.import_module(module_name), module_name)
    if autoload_enabled() if autoload is None else autoload:
        for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
            try:
                plugin = ep.load()
            except Exception as exc:
                raise PluginError(f'Error importing plugin "{ep.name}" ({ep.value}): {type(exc).__name__}: {exc}') from exc
            _register(pm, plugin, ep.name)
            if ep.dist is not None:
                _DIST_VERSIONS[ep.name] = f"{ep.dist.name} {ep.dist.version}"
    for obj in extra:
        _register(pm, obj, getattr(obj, "__name__", type(obj).__name__))
    try:
        pm.check_pending()
    except pluggy.PluginValidationError as exc:
        raise PluginError(f'Plugin "{exc.plugin}" implements a hook paretolab does not define: {exc}') from exc
    return pm


def _register(pm: pluggy.PluginManager, plugin: object, name: str) -> None:
    if pm.get_plugin(name) is not None:
        return  # the same module reached twice (e.g. an entry point naming a built-in)
    try:
        pm.register(plugin, name=name)
    except pluggy.PluginValidationError as exc:
        raise PluginError(f'Plugin "{name}" has a wrong hook: {exc}') from exc
    except ValueError as exc:
        raise PluginError(f'Plugin "{name}" could not be registered: {exc}') from exc


def build_registries(pm: pluggy.PluginManager) -> Registries:
    """Call every registration hook, one implementation at a time so errors name their plugin."""
    from paretolab.plugin_api.method import validate_method

    regs = Registries(
        methods=Registry("method"),
        tasks=Registry("task"),
        measures=Registry("measure"),
        models=Registry("model"),
        metrics=Registry("metric"),
        plugin_versions={},
    )
    checks: dict[str, Callable[[Any, str], None]] = {"methods": validate_method}
    for kind in ("metrics", "methods", "tasks", "measures", "models"):
        registry: Registry[Any] = getattr(regs, kind)
        caller = getattr(pm.hook, f"register_{kind}")
        for impl in caller.get_hookimpls():
            owner = impl.plugin_name

            def register(obj: Any, _owner: str = owner, _kind: str = kind, _reg: Registry[Any] = registry) -> None:
                if _kind in checks:
                    checks[_kind](obj, _owner)
                _reg.register(obj, owner=_owner)

            try:
                impl.function(**{arg: register for arg in impl.argnames})
            except PluginError:
                raise
            except Exception as exc:
                if isinstance(exc, (KeyError, ValueError)) and "registered twice" in str(exc):
                    raise
                raise PluginError(f'Plugin "{owner}" failed in register_{kind}: {type(exc).__name__}: {exc}') from exc
    for name, plugin in pm.list_name_plugin():
        regs.plugin_versions[name] = _DIST_VERSIONS.get(name) or _version_of(plugin)
    return regs


def _version_of(plugin: object) -> str:
    module = getattr(plugin, "__name__", type(plugin).__module__)
    top = module.split(".")[0]
    if top == "paretolab":  # the built-in plugins ship with paretolab itself
        return __version__
    try:
        dists = _packages_distributions().get(top, [])
        return importlib.metadata.version(dists[0]) if dists else "unknown"
    except Exception:
        return "unknown"


@lru_cache(maxsize=1)
def _packages_distributions() -> Mapping[str, list[str]]:
    """Top-level module -> distributions; reads every installed package's file list (seconds), so once per process."""
    return importlib.metadata.packages_distributions()


@lru_cache(maxsize=1)
def registries() -> Registries:
    """The process-wide registries (built on first use; ``reset()`` forgets them)."""
    return build_registries(plugin_manager())


@lru_cache(maxsize=1)
def plugin_manager() -> pluggy.PluginManager:
    """The process-wide plugin manager, for lifecycle hooks."""
    return make_plugin_manager()


def reset() -> None:
    """Forget the cached plugin manager and registries (tests, or after installing a plugin)."""
    registries.cache_clear()
    plugin_manager.cache_clear()
    _packages_distributions.cache_clear()
