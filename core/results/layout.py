"""How a study's section lays out what the verdict code and the trial table found: one verdict a line with its mark,
trials best first, and a wide table split into a short decision table and every measurement, collapsed.

Nothing here judges: the verdicts are :mod:`paretolab.results.claims`' lines, the trials
:func:`paretolab.results.read.per_method`'s rows; this module only orders and places them.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import Any

from paretolab.results.frontier import pareto_indices
from paretolab.results.verdict_words import LEGEND, MARKS, NO_VERDICT, verdict_mark  # noqa: F401  (LEGEND, MARKS: the documents' legend)

VERDICT_LINE = re.compile(r"\*\*Verdict(?: at .*?)?: (.+?)\*\*")
WIDE = 9  # a table of more columns than this is split: the decision table, then every measurement collapsed
EVERY = "Every measurement"


def marked_verdicts(lines: list[str]) -> list[str]:
    """The claim block with each ``**Verdict ...**`` line an item of its own, opened by its mark (a blank line before
    the first: a list directly under a paragraph is no list to every Markdown)."""
    out: list[str] = []
    for line in lines:
        found = VERDICT_LINE.match(line)
        if found:
            if out and out[-1] != "" and not out[-1].startswith("- "):
                out.append("")
            line = f"- {verdict_mark(found.group(1))} {line}"
        out.append(line)
    return out


def unmarked(line: str) -> str:
    """A verdict item as the verdict code wrote it (the list marker and the mark taken off)."""
    for mark in (*MARKS.values(), NO_VERDICT):
        if line.startswith(f"- {mark} "):
            return line[len(mark) + 3:]
    return line


def best_first(rows: list[dict[str, Any]], objectives: list[tuple[str, str]]) -> list[dict[str, Any]]:
    """The trials best first: the feasible ones by Pareto front on the study's objectives (all methods pooled: the
    frontier first, then the front under it, ...), each front by its first objective; a trial missing an objective and
    an infeasible trial last."""
    if not objectives:
        return list(rows)
    names = [m for m, _ in objectives]
    signs = [1.0 if d == "minimize" else -1.0 for _, d in objectives]

    def value(r: dict[str, Any], m: str) -> float | None:
        v = r.get(m)
        return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) else None

    ranked = [i for i, r in enumerate(rows) if r.get("feasible", True) and all(value(r, m) is not None for m in names)]
    front_of: dict[int, int] = {}
    left, depth = ranked, 0
    while left:
        front = pareto_indices([[value(rows[i], m) for m in names] for i in left], [d for _, d in objectives], keep_ties=True)
        for k in front:
            front_of[left[k]] = depth
        on = set(front)
        left = [i for k, i in enumerate(left) if k not in on]
        depth += 1

    def key(i: int) -> tuple[Any, ...]:
        first = value(rows[i], names[0])
        return (i not in front_of, front_of.get(i, 0), first is None, signs[0] * first if first is not None else 0.0,
                str(rows[i].get("method", "")), rows[i].get("trial", 0))
    return [rows[i] for i in sorted(range(len(rows)), key=key)]


def key_columns(columns: list[str], objectives: list[tuple[str, str]], always: tuple[str, ...]) -> list[str]:
    """The decision table's columns: method, params, each objective with its difference and ratio to the unmodified
    model, and ``always`` (cost, trial, why a trial is infeasible), in the full table's order."""
    names = [m for m, _ in objectives]

    def key(c: str) -> bool:
        return (c in ("method", "params", *names, *always) or any(c == f"{m} ÷ none" or c.startswith(f"Δ{m} ") for m in names)
                or ("size_bytes" in names and c == "size ÷ fp16 base"))
    return [c for c in columns if key(c)]


def decision_tables(rows: list[dict[str, Any]], columns: list[str], objectives: list[tuple[str, str]],
                    table: Callable[[list[dict[str, Any]], list[str]], str], always: tuple[str, ...]) -> list[str]:
    """The study's table, best first: as it is when it is narrow; else the decision table, then every column in a
    collapsed ``<details>`` block (``table``: the documents' table writer)."""
    if len(columns) <= WIDE:
        return [table(rows, columns), ""]
    short = key_columns(columns, objectives, always)
    return [table(rows, short), "", f"<details><summary>{EVERY}</summary>", "",
            table(rows, columns), "", "</details>", ""]
