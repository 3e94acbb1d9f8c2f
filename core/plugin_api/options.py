"""Typed option blocks for tasks and measures, parsed from plain YAML data with useful errors."""

from __future__ import annotations

import dataclasses
import difflib
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar, get_type_hints

from paretolab.errors import ConfigError

T = TypeVar("T")


def option(
    default: Any,
    *,
    low: float | None = None,
    high: float | None = None,
    at_most: str | None = None,
    one_of: tuple[Any, ...] | None = None,
    data: str | None = None,
    check: Callable[[Any], Any] | None = None,
) -> Any:
    """A dataclass field with the range ``parse_options`` enforces.

    ``low``/``high`` bound a number, ``at_most`` names another field it may not exceed,
    ``one_of`` lists the allowed values, ``data`` is ``"corpus"`` (a built-in corpus or an
    existing text file) or ``"file"`` (a data set name, or a path that exists); ``check`` is called
    with the value and raises ConfigError itself.
    """
    meta = {"low": low, "high": high, "at_most": at_most, "one_of": one_of, "data": data, "check": check}
    return dataclasses.field(default=default, metadata={k: v for k, v in meta.items() if v is not None})


def parse_options(cls: type[T], raw: dict[str, Any] | None, *, where: str) -> T:
    """Build dataclass ``cls`` from ``raw``; unknown keys, wrong types and out-of-range values name the field and value."""
    if raw is not None and not isinstance(raw, dict):
        raise ConfigError(f"{where}: expected a mapping of options, got {raw!r}")
    raw = dict(raw or {})
    fields = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    hints = get_type_hints(cls)
    values: dict[str, Any] = {}
    for key, value in raw.items():
        if key not in fields:
            close = difflib.get_close_matches(str(key), list(fields), n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise ConfigError(f"{where}.{key}: unknown option{hint} (known: {', '.join(fields) or 'none'})")
        values[key] = _coerce(value, hints[key], f"{where}.{key}")
    parsed = cls(**values)
    for f in fields.values():
        _check_range(parsed, f, where)
    return parsed


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
        if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
            return float(value)
        raise ConfigError(f"{where}: expected a finite number, got {value!r}")
    if hint is str or text.startswith("str"):
        if isinstance(value, str):
            return value
        raise ConfigError(f"{where}: expected a string, got {value!r}")
    return value


def _check_range(parsed: Any, f: dataclasses.Field, where: str) -> None:
    meta, value, name = f.metadata, getattr(parsed, f.name), f"{where}.{f.name}"
    if value is None:
        return
    low, high = meta.get("low"), meta.get("high")
    if low is not None and value < low or high is not None and value > high:
        span = f"from {low} to {high}" if low is not None and high is not None else f">= {low}" if low is not None else f"<= {high}"
        raise ConfigError(f"{name}: {value!r} is out of range; give a value {span}")
    other = meta.get("at_most")
    if other is not None and value > getattr(parsed, other):
        raise ConfigError(f"{name}: {value!r} is larger than {where}.{other} ({getattr(parsed, other)!r}); give {f.name} <= {other}")
    choices = meta.get("one_of")
    if choices is not None and value not in choices:
        raise ConfigError(f"{name}: {value!r} is not one of {', '.join(map(repr, choices))}")
    if meta.get("check") is not None:
        meta["check"](value)
    kind = meta.get("data")
    if kind and isinstance(value, str) and value:
        problem = _data_problem(value, kind)
        if problem:
            raise ConfigError(f"{name}: {value!r} {problem}")


def _data_problem(value: str, kind: str) -> str | None:
    """Why ``value`` cannot name the data it should (None when it can, as far as can be told here)."""
    from paretolab.data import BUILTIN_CORPORA, KNOWN_FILES

    path = Path(value).expanduser()
    looks_like_path = "/" in value or "\\" in value or path.suffix != ""
    if kind == "corpus":
        if value in BUILTIN_CORPORA or value in KNOWN_FILES or path.is_file():
            return None
        return f"is neither a built-in corpus ({', '.join(BUILTIN_CORPORA + tuple(KNOWN_FILES))}) nor an existing file; fix the path or pick a built-in corpus"
    if looks_like_path and not path.is_file():
        return "is not an existing file; fix the path, or give the name of a data set in the data dir"
    return None


def as_dict(options: Any) -> dict[str, Any]:
    """Plain-data view of an options object (for logging as MLflow params)."""
    return dataclasses.asdict(options)
