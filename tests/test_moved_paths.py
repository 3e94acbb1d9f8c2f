"""A plugin written against the old flat paths (``paretolab.subject``, ``paretolab.options``, ...) still imports."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

from paretolab._moved import MOVED


@pytest.mark.parametrize("old", sorted(MOVED))
def test_an_old_path_is_the_module_at_its_new_path_and_says_so(old: str) -> None:
    new = importlib.import_module(MOVED[old])
    sys.modules.pop(old, None)
    with pytest.warns(DeprecationWarning, match=f"{old} moved to {MOVED[old]}"):
        alias = importlib.import_module(old)
    assert alias is new  # one module object: isinstance checks and monkeypatches see the same thing
    assert new.__spec__.name == MOVED[old] and new.__name__ == MOVED[old]


def test_a_plugin_using_old_paths_registers_and_runs_in_a_fresh_interpreter() -> None:
    code = (
        "import warnings; warnings.simplefilter('error', DeprecationWarning)\n"
        "try:\n    from paretolab.subject import Subject\nexcept DeprecationWarning as w: print('warned', w)\n"
        "warnings.simplefilter('ignore')\n"
        "from paretolab.subject import Subject\nfrom paretolab.options import option, parse_options\n"
        "from paretolab.plugin_manager import registries\nfrom paretolab.plugin_api.subject import Subject as New\n"
        "assert Subject is New and 'magnitude' in registries().methods\nprint('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["warned paretolab.subject moved to paretolab.plugin_api.subject; import it from there", "ok"]
