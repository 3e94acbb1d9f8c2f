"""Checks every block of a pipeline uses on its fields: required, known keys, registered names, finite numbers.

Each error names the field (``stages[1].params.sparsity``), the value received and the fix.
"""

from __future__ import annotations

import difflib
import math
from typing import Any

from paretolab.errors import ConfigError, UnknownNameError


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def refuse_nan(value: Any, where: str) -> None:
    if isinstance(value, float) and math.isnan(value):
        raise ConfigError(f"{where or 'pipeline'}: NaN is not a usable value; give a number")
    if isinstance(value, dict):
        for key, item in value.items():
            refuse_nan(item, f"{where}.{key}" if where else str(key))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            refuse_nan(item, f"{where}[{i}]")


def require(raw: dict[str, Any], key: str, typ: type, prefix: str) -> Any:
    if key not in raw:
        raise ConfigError(f"{prefix}{key}: required field is missing")
    value = raw[key]
    if not isinstance(value, typ) or (isinstance(value, str) and not value.strip()):
        raise ConfigError(f"{prefix}{key}: expected a {typ.__name__}, got {value!r}")
    return value


def no_unknown(raw: dict[str, Any], allowed: tuple[str, ...], prefix: str) -> None:
    for key in raw:
        if key not in allowed:
            close = difflib.get_close_matches(str(key), allowed, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise ConfigError(f"{prefix}{key}: unknown field{hint} (allowed: {', '.join(allowed)})")


def lookup(registry: Any, name: Any, where: str) -> Any:
    if not isinstance(name, str):
        raise ConfigError(f"{where}: expected a name, got {name!r}")
    try:
        return registry.get(name)
    except UnknownNameError as exc:
        raise ConfigError(f"{where}: {exc}") from None
