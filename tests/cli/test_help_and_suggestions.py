"""`paretolab --help` is quick because it imports none of the heavy libraries; a misspelt command, method or
metric is answered with the closest few names and where the full list is, in one short line."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

import paretolab
from tests.conftest import run_cli

HEAVY = ("torch", "optuna", "mlflow", "ray", "pandas", "transformers", "numpy", "sqlalchemy", "streamlit")


def test_help_imports_no_heavy_library():
    """What made `paretolab --help` take seconds: `import paretolab` imported torch (through the plugin API)."""
    code = ("import sys\nfrom paretolab.cli import main\ntry:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
            f"print(sorted(m for m in {HEAVY!r} if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert "usage: paretolab" in done.stdout
    assert done.stdout.strip().splitlines()[-1] == "[]", "paretolab --help imported " + done.stdout.strip().splitlines()[-1]


def test_the_public_names_still_import_from_paretolab():
    for name, module in {**paretolab.PUBLIC, **paretolab.LAZY}.items():
        assert getattr(paretolab, name) is getattr(importlib.import_module(module), name)
    from paretolab import Method, TrialContext, hookimpl  # noqa: F401 - the plugin author's import
    with pytest.raises(AttributeError):
        paretolab.no_such_name  # noqa: B018


@pytest.mark.parametrize(("args", "meant"), [(["fronteir", "demo"], "frontier"), (["studis"], "studies"), (["models", "lst"], "list")])
def test_a_misspelt_command_is_answered_with_the_closest(args, meant, tmp_path):
    bad = run_cli(*args, cwd=tmp_path, check=False)
    assert bad.returncode == 2 and f"did you mean {meant!r}?" in bad.stderr


@pytest.mark.parametrize(("kind", "name", "meant"), [("metrics", "perplexity", "ppl"), ("metrics", "perplexty", "ppl"), ("metrics", "sizebytes", "size_bytes"),
                                                     ("metrics", "accuracy", "acc"), ("methods", "wandaa", "wanda")])
def test_an_unknown_name_suggests_a_few_and_says_where_the_rest_are(kind, name, meant):
    from paretolab.plugin_api.manager import registries

    registry = getattr(registries(), kind)
    message = registry.unknown_message(name)
    assert f"did you mean {meant!r}" in message
    assert message.count("'") <= 2 + 2 * 3, "more than the closest three names"
    assert "`paretolab plugins` lists all" in message and len(message) < 200, message
