"""Known-answer tests of the uncertainty statistics."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from paretolab.stats import (
    Samples,
    bootstrap_interval,
    mean_with_stderr,
    paired_difference,
    per_example_json,
    samples,
    stderr,
    unpaired_within_noise,
)


def bernoulli(values: list[float]) -> Samples:
    return Samples(np.asarray(values, dtype=float), np.ones(len(values)), False, "example")


def test_stderr_of_a_bernoulli_sample_is_lm_evals():
    # 30 hits in 100: sample variance p(1-p) n/(n-1), so stderr = sqrt(0.21/99)
    hits = [1.0] * 30 + [0.0] * 70
    assert stderr(hits) == pytest.approx(math.sqrt(0.3 * 0.7 / 99))
    assert mean_with_stderr("acc", hits) == {"acc": pytest.approx(0.3), "acc_stderr": pytest.approx(math.sqrt(0.21 / 99))}
    assert mean_with_stderr("acc", [1.0]) == {"acc": 1.0}  # one example: no stderr rather than NaN


def test_bootstrap_interval_covers_the_true_mean_about_95_percent_of_the_time():
    rng = np.random.default_rng(1)
    covered = 0
    trials = 200
    for i in range(trials):
        draw = (rng.random(200) < 0.6).astype(float)
        low, high = bootstrap_interval(bernoulli(list(draw)), resamples=400, seed=i)
        covered += low <= 0.6 <= high
    assert 0.88 <= covered / trials <= 0.99


def test_perplexity_is_resampled_by_window_and_token_weighted():
    payload = json.loads(per_example_json("window", {"nll": [1.0, 3.0]}, [3, 1]))
    s = samples(payload, "ppl")
    assert s is not None and s.unit == "window"
    assert s.value() == pytest.approx(math.exp((3 * 1.0 + 1 * 3.0) / 4))
    low, high = bootstrap_interval(s)
    assert math.exp(1.0) - 1e-9 <= low <= s.value() <= high <= math.exp(3.0) + 1e-9
    assert samples(payload, "acc") is None


def test_paired_difference_sees_a_consistent_small_gain_that_unpaired_misses():
    rng = np.random.default_rng(0)
    base = (rng.random(400) < 0.5).astype(float)
    better = base.copy()
    flip = np.flatnonzero(base == 0)[:12]  # 12 of 400 examples fixed, none broken: +3 points
    better[flip] = 1.0
    d = paired_difference(bernoulli(list(better)), bernoulli(list(base)))
    assert d is not None and d.diff == pytest.approx(0.03) and d.n == 400
    assert d.low > 0 and not d.within_noise
    # the same two numbers compared as if independent are within noise
    assert unpaired_within_noise(better.mean(), stderr(better), base.mean(), stderr(base))


def test_paired_difference_of_identical_scores_is_within_noise_and_needs_the_same_units():
    a = bernoulli([1.0, 0.0, 1.0, 1.0])
    d = paired_difference(a, a)
    assert d is not None and d.diff == 0 and d.within_noise
    assert paired_difference(a, bernoulli([1.0, 0.0])) is None


def test_a_learner_tasks_per_row_scores_resample_its_own_metrics():
    """rmse is the root of the mean squared error (resampled as such); acc and log_loss are read under their own
    names, and rows a tabular or sequence trial stored before that (``correct``, ``nll``) still are."""
    rng = np.random.default_rng(0)
    sq = rng.random(200) ** 2
    rmse = samples(json.loads(per_example_json("row", {"sq_err": sq.tolist()})), "rmse")
    assert rmse is not None and rmse.value() == pytest.approx(math.sqrt(sq.mean()))
    low, high = bootstrap_interval(rmse)
    assert low < math.sqrt(sq.mean()) < high and high < math.sqrt(sq.max())
    hits = (rng.random(50) > 0.3).astype(float).tolist()
    legacy = json.loads(per_example_json("row", {"nll": [0.5] * 50, "correct": hits}))
    assert samples(legacy, "acc").value() == pytest.approx(np.mean(hits)) and samples(legacy, "log_loss").value() == 0.5
    assert samples(json.loads(per_example_json("window", {"nll": [0.5]})), "log_loss") is None  # a perplexity window is no row


def test_a_methods_per_example_scores_join_the_tasks_without_replacing_them(ctx):
    """BitTokens scores its problems while the task scores its windows: both reach the verdicts."""
    import json

    from paretolab.stats import ARTIFACT, per_example_json, samples

    ctx.add_artifact(ARTIFACT, per_example_json("window", {"nll": [2.0, 3.0]}, [10, 20]))
    ctx.add_artifact(ARTIFACT, per_example_json("problem", {"exact_acc": [1.0, 0.0, 1.0]}))
    ctx.add_artifact(ARTIFACT, per_example_json("problem", {"exact_acc_add": [1.0, 0.0, 0.0]}))
    payload = json.loads((ctx.workdir / ARTIFACT).read_text())
    assert list(samples(payload, "exact_acc").values) == [1.0, 0.0, 1.0] and samples(payload, "exact_acc").unit == "problem"
    assert list(samples(payload, "exact_acc_add").values) == [1.0, 0.0, 0.0]
    assert list(samples(payload, "nll").values) == [2.0, 3.0] and list(samples(payload, "nll").weights) == [10, 20]
    assert ctx.artifacts.count(ctx.workdir / ARTIFACT) == 1  # logged once
