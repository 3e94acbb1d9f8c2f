"""The import graph of paretolab's source, built from the files (AST; nothing is imported), and its rules.

The layers come from the ``layers`` block of ARCHITECTURE.md (one source of truth for the picture
and the check): each line is ``name: prefix prefix ...``, bottom layer first. A module belongs to
the entry that is the longest prefix of its dotted name (``paretolab`` alone is the package's
``__init__``). A module may import from its own entry (cycles aside) and from any lower layer;
an import into a higher layer climbs, one into another entry of the same layer goes sideways.
Imports inside ``if TYPE_CHECKING:`` are types only and not counted; imports inside functions are.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from pathlib import Path

import tomllib

ROOT_PACKAGE = "paretolab"


@dataclass
class Graph:
    """Modules (dotted name -> file), their import edges, and the lines that made each edge."""

    files: dict[str, Path]
    edges: dict[str, set[str]] = field(default_factory=dict)
    where: dict[tuple[str, str], int] = field(default_factory=dict)  # (importer, imported) -> line
    missing: list[tuple[str, int, str]] = field(default_factory=list)  # (importer, line, name that is no module)


def package_dirs(repo: Path) -> dict[str, Path]:
    """``[tool.setuptools.package-dir]`` of pyproject.toml: top package name -> folder."""
    config = tomllib.loads((repo / "pyproject.toml").read_text())["tool"]["setuptools"]
    return {name: repo / folder for name, folder in config["package-dir"].items()}


def extension_modules(repo: Path) -> set[str]:
    """Compiled modules (``[[tool.setuptools.ext-modules]]``): importable, but with no Python source."""
    config = tomllib.loads((repo / "pyproject.toml").read_text())["tool"]["setuptools"]
    return {ext["name"] for ext in config.get("ext-modules", [])}


def source_modules(repo: Path) -> dict[str, Path]:
    """Every module of the installed packages by dotted name (a package by its ``__init__.py``)."""
    out: dict[str, Path] = {}
    dirs = package_dirs(repo)
    for package, folder in sorted(dirs.items(), key=lambda kv: len(kv[0])):
        for path in sorted(folder.rglob("*.py")):
            parts = list(path.relative_to(folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            name = ".".join([package, *parts])
            if any(name.startswith(p + ".") for p in dirs if p != package and p.startswith(package + ".")):
                continue  # a folder mapped as its own package elsewhere
            out[name] = path
    return out


def _type_checking_nodes(tree: ast.AST) -> set[int]:
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skip.update(id(n) for stmt in node.body for n in ast.walk(stmt))
    return skip


def build_graph(repo: Path) -> Graph:
    """The import graph of every module under the package dirs of ``repo``."""
    graph = Graph(source_modules(repo))
    known = set(graph.files) | extension_modules(repo)
    for module, path in graph.files.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        skip = _type_checking_nodes(tree)
        is_package = path.name == "__init__.py"
        targets: set[str] = set()

        def add(name: str, line: int) -> None:
            if name != module:
                targets.add(name)
                graph.where.setdefault((module, name), line)

        for node in ast.walk(tree):
            if id(node) in skip:
                continue
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name == ROOT_PACKAGE or alias.name.startswith(ROOT_PACKAGE + "."):
                        if alias.name in known:
                            add(alias.name, node.lineno)
                        else:
                            graph.missing.append((module, node.lineno, alias.name))
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = module if is_package else module.rpartition(".")[0]
                    for _ in range(node.level - 1):
                        base = base.rpartition(".")[0]
                    source = f"{base}.{node.module}" if node.module else base
                else:
                    source = node.module or ""
                if source != ROOT_PACKAGE and not source.startswith(ROOT_PACKAGE + "."):
                    continue
                if source not in known:
                    graph.missing.append((module, node.lineno, source))
                    continue
                for alias in node.names:
                    sub = f"{source}.{alias.name}"
                    add(sub if sub in known else source, node.lineno)
        graph.edges[module] = targets
    return graph


def cycles(graph: Graph) -> list[list[str]]:
    """Each strongly connected component of more than one module, as one cycle through it (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for start in sorted(graph.edges):
        if start in index:
            continue
        work = [(start, iter(sorted(graph.edges.get(start, ()))))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in graph.edges:
                    continue
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.edges[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(_cycle_through(sorted(component), graph))
    return found


def _cycle_through(component: list[str], graph: Graph) -> list[str]:
    """A shortest cycle from the component's first module back to it (breadth-first inside the component)."""
    members, start = set(component), component[0]
    previous: dict[str, str] = {}
    frontier = [start]
    while frontier:
        nxt = []
        for node in frontier:
            for child in sorted(graph.edges[node] & members):
                if child == start:
                    path = [node]
                    while path[-1] != start:
                        path.append(previous[path[-1]])
                    return [start, *reversed(path[:-1]), start] if len(path) > 1 else [start, node, start]
                if child not in previous:
                    previous[child] = node
                    nxt.append(child)
        frontier = nxt
    return component


@dataclass(frozen=True)
class Layers:
    """Layer names bottom first, and each entry (module prefix) with its layer's index."""

    names: tuple[str, ...]
    entries: dict[str, int]

    def entry_of(self, module: str) -> str | None:
        """The entry a module belongs to: the longest prefix (``paretolab`` itself only for the package ``__init__``)."""
        best = None
        for entry in self.entries:
            if module == entry or (entry != ROOT_PACKAGE and module.startswith(entry + ".")):
                if best is None or len(entry) > len(best):
                    best = entry
        return best


def read_layers(markdown: str) -> Layers:
    """The ```` ```layers ```` block of ARCHITECTURE.md: ``name: prefix prefix ...`` per line, bottom layer first."""
    match = re.search(r"^```layers\n(.*?)^```", markdown, re.M | re.S)
    if match is None:
        raise ValueError("ARCHITECTURE.md has no ```layers block")
    names, entries = [], {}
    for line in match.group(1).splitlines():
        if not line.strip():
            continue
        name, _, prefixes = line.partition(":")
        for prefix in prefixes.split():
            if prefix in entries:
                raise ValueError(f"ARCHITECTURE.md layers: {prefix} is in two layers")
            entries[prefix] = len(names)
        names.append(name.strip())
    return Layers(tuple(names), entries)


def layer_violations(graph: Graph, layers: Layers) -> list[str]:
    """One line per import that climbs a layer or goes sideways, naming both modules and their layers."""
    out = []
    for importer, imported in sorted((a, b) for a, targets in graph.edges.items() for b in targets):
        if imported not in graph.files:
            continue  # a compiled extension: a leaf
        a, b = layers.entry_of(importer), layers.entry_of(imported)
        if a is None or b is None or a == b:
            continue
        la, lb = layers.entries[a], layers.entries[b]
        line = graph.where[(importer, imported)]
        if lb > la:
            out.append(f"{importer} (layer {layers.names[la]!r}) imports {imported} (layer {layers.names[lb]!r}, higher) "
                       f"at {graph.files[importer].name}:{line}")
        elif lb == la:
            out.append(f"{importer} ({a}) imports {imported} ({b}) sideways: both in layer {layers.names[la]!r}, "
                       f"at {graph.files[importer].name}:{line}")
    return out
