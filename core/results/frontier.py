"""Pareto frontiers: which trials no other trial beats on every objective (among the feasible ones, under constraints)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from paretolab.results.replicates import per_configuration
from paretolab.study.constraints import FEASIBLE
from paretolab.study.constraints import STUDY_ATTR as CONSTRAINTS  # the study's bounds in words; absent without constraints


def is_feasible(attrs: dict[str, Any]) -> bool:
    """A complete trial's verdict from its user attrs: only an explicit ``feasible: false`` makes it infeasible
    (a trial of an older or unconstrained study has no verdict and counts as feasible)."""
    return attrs.get(FEASIBLE) is not False


def pareto_indices(points: Sequence[Sequence[float]] | np.ndarray, directions: Sequence[str], *, keep_ties: bool = False) -> list[int]:
    """Indices of the non-dominated points (exact ties kept once, or all of them with ``keep_ties``), in input order.

    Two objectives take O(n log n) in numpy (a lexicographic sort, then a running minimum, NaN ignored: 100,000
    points in milliseconds); more objectives use a sort-then-filter pass that is O(n·f) for f
    frontier points. ``points`` may be a list of rows or an (n, k) array.
    """
    if len(points) == 0:
        return []
    if len(directions) == 2:
        return _two_objectives(np.asarray(points, dtype=float), directions, keep_ties)
    signs = [1.0 if d == "minimize" else -1.0 for d in directions]
    keyed = [tuple(s * v for s, v in zip(signs, p)) for p in points]
    order = sorted(range(len(keyed)), key=lambda i: keyed[i])
    front: list[int] = []
    for i in order:  # lexicographic order: no later point can dominate an earlier one
        if not any(_dominates(keyed[j], keyed[i]) or (keyed[j] == keyed[i] and not keep_ties) for j in front):
            front.append(i)
    return sorted(front)


def _two_objectives(points: np.ndarray, directions: Sequence[str], keep_ties: bool) -> list[int]:
    """Sorted by (first, second) objective, both turned into minimisation, a point is on the frontier when its
    second objective beats every earlier point's; an exact duplicate of a frontier point is a tie."""
    keyed = points * np.array([1.0 if d == "minimize" else -1.0 for d in directions])
    order = np.lexsort((keyed[:, 1], keyed[:, 0]))  # stable: equal points keep their input order
    first, second = keyed[order, 0], keyed[order, 1]
    best_before = np.concatenate(([np.inf], np.minimum.accumulate(np.where(np.isnan(second), np.inf, second))[:-1]))
    on_front = second < best_before
    if keep_ties:
        same_as_previous = np.concatenate(([False], (first[1:] == first[:-1]) & (second[1:] == second[:-1])))
        leader = np.maximum.accumulate(np.where(same_as_previous, 0, np.arange(len(order))))  # first of each run of equal points
        on_front = on_front[leader]
    return sorted(order[on_front].tolist())


def _dominates(a: Sequence[float], b: Sequence[float]) -> bool:
    return all(x <= y for x, y in zip(a, b)) and any(x < y for x, y in zip(a, b))


def frontier_lines(pairs: Sequence[Sequence[str]], rows: list[dict[str, Any]], directions: dict[str, str],
                   replicates: tuple[str, ...] = ()) -> list[str]:
    """Markdown: for each metric pair, the methods on its frontier, exact ties shown as ties, and whether the sets differ.

    When trials repeat a configuration over replicates (seeds, splits), each configuration is one point:
    the mean over its replicates, said on the line with the spread; draws are never points of their own.
    """
    if not pairs:
        return []
    lines = ["**Frontiers** (listed: the points no other point beats on both metrics, by method; `=` marks an exact tie):", ""]
    sets = []
    for pair in pairs:
        trials = [r for r in rows if all(isinstance(r.get(m), (int, float)) for m in pair)]
        configurations = per_configuration(trials, tuple(pair), replicates) if replicates else trials
        averaged = len(configurations) < len(trials)  # some configuration repeats over replicates
        points = configurations if averaged else trials
        front = [points[i] for i in pareto_indices([[float(r[m]) for m in pair] for r in points], [directions[m] for m in pair], keep_ties=True)]
        by_method: dict[str, list[str]] = {}
        for r in front:
            tied = [o for o in front if o is not r and all(float(o[m]) == float(r[m]) for m in pair)]
            name = _point_name(r, averaged) + "".join(f" = {o['label']} {_point_name(o, averaged)}" for o in tied)
            by_method.setdefault(r["label"], []).append(name)
        sets.append(frozenset(by_method))
        listed = "; ".join(f"{label} ({', '.join(names)})" for label, names in sorted(by_method.items()))
        what = (f"{len(trials)} trials as {len(points)} configurations, each the mean over its replicates ({', '.join(replicates)})"
                if averaged else f"{len(trials)} trials")
        lines.append(f"- `{pair[0]}` vs `{pair[1]}` ({what}): {listed or 'no trial reported both'}")
    names = [", ".join(sorted(s)) or "none" for s in sets]
    outcome = ("the methods on the frontier differ: " + " → ".join(f"{{{n}}}" for n in names)) if len(set(sets)) > 1 \
        else f"the same methods sit on every frontier: {{{names[0]}}}"
    return [*lines, "", f"**Frontier outcome:** {outcome}.", ""]


def _point_name(row: dict[str, Any], averaged: bool) -> str:
    if averaged:
        return f"trials {'+'.join(map(str, row['trials']))}" if row["n"] > 1 else f"trial {row['trial']}"
    return f"trial {row['trial']}"
