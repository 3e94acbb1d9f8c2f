"""Pareto sets: the fast sweep agrees with the definition."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from paretolab.frontier import pareto_indices


def brute_force(points, directions):
    signs = [1 if d == "minimize" else -1 for d in directions]
    keyed = [tuple(s * v for s, v in zip(signs, p)) for p in points]
    out, seen = [], set()
    for i, a in enumerate(keyed):
        dominated = any(all(x <= y for x, y in zip(b, a)) and any(x < y for x, y in zip(b, a)) for b in keyed)
        if not dominated and a not in seen:
            out.append(i)
            seen.add(a)
    return out


values = st.integers(min_value=0, max_value=6).map(float)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(values, values), max_size=40), st.sampled_from(["minimize", "maximize"]), st.sampled_from(["minimize", "maximize"]))
def test_two_objectives_match_the_definition(points, d0, d1):
    got = pareto_indices(points, [d0, d1])
    expected = brute_force(points, [d0, d1])
    assert [points[i] for i in got] == [points[i] for i in expected] or sorted(points[i] for i in got) == sorted(points[i] for i in expected)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(values, values, values), max_size=30))
def test_three_objectives_match_the_definition(points):
    got = pareto_indices(points, ["minimize", "maximize", "minimize"])
    expected = brute_force(points, ["minimize", "maximize", "minimize"])
    assert sorted(points[i] for i in got) == sorted(points[i] for i in expected)


def test_trade_off_example():
    points = [(10.0, 100.0), (12.0, 50.0), (11.0, 120.0), (20.0, 10.0), (12.0, 50.0)]
    assert pareto_indices(points, ["minimize", "minimize"]) == [0, 1, 3]
