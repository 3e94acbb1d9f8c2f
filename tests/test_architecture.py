"""The source's shape: no import circle, no import that climbs a layer, small files, a top package that stays small.

The layers are ARCHITECTURE.md's ``layers`` block; the graph is built from the files (tests/architecture.py).
The checker is itself tested on small planted trees, so a green run means the rules are enforced.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.architecture import (
    build_graph,
    cycles,
    layer_violations,
    package_dirs,
    read_layers,
    source_modules,
)

ROOT = Path(__file__).resolve().parents[1]
MAX_LINES = 400
MAX_TOP_MODULES = 15
SOURCE_DIRS = ("core", "plugins", "compute_kernels", "pipelines", "dashboard", "tests", "benchmarks")


@pytest.fixture(scope="module")
def graph():
    return build_graph(ROOT)


@pytest.fixture(scope="module")
def layers():
    return read_layers((ROOT / "ARCHITECTURE.md").read_text(encoding="utf-8"))


def test_no_import_circle(graph) -> None:
    found = [" -> ".join(c) for c in cycles(graph)]
    assert not found, "import circles (break each by moving the shared part down a layer):\n" + "\n".join(found)


def test_no_import_climbs_a_layer_or_goes_sideways(graph, layers) -> None:
    problems = layer_violations(graph, layers)
    assert not problems, "imports against the layers of ARCHITECTURE.md:\n" + "\n".join(problems)


def test_every_module_has_a_layer(graph, layers) -> None:
    orphans = sorted(m for m in graph.files if layers.entry_of(m) is None)
    assert not orphans, f"modules in no layer of ARCHITECTURE.md (add their package to the layers block): {orphans}"


def test_every_paretolab_import_names_a_module_that_exists(graph) -> None:
    """An import of a moved path (``paretolab.subject``) works for plugins through the alias, never in our own code."""
    bad = [f"{m}:{line} imports {name}" for m, line, name in graph.missing]
    assert not bad, "imports of paretolab paths that are no module (moved? see paretolab._moved.MOVED):\n" + "\n".join(bad)


def test_tests_and_benchmarks_use_the_new_paths_too() -> None:
    from paretolab._moved import MOVED

    bad = []
    for folder in ("tests", "benchmarks"):
        for path in (ROOT / folder).rglob("*.py"):
            if path.name == "test_moved_paths.py":
                continue  # the test of the aliases imports the old paths on purpose
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                names = [node.module] if isinstance(node, ast.ImportFrom) else [a.name for a in node.names] if isinstance(node, ast.Import) else []
                bad += [f"{path.relative_to(ROOT)}:{node.lineno} {n}" for n in names if n in MOVED]
    assert not bad, "old (aliased) module paths; import from the new ones:\n" + "\n".join(bad)


def test_no_python_file_over_400_lines() -> None:
    long = sorted(
        (n, str(p.relative_to(ROOT)))
        for d in SOURCE_DIRS for p in (ROOT / d).rglob("*.py")
        if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_LINES
    )
    assert not long, f"files over {MAX_LINES} lines (split by responsibility): {long}"


def test_the_core_package_keeps_at_most_15_top_level_modules() -> None:
    top = sorted(p.name for p in (ROOT / "core").glob("*.py"))
    assert len(top) <= MAX_TOP_MODULES, f"{len(top)} modules at the top of paretolab (at most {MAX_TOP_MODULES}): {top}"


def test_every_package_folder_is_installed() -> None:
    """A package missing from pyproject's list is there in a checkout but absent from a wheel (and a Ray job's image)."""
    import tomllib

    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    packages = {m for m, p in source_modules(ROOT).items() if p.name == "__init__.py"}
    assert packages <= listed, f"packages not in [tool.setuptools] packages: {sorted(packages - listed)}"
    assert set(package_dirs(ROOT)) <= listed


def test_no_checkout_folder_shadows_an_installed_package() -> None:
    """The checkout root is on sys.path under pytest and ``python -c``: a top-level folder named like an installed
    package (``kernels/`` vs the ``kernels`` package transformers >=5.25 imports) breaks every import of it there."""
    from importlib.metadata import packages_distributions

    installed = packages_distributions()
    folders = {p.name for p in ROOT.iterdir() if p.is_dir() and ((p / "__init__.py").is_file() or any(p.glob("*.py")))}
    clashes = {name: installed[name] for name in folders if name in installed and name != "tests"}
    assert not clashes, f"checkout folders that shadow installed packages (rename the folder, keep the package-dir mapping): {clashes}"


def test_modules_named_by_string_exist() -> None:
    """Registration tables name modules by string (imported on first use); a renamed module must not leave one behind."""
    import importlib.util

    import paretolab
    from paretolab.data.corpora import SYNTHETIC_CORPORA
    from paretolab.plugin_api.manager import BUILTIN_PLUGINS

    missing = [name for name in (*BUILTIN_PLUGINS, *SYNTHETIC_CORPORA.values(), *paretolab.LAZY.values(), *paretolab.PUBLIC.values()) if importlib.util.find_spec(name) is None]
    assert not missing, f"tables name modules that do not exist: {missing}"
    assert all(callable(getattr(paretolab, name)) for name in paretolab.LAZY), "paretolab.LAZY names an attribute its module lacks"


# ---- the checker itself, on planted trees ------------------------------------------------------

def _tree(tmp_path: Path, files: dict[str, str], layers: str) -> Path:
    (tmp_path / "pyproject.toml").write_text('[tool.setuptools]\npackages = ["paretolab"]\n[tool.setuptools.package-dir]\n"paretolab" = "core"\n')
    for rel, text in {"core/__init__.py": "", **files}.items():
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    (tmp_path / "ARCHITECTURE.md").write_text(f"```layers\n{layers}\n```\n")
    return tmp_path


LAYERS = "low: paretolab.low\nhigh: paretolab.high\nside: paretolab.side_a paretolab.side_b"


def test_checker_finds_a_circle_through_a_lazy_import(tmp_path: Path) -> None:
    repo = _tree(tmp_path, {"core/low/__init__.py": "", "core/low/a.py": "from paretolab.low import b\n",
                            "core/low/b.py": "def f():\n    from paretolab.low.a import x\n"}, LAYERS)
    assert cycles(build_graph(repo)) == [["paretolab.low.a", "paretolab.low.b", "paretolab.low.a"]]


def test_checker_ignores_type_checking_imports(tmp_path: Path) -> None:
    repo = _tree(tmp_path, {"core/low/__init__.py": "", "core/low/a.py": "from paretolab.low import b\n",
                            "core/low/b.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from paretolab.low.a import x\n"}, LAYERS)
    assert cycles(build_graph(repo)) == []


def test_checker_names_an_import_that_climbs_and_one_that_goes_sideways(tmp_path: Path) -> None:
    repo = _tree(tmp_path, {"core/low/__init__.py": "import paretolab.high.x\n", "core/high/__init__.py": "", "core/high/x.py": "",
                            "core/side_a.py": "from paretolab import side_b\n", "core/side_b.py": ""}, LAYERS)
    problems = layer_violations(build_graph(repo), read_layers((repo / "ARCHITECTURE.md").read_text()))
    assert len(problems) == 2
    assert problems[0].startswith("paretolab.low (layer 'low') imports paretolab.high.x (layer 'high', higher)")
    assert problems[1].startswith("paretolab.side_a (paretolab.side_a) imports paretolab.side_b (paretolab.side_b) sideways")


def test_checker_reports_an_import_of_a_path_that_is_no_module(tmp_path: Path) -> None:
    repo = _tree(tmp_path, {"core/low/__init__.py": "from paretolab.subject import Subject\n"}, LAYERS)
    assert build_graph(repo).missing == [("paretolab.low", 1, "paretolab.subject")]
