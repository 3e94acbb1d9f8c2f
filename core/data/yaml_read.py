"""The one YAML reader of paretolab: pipelines, ``paretolab.yaml``, bundle headers, anything the platform reads.

Plain data only (``yaml.SafeLoader``); a key given twice in one mapping is refused with both lines
(YAML's own rule, which PyYAML does not enforce: it keeps the last value silently); aliases are
counted before anything is expanded, so a few hundred bytes of nested anchors cannot hang a command;
a syntax error keeps its line, column and caret. Every failure is a ``ConfigError``: the CLI prints
it and exits with code 2.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from paretolab.errors import ConfigError

MAX_PIPELINE_BYTES = 1 << 20  # a pipeline is a page of YAML; anything near this size is a mistake
MAX_PIPELINE_NODES = 100_000  # YAML nodes after alias expansion (an alias bomb expands to billions)
MERGE_TAG = "tag:yaml.org,2002:merge"


def read_yaml(text: str, source: str) -> Any:
    """``yaml.safe_load`` that refuses duplicate keys and aliases expanding past MAX_PIPELINE_NODES nodes, before building."""
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _expanded_size(node, {}, set(), source)
        return loader.construct_document(node)
    except yaml.MarkedYAMLError as exc:
        raise ConfigError(_syntax_message(exc, source)) from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{source}: not valid YAML: {' '.join(str(exc).split())}") from None
    except RecursionError:
        raise ConfigError(f"{source}: nested too deeply to be read; flatten it") from None
    finally:
        loader.dispose()


def read_yaml_file(path: str | Path, what: str = "file", max_bytes: int = MAX_PIPELINE_BYTES) -> Any:
    """``read_yaml`` on a file, with one line for a missing file, a folder, an oversized or unreadable or non-UTF-8 one."""
    path = Path(path)
    if path.is_dir():
        raise ConfigError(f"{what} {str(path)!r} is a directory, not a YAML file; give the path of the file itself")
    if not path.is_file():
        kind = _special_kind(path)
        if kind:  # a device, a FIFO, a socket: never opened (/dev/zero has no end, a FIFO waits for a writer)
            raise ConfigError(f"{what} {str(path)!r} is {kind}, not a regular file; give the path of a YAML file")
        raise ConfigError(f"{what} {str(path)!r} does not exist")
    try:
        size = path.stat().st_size
        if size > max_bytes:
            raise ConfigError(f"{path}: {size} bytes; a {what} may hold at most {max_bytes} bytes, so cut it down")
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start}); save the {what} as UTF-8") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read it ({exc.strerror or exc}); check its permissions") from None
    return read_yaml(text, str(path))


def _special_kind(path: Path) -> str:
    """What ``path`` is when it exists but is neither a folder nor a regular file ("" when it does not exist)."""
    import stat

    try:
        mode = path.stat().st_mode
    except (OSError, ValueError):
        return ""
    kinds = ((stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
             (stat.S_ISSOCK, "a socket"))
    return next((name for test, name in kinds if test(mode)), "not a regular file")


def _syntax_message(exc: yaml.MarkedYAMLError, source: str) -> str:
    """``SOURCE, line L, column C: PROBLEM`` (one line of cause), then the line and a caret under the column."""
    mark = exc.problem_mark or exc.context_mark
    problem = " ".join(str(exc.problem or exc.context or "not valid YAML").split())
    if mark is None:
        return f"{source}: not valid YAML: {problem}"
    head = f"{source}, line {mark.line + 1}, column {mark.column + 1}: not valid YAML: {problem}"
    lines = (mark.buffer or "").replace("\0", "").splitlines()
    if 0 <= mark.line < len(lines) and lines[mark.line].strip():
        text = lines[mark.line].expandtabs(1)
        return f"{head}\n    {text[:160]}\n    {' ' * min(mark.column, 160)}^"
    return head


def _where(node: yaml.Node, source: str) -> str:
    return f"{source}, line {node.start_mark.line + 1}, column {node.start_mark.column + 1}"


def _duplicate_keys(node: yaml.MappingNode, source: str, field: str) -> None:
    seen: dict[tuple[str, str], yaml.Node] = {}
    for key, _value in node.value:
        if not isinstance(key, yaml.ScalarNode) or key.tag == MERGE_TAG:
            continue
        ident = (key.tag, key.value)
        if ident in seen:
            inside = f" in {field}" if field else ""
            raise ConfigError(
                f"{_where(key, source)}: key {key.value!r}{inside} is given twice (first on line {seen[ident].start_mark.line + 1}); "
                "YAML keeps only one of them: delete the one you do not mean"
            )
        seen[ident] = key


def _expanded_size(node: yaml.Node, memo: dict[int, int], active: set[int], source: str, where: str = "") -> int:
    """Nodes in ``node`` with every alias expanded, counted without expanding (memoised per shared node); duplicate keys refused."""
    key = id(node)
    if key in memo:
        return memo[key]
    field = where or "the document"
    if key in active:
        raise ConfigError(f"{field}: an alias refers to its own anchor ({source}, line {node.start_mark.line + 1}); remove the cycle")
    active.add(key)
    children: list[tuple[yaml.Node, str]] = []
    if isinstance(node, yaml.SequenceNode):
        children = [(child, f"{where}[{i}]") for i, child in enumerate(node.value)]
    elif isinstance(node, yaml.MappingNode):
        _duplicate_keys(node, source, where)
        for k, v in node.value:
            label = str(k.value) if isinstance(k, yaml.ScalarNode) else "?"
            children += [(k, where), (v, f"{where}.{label}" if where else label)]
    total = 1
    for child, path in children:
        total += _expanded_size(child, memo, active, source, path)
        if total > MAX_PIPELINE_NODES:
            raise ConfigError(
                f"{field}: its aliases expand to more than {MAX_PIPELINE_NODES} YAML nodes ({source}, line {node.start_mark.line + 1}); "
                "write the values out instead of nesting anchors"
            )
    active.discard(key)
    memo[key] = total
    return total
