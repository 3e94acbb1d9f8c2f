"""Plugin discovery: built-ins, entry points, duplicates, broken plugins — each failure names its plugin."""

from __future__ import annotations

import types

import pytest

from paretolab import Method, hookimpl
from paretolab.errors import DuplicateNameError, PluginError, UnknownNameError
from paretolab.plugin_api.manager import build_registries, make_plugin_manager
from paretolab.plugin_api.registry import Registry


class Thing:
    def __init__(self, name):
        self.name = name


def test_registry_refuses_duplicates_and_suggests_names():
    reg = Registry("method")
    reg.register(Thing("magnitude"), owner="a")
    with pytest.raises(DuplicateNameError, match="'magnitude' is registered twice: by plugin 'a' and by plugin 'b'"):
        reg.register(Thing("magnitude"), owner="b")
    with pytest.raises(UnknownNameError, match="did you mean 'magnitude'"):
        reg.get("magnitud")
    with pytest.raises(KeyError):
        reg.get("zzz")


def _plugin(**hooks):
    return types.SimpleNamespace(__name__="fake_plugin", **hooks)


class Dup(Method):
    name = "magnitude"

    def transform(self, subject, params, ctx):
        return subject


def test_a_plugin_reusing_a_builtin_name_is_refused():
    @hookimpl
    def register_methods(register):
        register(Dup())

    pm = make_plugin_manager(autoload=False, extra=(_plugin(register_methods=register_methods),))
    with pytest.raises(DuplicateNameError, match="registered twice"):
        build_registries(pm)


def test_a_wrong_hook_signature_names_the_plugin():
    @hookimpl
    def register_methods(register, extra_argument):
        pass

    with pytest.raises(PluginError, match='Plugin "fake_plugin" has a wrong hook'):
        make_plugin_manager(autoload=False, extra=(_plugin(register_methods=register_methods),))


def test_an_unknown_hook_names_the_plugin():
    @hookimpl
    def register_widgets(register):
        pass

    with pytest.raises(PluginError, match="fake_plugin"):
        make_plugin_manager(autoload=False, extra=(_plugin(register_widgets=register_widgets),))


def test_a_bad_method_object_is_refused_with_the_field():
    class BadKind(Method):
        name = "badkind"
        kind = "magic"

    @hookimpl
    def register_methods(register):
        register(BadKind())

    pm = make_plugin_manager(autoload=False, extra=(_plugin(register_methods=register_methods),))
    with pytest.raises(PluginError, match="method 'badkind' from plugin 'fake_plugin': kind must be one of weights"):
        build_registries(pm)


def test_a_plugin_that_fails_to_import_fails_loudly(monkeypatch):
    import importlib.metadata

    class BrokenEntryPoint:
        name = "broken"
        value = "no_such_module_xyz"
        dist = None

        def load(self):
            import no_such_module_xyz  # noqa: F401

    monkeypatch.setattr(importlib.metadata, "entry_points", lambda group: [BrokenEntryPoint()])
    with pytest.raises(PluginError, match=r'Error importing plugin "broken" \(no_such_module_xyz\): ModuleNotFoundError'):
        make_plugin_manager(autoload=True)


def test_autoload_switch(monkeypatch):
    import importlib.metadata

    calls = []
    monkeypatch.setattr(importlib.metadata, "entry_points", lambda group: calls.append(group) or [])
    monkeypatch.setenv("PARETOLAB_DISABLE_PLUGIN_AUTOLOAD", "1")
    make_plugin_manager()
    assert calls == []
    monkeypatch.delenv("PARETOLAB_DISABLE_PLUGIN_AUTOLOAD")
    make_plugin_manager()
    assert calls == ["paretolab.plugins"]
