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


def test_exact_ties_on_a_frontier_are_shown_as_ties_not_whichever_came_first():
    """LazyStack's trial 1 tied two other methods exactly; listing only the first-seen hid that."""
    from paretolab.results.frontier import frontier_lines, pareto_indices

    rows = [{"trial": 1, "label": "lazystack", "acc": 0.6, "cost": 2.0}, {"trial": 4, "label": "cascade", "acc": 0.6, "cost": 2.0},
            {"trial": 7, "label": "fixed", "acc": 0.6, "cost": 2.0}, {"trial": 9, "label": "large", "acc": 0.7, "cost": 5.0}]
    assert pareto_indices([[0.6, 2.0], [0.6, 2.0]], ["maximize", "minimize"]) == [0]  # the default keeps one
    assert pareto_indices([[0.6, 2.0], [0.6, 2.0]], ["maximize", "minimize"], keep_ties=True) == [0, 1]
    assert pareto_indices([[0.6, 2.0, 1.0], [0.6, 2.0, 1.0]], ["maximize", "minimize", "minimize"], keep_ties=True) == [0, 1]
    text = "\n".join(frontier_lines([("acc", "cost")], rows, {"acc": "maximize", "cost": "minimize"}))
    assert "lazystack (trial 1 = cascade trial 4 = fixed trial 7)" in text, text
    assert "cascade (trial 4 = lazystack trial 1 = fixed trial 7)" in text and "large (trial 9)" in text


def test_with_replicates_each_configuration_is_one_point_the_mean_over_its_replicates():
    """Routing over three splits: a configuration lucky on one split must not reach the frontier on that draw alone."""
    from paretolab.results.frontier import frontier_lines

    def row(n, label, threshold, split, acc, cost):
        return {"trial": n, "label": label, "acc": acc, "cost": cost,
                "run_params": {"stage0.route.threshold": threshold, "stage0.route.split": split}}

    rows = [row(0, "sdr", 0.1, 0, 0.70, 1.0), row(1, "sdr", 0.1, 1, 0.62, 1.0), row(2, "sdr", 0.1, 2, 0.66, 1.0),  # mean 0.66
            row(3, "cascade", 0.6, 0, 0.75, 1.0), row(4, "cascade", 0.6, 1, 0.55, 1.0), row(5, "cascade", 0.6, 2, 0.56, 1.0)]  # mean 0.62
    directions = {"acc": "maximize", "cost": "minimize"}
    pooled = "\n".join(frontier_lines([("acc", "cost")], rows, directions))
    assert "cascade (trial 3)" in pooled  # pooled draws: one lucky split puts the cascade on the frontier
    averaged = "\n".join(frontier_lines([("acc", "cost")], rows, directions, ("split",)))
    assert "(6 trials as 2 configurations, each the mean over its replicates (split)): sdr (trials 0+1+2)" in averaged, averaged
    assert "cascade" not in averaged.split("**Frontier outcome")[0].split(":", 2)[-1]


def test_a_rows_baseline_is_the_none_trial_of_its_own_replicate():
    """The report's "vs none" column: none at seed 1 is its own baseline, never compared with none at seed 0."""
    from paretolab.results.replicates import baseline_finder

    def row(n, method, seed):
        return {"trial": n, "method": method, "run_params": {"stage1.train.seed": seed, "stage1.train.lr": 0.003}}

    rows = [row(0, "none", 0), row(1, "none", 1), row(2, "bhyt", 0), row(3, "bhyt", 1), row(4, "bhyt", 2)]
    find = baseline_finder(rows, ("seed",))
    assert find(rows[1]) is rows[1] and find(rows[2]) is rows[0] and find(rows[3]) is rows[1]
    assert find(rows[4]) == "unpaired: no `none` trial at seed=2"


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


def test_a_configuration_repeated_over_replicates_is_placed_at_their_mean_never_its_luckiest_draw(tmp_path):
    """wanda ran each sparsity on three calibration draws: the frontier lists each configuration once, at the draws' mean,
    with their range; the method's table keeps every draw of a frontier configuration."""
    import json
    import statistics

    from paretolab.results.read import frontier_rows, method_frontiers, trial_table
    from paretolab.results.source import BundleSource
    from tests.conftest import ROOT, cli_here

    source = BundleSource([ROOT / "results" / "bundles" / "wanda_vs_magnitude.jsonl.gz"])
    _, trials = trial_table("wanda_vs_magnitude", source)
    ppl = {t["trial"]: t["ppl"] for t in trials}
    rows = {tuple(r["trials"]): r for r in frontier_rows("wanda_vs_magnitude", source)}
    assert set(rows) == {(12,), (0, 3, 6), (1, 4, 7), (2, 5, 8)}  # none, and wanda at 0.3 / 0.5 / 0.7
    three = rows[(2, 5, 8)]
    assert three["ppl"] == statistics.fmean(ppl[n] for n in (2, 5, 8)) and three["spread"]["ppl"] == [min(ppl[n] for n in (2, 5, 8)), max(ppl[n] for n in (2, 5, 8))]
    assert "stage0.wanda.calib_seed" not in three["params"]  # the row is no one draw
    said = cli_here("frontier", "wanda_vs_magnitude", "--bundle", str(ROOT / "results" / "bundles" / "wanda_vs_magnitude.jsonl.gz"), cwd=tmp_path).stdout
    assert "4 configuration(s), each at the mean over its replicates" in said and "2+5+8" in said, said
    listed = json.loads(cli_here("frontier", "wanda_vs_magnitude", "--bundle", str(ROOT / "results" / "bundles" / "wanda_vs_magnitude.jsonl.gz"),
                                 "--json", cwd=tmp_path).stdout)
    assert [r["trials"] for r in listed] == [[12], [0, 3, 6], [1, 4, 7], [2, 5, 8]]
    wanda = sorted(r["trial"] for r in method_frontiers("wanda_vs_magnitude", source) if r["method"] == "wanda")
    assert wanda == list(range(9))  # every draw of each frontier configuration, not the luckiest one per sparsity
