"""How `paretolab plugins` keeps its listing readable: metric families on one line each, every line wrapped at ``WIDTH``.

An engine measure reports one metric per load level and percentile (``llama_ttft_p50_s_c1`` ... ``vllm_itl_p99_s_c32``,
each with ``_ci_low`` and ``_ci_high``): 500 lines, and a measure's list of them one 7,000-character line. A *family* is
the metrics whose names differ only in their numbers (and their interval's bounds, folded into the metric they bound):
``llama_ttft_p{50,99}_s_c{1,2,4,8,16,32} (12, each with _ci_low, _ci_high)``.
"""

from __future__ import annotations

import re
import textwrap
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

WIDTH = 200  # no printed line is longer
BOUNDS = ("_ci_low", "_ci_high")
_DIGITS = re.compile(r"\d+")


@dataclass
class Family:
    """Metrics whose names differ only in their numbers: ``members`` in listing order, ``bounded`` when each has its interval."""

    members: list[str] = field(default_factory=list)
    bounded: bool = False

    @property
    def first(self) -> str:
        """The member with the smallest numbers (``llama_tok_s_c1``, not ``llama_tok_s_c16``): the one a line describes."""
        return min(self.members, key=lambda m: [int(d) for d in _DIGITS.findall(m)])

    @property
    def name(self) -> str:
        """``llama_ttft_p{50,99}_s_c{1,2,4,8,16,32}``: each number that varies as the set of its values, in numeric order."""
        first = self.members[0]
        if len(self.members) == 1:
            return first
        parts = _DIGITS.split(first)
        slots = [sorted({_DIGITS.findall(m)[i] for m in self.members}, key=int) for i in range(len(parts) - 1)]
        return parts[0] + "".join((s[0] if len(s) == 1 else "{" + ",".join(s) + "}") + p for s, p in zip(slots, parts[1:]))

    def text(self) -> str:
        """The family's name, with how many it holds and whether each carries its interval."""
        count = f"{len(self.members)}" if len(self.members) > 1 else ""
        bounds = f"each with {', '.join(BOUNDS)}" if self.bounded and count else f"with {', '.join(BOUNDS)}" if self.bounded else ""
        said = ", ".join(p for p in (count, bounds) if p)
        return f"{self.name} ({said})" if said else self.name


def families(names: Iterable[str], same: Callable[[str], Any] = lambda name: None) -> list[Family]:
    """``names`` as families, in the order of their first member: a name ending in ``_ci_low``/``_ci_high`` whose metric is
    listed folds into it; names that differ only in their digits (and in ``same(name)``: unit, direction) are one family."""
    names = list(names)
    listed = set(names)
    bounds = {n for n in names if n.endswith(BOUNDS) and _stem(n) in listed}
    out: dict[Any, Family] = {}
    for name in names:
        if name in bounds:
            continue
        bounded = all(name + b in bounds for b in BOUNDS)
        key = (_DIGITS.sub("#", name), bounded, same(name)) if _DIGITS.search(name) else (name, bounded, None)
        family = out.setdefault(key, Family(bounded=bounded))
        family.members.append(name)
    return list(out.values())


def _stem(name: str) -> str:
    for b in BOUNDS:
        if name.endswith(b):
            return name[: -len(b)]
    return name


def names_text(names: Iterable[str]) -> str:
    """A list of metric names, each family once: ``prefill_ms, llama_tok_s_c{1,2,4,8,16,32} (6, each with ...)``."""
    return ", ".join(f.text() for f in families(names))


def lines(text: str, indent: int) -> list[str]:
    """``text`` (already indented by ``indent``) in lines of at most ``WIDTH`` characters, continued 4 deeper; a word longer
    than a line (a URL) is kept whole."""
    if len(text) <= WIDTH:
        return [text]
    return textwrap.wrap(text, WIDTH, subsequent_indent=" " * (indent + 4), break_long_words=False, break_on_hyphens=False)
