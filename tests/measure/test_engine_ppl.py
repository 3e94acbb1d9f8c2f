"""Perplexity in the engine: the windows cut here are the perplexity task's, and the comparison's arithmetic."""

from __future__ import annotations

import json

import numpy as np
import pytest

from paretolab.measure.engine_ppl import Windows, compare, task_windows
from paretolab.plugin_api.options import parse_options
from paretolab.tasks.perplexity import Perplexity, PerplexityOptions


@pytest.mark.parametrize("max_tokens", [600, 512])
def test_windows_are_the_tasks(tiny, ctx, max_tokens: int) -> None:
    task = {"name": "perplexity", "corpus": "pydoc", "max_tokens": max_tokens, "context": 128, "stride": 128}
    Perplexity().evaluate(tiny, parse_options(PerplexityOptions, {k: v for k, v in task.items() if k != "name"}, where="t"), ctx)
    w = task_windows(tiny.tokenizer, task, ctx.workdir)
    assert isinstance(w, Windows)
    scores = json.loads((ctx.workdir / "per_example.json").read_text())
    assert len(w.ids) == scores["n"] and w.weights == scores["weights"]
    assert [len(i) - 1 for i in w.ids] == [int(x) for x in scores["weights"]]
    assert sum(len(i) for i in w.ids) == max_tokens
    assert "overlapping" in task_windows(tiny.tokenizer, {**task, "stride": 64}, ctx.workdir)
    assert "not perplexity" in task_windows(tiny.tokenizer, {"name": "mc"}, ctx.workdir)


def test_compare_arithmetic() -> None:
    rng = np.random.default_rng(0)
    trial = list(rng.uniform(2.5, 3.5, 40))
    w = Windows(ids=[[0]] * 40, trial_nll=trial, weights=[511.0] * 40)
    same = compare(trial, w, "e")
    assert same["e_ppl"] == pytest.approx(float(np.exp(np.mean(trial))))
    assert same["e_ppl_diff"] == 0.0 and same["e_ppl_gap"] == 0.0
    assert same["e_ppl_ci_low"] < same["e_ppl"] < same["e_ppl_ci_high"]
    noisy = compare([x + rng.normal(0, 0.01) for x in trial], w, "e")
    assert noisy["e_ppl_gap"] == 0.0 or abs(noisy["e_ppl_diff"]) < 0.1
    worse = compare([x + 0.05 for x in trial], w, "e")  # every window 0.05 nats worse: a gap beyond noise
    assert worse["e_ppl_gap"] == 1.0
    assert worse["e_ppl_diff"] == pytest.approx(worse["e_ppl"] - same["e_ppl"])
    assert worse["e_ppl_diff_ci_low"] > 0


def test_float_rounding_is_no_gap() -> None:
    """An engine off by float rounding the same way on every window (vLLM's dense twin) has an interval that
    excludes 0 but no gap; 1e-3 nats on every window is a gap."""
    rng = np.random.default_rng(1)
    trial = list(rng.uniform(2.5, 3.0, 8))
    w = Windows(ids=[[0]] * 8, trial_nll=trial, weights=[511.0] * 8)
    rounded = compare([x - 4e-7 + rng.uniform(-1e-8, 1e-8) for x in trial], w, "e")
    assert rounded["e_ppl_diff_ci_high"] < 0 and rounded["e_ppl_gap"] == 0.0
    assert compare([x + 1e-3 for x in trial], w, "e")["e_ppl_gap"] == 1.0
