"""Typed option blocks for tasks and measures, parsed from plain YAML data with useful errors."""

from __future__ import annotations

import dataclasses
import difflib
from typing import Any, TypeVar, get_type_hints

from paretolab.errors import ConfigError

T = TypeVar("T")


def parse_options(cls: type[T], raw: dict[str, Any] | None, *, where: str) -> T:
    """Build dataclass ``cls`` from ``raw``; unknown keys and wrong types name the field and value."""
    raw = dict(raw or {})
    fields = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    hints = get_type_hints(cls)
    values: dict[str, Any] = {}
    for key, value in raw.items():
        if key not in fields:
            close = difflib.get_close_matches(key, list(fields), n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise ConfigError(f"{where}.{key}: unknown option{hint} (known: {', '.join(fields) or 'none'})")
        values[key] = _coerce(value, hints[key], f"{where}.{key}")
    return cls(**values)


def _coerce(value: Any, hint: Any, where: str) -> Any:
    text = str(hint)
    if value is None and "None" in text:
        return None
    if hint is bool or text == "bool":
        if isinstance(value, bool):
            return value
        raise ConfigError(f"{where}: expected true or false, got {value!r}")
    if hint is int or text.startswith("int"):
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise ConfigError(f"{where}: expected an integer, got {value!r}")
    if hint is float or text.startswith("float"):
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        raise ConfigError(f"{where}: expected a number, got {value!r}")
    if hint is str or text.startswith("str"):
        if isinstance(value, str):
            return value
        raise ConfigError(f"{where}: expected a string, got {value!r}")
    return value


def as_dict(options: Any) -> dict[str, Any]:
    """Plain-data view of an options object (for logging as MLflow params)."""
    return dataclasses.asdict(options)
