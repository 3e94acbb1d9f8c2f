"""Number flags: argparse types that refuse what no command can use (NaN, inf, out of range) in argparse's one error line.

``float("nan")`` and ``float("inf")`` parse as floats, and every comparison with NaN is false: ``--max-load nan`` read
every timed bundle as timed on a busy machine and planned a rerun of them all. So a number flag names its range here.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable

MAX_TRIALS = 100_000  # paretolab.study.spec.MAX_TRIALS (not imported: `paretolab --help` stays fast); a test holds them equal
MAX_INT = 10**9  # counts (tokens, prompts, vocabulary): far past any real one, far below what would exhaust memory first


def number(low: float | None = None, high: float | None = None, *, above: bool = False) -> Callable[[str], float]:
    """A finite float from ``low`` (excluded with ``above``) to ``high``."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"{text!r} is not a finite number; give {_span(low, high, above)}")
        if low is not None and (value <= low if above else value < low) or high is not None and value > high:
            raise argparse.ArgumentTypeError(f"{text} is out of range; give {_span(low, high, above)}")
        return value

    parse.__name__ = "number"  # argparse names the type in its "invalid ... value" message
    return parse


def whole(low: int | None = None, high: int | None = MAX_INT) -> Callable[[str], int]:
    """An integer from ``low`` to ``high``."""

    def parse(text: str) -> int:
        try:
            value = int(text.strip()) if len(text) <= 40 else None
        except ValueError:
            value = None
        if value is None:
            raise argparse.ArgumentTypeError(f"{text[:40]!r} is not a whole number; give {_span(low, high, False, 'a whole number')}")
        if low is not None and value < low or high is not None and value > high:
            raise argparse.ArgumentTypeError(f"{value} is out of range; give {_span(low, high, False, 'a whole number')}")
        return value

    parse.__name__ = "whole number"
    return parse


def _span(low: float | None, high: float | None, above: bool, what: str = "a number") -> str:
    from paretolab.plugin_api.numbers import number as text  # the one formatter (1G, not 1e+09), on the error path only

    if low is not None and high is not None and not above:
        return f"{what} from {text(low)} to {text(high)}"
    parts = [f"{'greater than' if above else 'at least'} {text(low)}" if low is not None else "", f"at most {text(high)}" if high is not None else ""]
    return f"{what} " + " and ".join(p for p in parts if p) if any(parts) else what
