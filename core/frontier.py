"""Pareto frontiers: which trials no other trial beats on every objective."""

from __future__ import annotations

from collections.abc import Sequence


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
