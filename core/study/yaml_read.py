"""Reading a pipeline's YAML safely: plain data only, and no alias bomb (aliases are counted before expanding)."""

from __future__ import annotations

from typing import Any

import yaml

from paretolab.errors import ConfigError

MAX_PIPELINE_BYTES = 1 << 20  # a pipeline is a page of YAML; anything near this size is a mistake


MAX_PIPELINE_NODES = 100_000  # YAML nodes after alias expansion (an alias bomb expands to billions)


def read_yaml(text: str, source: str) -> Any:
    """``yaml.safe_load`` that refuses a document whose aliases expand past MAX_PIPELINE_NODES nodes, before building it."""
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _expanded_size(node, {}, set(), source)
        return loader.construct_document(node)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{source}: not valid YAML: {' '.join(str(exc).split())}") from exc
    except RecursionError:
        raise ConfigError(f"{source}: nested too deeply to be a pipeline; flatten it") from None
    finally:
        loader.dispose()


def _expanded_size(node: yaml.Node, memo: dict[int, int], active: set[int], source: str, where: str = "") -> int:
    """Nodes in ``node`` with every alias expanded, counted without expanding (memoised per shared node)."""
    key = id(node)
    if key in memo:
        return memo[key]
    field = where or "pipeline"
    if key in active:
        raise ConfigError(f"{field}: an alias refers to its own anchor ({source}, line {node.start_mark.line + 1}); remove the cycle")
    active.add(key)
    children: list[tuple[yaml.Node, str]] = []
    if isinstance(node, yaml.SequenceNode):
        children = [(child, f"{where}[{i}]") for i, child in enumerate(node.value)]
    elif isinstance(node, yaml.MappingNode):
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
