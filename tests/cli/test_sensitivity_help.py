"""`paretolab sensitivity --help` names the layerwise methods the plugin registry holds, not a list written in the parser."""

from __future__ import annotations

import pytest

from paretolab import Method


class Rowwise(Method):
    """A plugin's layerwise method: one setting per layer group."""

    name = "rowwise_probe"
    layerwise = True

    def transform(self, subject, params, ctx):
        return subject


@pytest.fixture
def registered():
    from paretolab.plugin_api import manager

    manager.registries().methods.register(Rowwise(), owner="test")
    yield
    manager.reset()  # the next registries() is built without it


def _method_help() -> str:
    from paretolab.cli.parser import build_parser

    parser = build_parser()
    sub = parser._subparsers._group_actions[0].choices["sensitivity"]
    return " ".join(sub.format_help().split())  # argparse's line wrapping undone


def test_the_help_lists_every_layerwise_method_of_the_registry(registered):
    from paretolab.plugin_api.manager import registries

    text = _method_help()
    layerwise = sorted(m.name for m in registries().methods if getattr(m, "layerwise", False))
    assert "rowwise_probe" in layerwise and {"rtn", "magnitude"} <= set(layerwise)
    assert f"a layerwise method: {', '.join(layerwise)} (methods that declare layerwise = True)" in text, text


def test_building_the_parser_reads_no_registry(monkeypatch):
    """Only printing the help reads the registry: `paretolab --help` and every command stay quick."""
    from paretolab.plugin_api import manager

    def refuse():
        raise AssertionError("the registry was read while the parser was built")

    monkeypatch.setattr(manager, "registries", refuse)
    from paretolab.cli.parser import build_parser

    build_parser()
