"""Pareto frontiers: which trials no other trial beats on every objective."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def pareto_indices(points: Sequence[Sequence[float]], directions: Sequence[str]) -> list[int]:
    """Indices of the non-dominated points (ties kept once), in input order.

    Two objectives take O(n log n) (sort, then one sweep); more objectives use a
    sort-then-filter pass that is O(n·f) for f frontier points.
    """
    if not points:
        return []
    signs = [1.0 if d == "minimize" else -1.0 for d in directions]
    keyed = [tuple(s * v for s, v in zip(signs, p)) for p in points]
    order = sorted(range(len(keyed)), key=lambda i: keyed[i])
    front: list[int] = []
    if len(signs) == 2:
        best_second = float("inf")
        last: tuple[float, ...] | None = None
        for i in order:
            if keyed[i][1] < best_second:
                front.append(i)
                best_second = keyed[i][1]
                last = keyed[i]
            elif last is not None and keyed[i] == last:
                continue  # an exact duplicate of a frontier point: keep the first one only
        return sorted(front)
    for i in order:  # lexicographic order: no later point can dominate an earlier one
        if not any(_dominates(keyed[j], keyed[i]) or keyed[j] == keyed[i] for j in front):
            front.append(i)
    return sorted(front)


def _dominates(a: Sequence[float], b: Sequence[float]) -> bool:
    return all(x <= y for x, y in zip(a, b)) and any(x < y for x, y in zip(a, b))


def frontier_lines(pairs: Sequence[Sequence[str]], rows: list[dict[str, Any]], directions: dict[str, str]) -> list[str]:
    """Markdown: for each metric pair, the methods whose trials sit on the frontier of all trials pooled, and whether the sets differ."""
    if not pairs:
        return []
    lines = ["**Frontiers** (every complete trial is one point; listed: the trials no other trial beats on both metrics, by method):", ""]
    sets = []
    for pair in pairs:
        points = [r for r in rows if all(isinstance(r.get(m), (int, float)) for m in pair)]
        front = [points[i] for i in pareto_indices([[float(r[m]) for m in pair] for r in points], [directions[m] for m in pair])]
        by_method: dict[str, list[int]] = {}
        for r in front:
            by_method.setdefault(r["label"], []).append(int(r["trial"]))
        sets.append(frozenset(by_method))
        listed = "; ".join(f"{label} (trial{'s' if len(t) > 1 else ''} {', '.join(map(str, sorted(t)))})" for label, t in sorted(by_method.items()))
        lines.append(f"- `{pair[0]}` vs `{pair[1]}` ({len(points)} trials): {listed or 'no trial reported both'}")
    names = [", ".join(sorted(s)) or "none" for s in sets]
    outcome = ("the methods on the frontier differ: " + " → ".join(f"{{{n}}}" for n in names)) if len(set(sets)) > 1 \
        else f"the same methods sit on every frontier: {{{names[0]}}}"
    return [*lines, "", f"**Frontier outcome:** {outcome}.", ""]
