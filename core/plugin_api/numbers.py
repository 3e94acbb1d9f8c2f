"""The one way paretolab writes a number: dashboard tables and hovers, CLI tables, the report and the results documents.

Rules (``DIGITS`` = 4 significant digits):

- a metric in ``bytes`` is scaled to B / kB / MB / GB / TB / PB (powers of 1000): ``538,060,032`` -> ``538.1 MB``; a metric
  in ``MiB`` (memory peaks) is converted to bytes and written the same way (``40.16`` MiB -> ``42.11 MB``): no KiB, MiB or GiB;
- a ratio (a metric in ``x`` or ``ratio``, a column named ``a ÷ b``) carries ``×``, its interval too: ``×1.24 [×1.08, ×1.43]``;
- a whole number below a million is written exactly: ``318316``, ``8`` (also ``8.0``); no thousands separators
  anywhere (a comma separates values in labels such as ``rtn[bits=8,group_size=128]`` and in CSV);
- a number from a million up carries a suffix: ``4,525,265.07`` -> ``4.525M``, ``1.73106e8`` -> ``173.1M``, then
  ``G``, ``T``, ``P`` and ``E``;
- anything else keeps 4 significant digits without float noise: ``0.5675410179622814`` -> ``0.5675``,
  ``14.21625090642673`` -> ``14.22``; from 1000 up, the integer part (``12346``); below 1e-4 the same digits after the
  zeros (``0.00001234``), down to 1e-15, below which it reads ``0``;
- never e-notation (``1.234e-05``, ``5.3806e+08``): a person reads every number here; :func:`plain_text` rewrites the
  e-notation of text stored by older code (a constraint's reason, an engine's label) the same way;
- ``None`` and NaN are blank; text and booleans are written as they are.

A metric's unit comes from the metric registry (:func:`unit_of`); axis titles and column headers say it with its
direction (:func:`axis_title`: ``size [MB] ↓``, ``ppl ↓``).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from functools import lru_cache
from typing import Any

DIGITS = 4
BYTE_STEPS = (("PB", 1e15), ("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3))
LARGE_STEPS = (("E", 1e18), ("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6))
BYTE_UNITS = {"bytes": 1.0, "MiB": float(2**20)}  # units written as bytes (kB, MB, GB): the factor to bytes
RATIO = "x"  # the unit of a ratio: written with ×
RATIO_UNITS = (RATIO, "ratio")
MAX_DECIMALS = 15  # below 1e-15 a number reads 0
E_NOTATION = re.compile(r"(?<![\w.])([-+]?)(\d+(?:\.\d+)?[eE][-+]?\d+)(?![\w.])")  # 5.3806e+08, not a hash's 2e635
ARROWS = {"minimize": "↓", "maximize": "↑"}
UNITLESS = ("", "ratio", "x", "flag", "score", "fraction", "accuracy")  # units an axis title leaves out (``ppl ↓``, not ``ppl [] ↓``)


def number(value: Any, unit: str = "", *, signed: bool = False, digits: int = DIGITS) -> str:
    """``value`` as text by the rules above; ``unit="bytes"`` (or ``"MiB"``) scales it and says the scaled unit, a ratio unit
    (``"x"``) writes ``×``; ``signed`` writes a ``+`` (a difference: no ``×``); ``digits`` only for a spread (a standard error is
    written to 2: ``0.4575 ± 0.025``) or bounds (:func:`interval_digits`)."""
    if value is None or isinstance(value, str):
        return value or ""
    if isinstance(value, bool) or not isinstance(value, (int, float)) and not hasattr(value, "__float__"):
        return str(value)
    x = float(value)
    if math.isnan(x):
        return ""
    mark = "×" if unit in RATIO_UNITS and not signed else ""
    if math.isinf(x):
        return mark + ("+" if signed and x > 0 else "") + ("∞" if x > 0 else "-∞")
    sign = "+" if signed and x >= 0 else ""
    if unit in BYTE_UNITS:
        x *= BYTE_UNITS[unit]
        for name, step in BYTE_STEPS:
            if abs(x) >= step:
                return f"{sign}{_significant(x / step, digits)} {name}"
        return f"{sign}{_plain(x, digits)} B"
    return mark + sign + _plain(x, digits)


def ratio(value: Any, *, digits: int = DIGITS) -> str:
    """A ratio: ``×1.24`` (:func:`number` with the ratio unit)."""
    return number(value, RATIO, digits=digits)


def _plain(x: float, digits: int = DIGITS) -> str:
    magnitude = abs(x)
    for name, step in LARGE_STEPS:
        if magnitude >= step:
            return f"{_significant(x / step, digits)}{name}"
    if x == int(x):
        return f"{int(x)}"
    if magnitude >= 1000:
        return f"{x:.0f}"
    return _significant(x, digits)


def _significant(x: float, digits: int = DIGITS) -> str:
    """``DIGITS`` significant digits, never scientific in [1e-4, 1e4), no trailing zeros: 0.5675, 14.22, 538.1, 1.5."""
    if x == 0:
        return "0"
    decimals = min(max(digits - 1 - math.floor(math.log10(abs(x))), 0), MAX_DECIMALS)
    text = f"{x:.{decimals}f}"
    if abs(float(text)) >= 1000:  # from 1000 up (999.96 rounds there too): the integer part
        return f"{x:.0f}"
    text = _strip(text)
    return "0" if text == "-0" else text


def _strip(text: str) -> str:
    """No trailing zeros after a decimal point (``1.500`` -> ``1.5``)."""
    return text.rstrip("0").rstrip(".") if "." in text else text


def metric_value(name: str, value: Any, *, signed: bool = False) -> str:
    """A metric's value in its registered unit: ``metric_value("size_bytes", 4525265.07)`` -> ``4.525 MB``; a column
    named as a quotient (``ppl ÷ none``) is a ratio: ``×1.051``."""
    return number(value, RATIO if "÷" in name else unit_of(name), signed=signed)


def plain_text(text: str, unit: str = "") -> str:
    """``text`` (stored by older code) with each e-notation number written by :func:`number` in ``unit``:
    ``"largest relative change 4.9e-04"`` -> ``"largest relative change 0.00049"``."""
    return E_NOTATION.sub(lambda m: number(float(m.group(1) + m.group(2)), unit, signed=m.group(1) == "+"), text)


def param_value(value: Any) -> str:
    """A parameter's value: numbers by :func:`number` (``0.5675``, ``128``), also when they come as text (MLflow keeps
    params as strings: ``"0.5675410179622814"`` -> ``0.5675``); other text as it is."""
    if isinstance(value, str):
        try:
            parsed = float(value)
        except ValueError:
            return value
        return number(parsed) if math.isfinite(parsed) and value.strip() == value and value else value
    return number(value)


def params_text(params: Mapping[str, Any], *, sep: str = " ") -> str:
    """``sparsity=0.5675 scope=row``: names without their stage prefix where the caller already stripped it."""
    return sep.join(f"{k}={param_value(v)}" for k, v in params.items())


def plural(noun: str) -> str:
    """A unit's plural for "over 1000 queries": ``query`` -> ``queries``, ``batch`` -> ``batches``, ``window`` -> ``windows``."""
    if noun.endswith("y") and len(noun) > 1 and noun[-2] not in "aeiou":
        return noun[:-1] + "ies"
    return noun + "es" if noun.endswith(("s", "x", "z", "ch", "sh")) else noun + "s"


def interval_digits(low: Any, high: Any, unit: str = "") -> int:
    """The significant digits an interval is written with: ``DIGITS``, or more where its two different bounds would print
    the same (``[1.003, 1.003]`` reads as zero width, which is "no variation observed"; ``[1.0029, 1.0034]`` is not)."""
    if not all(isinstance(v, (int, float)) and math.isfinite(v) for v in (low, high)) or low == high:
        return DIGITS
    for d in range(DIGITS, 10):
        if number(low, unit, digits=d) != number(high, unit, digits=d):
            return d
    return DIGITS


def interval_text(value: Any, low: Any, high: Any, unit: str = "", *, signed: bool = False) -> str:
    """``23.4 [22.1, 24.9]``: a value and its 95 % interval, all by :func:`number` (with :func:`interval_digits`); in a ratio
    unit each of the three carries ``×``: ``×1.24 [×1.08, ×1.43]``."""
    d = interval_digits(low, high, unit)
    return f"{number(value, unit, signed=signed, digits=d)} [{number(low, unit, signed=signed, digits=d)}, {number(high, unit, signed=signed, digits=d)}]"


def tick_labels(values: Iterable[Any]) -> list[str]:
    """An axis's tick labels, all in one notation: :func:`number`'s, except that on an axis reaching a million the ticks
    from 1000 up carry a suffix too (``10k``, ``100k``, ``1M``; never ``100000`` beside ``1M``)."""
    ticks = [float(v) for v in values]
    if not any(math.isfinite(v) and abs(v) >= 1e6 for v in ticks):
        return [number(v) for v in ticks]
    return [f"{_significant(v / 1e3)}k" if 1e3 <= abs(v) < 1e6 else number(v) for v in ticks]


def axis_title(name: str, direction: str | None = None, unit: str | None = None) -> str:
    """An axis title or column header: the metric, its unit as drawn and its better direction: ``ppl ↓``,
    ``size [MB] ↓`` (bytes are drawn in MB: see :func:`axis_scale`), ``decode_tok_s [tokens/s] ↑``."""
    unit = unit_of(name) if unit is None else unit
    label = name.removesuffix("_bytes") if unit == "bytes" else name
    shown = "MB" if unit in BYTE_UNITS else "" if unit in UNITLESS else unit
    arrow = ARROWS.get(direction or "", "")
    return " ".join(p for p in (label, f"[{shown}]" if shown else "", arrow) if p)


def axis_scale(name: str, unit: str | None = None) -> float:
    """What an axis divides a metric's values by to draw them in the unit :func:`axis_title` names (bytes, MiB -> MB)."""
    unit = unit_of(name) if unit is None else unit
    return 1e6 / BYTE_UNITS[unit] if unit in BYTE_UNITS else 1.0


def unit_of(name: str) -> str:
    """The registered unit of metric ``name`` ("" when none is registered).

    The core's own metrics are answered from their definitions without loading any plugin (the CLI's fast
    path); any other name asks the full metric registry, built once per process.
    """
    builtin = _builtin_units()
    if name in builtin:
        return builtin[name]
    return _registry_units().get(name, "")


def units_of(names: Iterable[str]) -> dict[str, str]:
    return {n: unit_of(n) for n in names}


@lru_cache(maxsize=1)
def _builtin_units() -> dict[str, str]:
    from paretolab.plugin_api.metrics import BUILTIN_METRICS

    return {m.name: m.unit for m in BUILTIN_METRICS}


@lru_cache(maxsize=1)
def _registry_units() -> dict[str, str]:
    from paretolab.plugin_api.manager import registries

    try:
        return {m.name: m.unit for m in registries().metrics}
    except Exception:  # noqa: BLE001 - a broken plugin must not stop a number from being written; `paretolab plugins` names it
        return {}
