"""benchmarks/search_pruning.py, small: equal compute per arm, pruned arms stop trials and start more, a seed repeats."""

from __future__ import annotations

import importlib.util
import json
import sys

import pytest

from .conftest import ROOT

BUDGET = 10  # full trials: 4,000 trial-steps per arm, a few seconds for every arm (at 6, median pruned nothing on seed 1)


@pytest.fixture(scope="module")
def bench():
    """The benchmark module, imported as ``python benchmarks/search_pruning.py`` would (its folder on sys.path)."""
    sys.path.insert(0, str(ROOT / "benchmarks"))  # it imports search_hypervolume from beside it
    try:
        spec = importlib.util.spec_from_file_location("search_pruning", ROOT / "benchmarks" / "search_pruning.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules["search_pruning"] = module
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    return module


def test_every_arm_spends_the_budget_and_pruned_arms_buy_more_trials_with_it(bench, tmp_path, capsys) -> None:
    out = bench.main(["--seeds", "2", "--budget", str(BUDGET), "--json", str(tmp_path / "r.json")])
    printed = capsys.readouterr().out
    assert "analytic learning-curve model, not measured training" in printed
    rows = {r["arm"]: r for r in out["arms"]}
    assert set(rows) == {label for label, _, _ in bench.ARMS}
    assert all(f"| {label} |" in printed for label in rows), "one table row per arm"
    budget = out["budget_steps"]
    for label, row in rows.items():
        for steps in row["per_seed"]["steps"]:
            assert budget <= steps <= budget + max(bench.STEPS), f"{label} spent {steps} trial-steps on a budget of {budget}"
    unpruned = [label for label, _, pruner in bench.ARMS if pruner is None]
    most_unpruned = max(n for label in unpruned for n in rows[label]["per_seed"]["started"])
    for label, _, pruner in bench.ARMS:
        if pruner is None:
            assert rows[label]["per_seed"]["pruned"] == [0, 0]
            continue
        assert min(rows[label]["per_seed"]["pruned"]) >= 1, f"{label} pruned no trial"
        assert min(rows[label]["per_seed"]["started"]) > most_unpruned, f"{label} started no more trials than an unpruned arm"
    assert 0.0 < min(r["hv_mean"] for r in rows.values()) <= max(r["hv_mean"] for r in rows.values()) <= 1.0
    assert json.loads((tmp_path / "r.json").read_text())["arms"][0]["hypervolume"] == out["arms"][0]["hypervolume"]


def test_a_fixed_seed_gives_the_same_numbers(bench, capsys) -> None:
    args = ["--seeds", "1", "--budget", str(BUDGET), "--arms", "tpe + median", "random + asha"]
    first, second = bench.main(args), bench.main(args)
    capsys.readouterr()
    assert first["arms"] == second["arms"]
