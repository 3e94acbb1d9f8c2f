"""Pareto sets: the fast sweep agrees with the definition."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from paretolab.results.frontier import pareto_indices


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


def test_frontier_lines_name_the_methods_on_each_frontier_and_whether_they_differ():
    from paretolab.results.frontier import frontier_lines

    rows = [  # KD: best quality, cheap without its teacher, dear with it
        {"trial": 0, "label": "distill_kd", "val_bpb": 3.0, "student_side_energy_j": 100.0, "pipeline_energy_j": 900.0},
        {"trial": 1, "label": "none", "val_bpb": 3.2, "student_side_energy_j": 100.0, "pipeline_energy_j": 100.0},
        {"trial": 2, "label": "distill_sft", "val_bpb": 3.5, "student_side_energy_j": 110.0, "pipeline_energy_j": 2000.0},
    ]
    directions = {"val_bpb": "minimize", "student_side_energy_j": "minimize", "pipeline_energy_j": "minimize"}
    text = "\n".join(frontier_lines([("val_bpb", "student_side_energy_j"), ("val_bpb", "pipeline_energy_j")], rows, directions))
    assert "`val_bpb` vs `student_side_energy_j` (3 trials): distill_kd (trial 0)\n" in text
    assert "`val_bpb` vs `pipeline_energy_j` (3 trials): distill_kd (trial 0); none (trial 1)" in text
    assert "**Frontier outcome:** the methods on the frontier differ: {distill_kd} → {distill_kd, none}." in text
    same = "\n".join(frontier_lines([("val_bpb", "pipeline_energy_j")], rows, directions))
    assert "the same methods sit on every frontier: {distill_kd, none}" in same


def test_a_pipeline_frontier_on_an_unknown_metric_is_refused():
    import pytest
    import yaml

    from paretolab.errors import ConfigError
    from paretolab.study.spec import parse_spec

    raw = yaml.safe_load("""
name: f
model: tiny-llama
task: {name: perplexity, max_tokens: 64}
stages: [{method: none}]
objectives: [{metric: ppl}]
frontiers: [[ppl, size_byte]]
""")
    with pytest.raises(ConfigError, match=r"frontiers\[0\].*size_bytes"):
        parse_spec(raw)
    raw["frontiers"] = [["ppl", "size_bytes"]]
    assert parse_spec(raw).name == "f"
