"""paretolab interaction: the log-scale interaction term of two stacked methods, paired over the windows."""

from __future__ import annotations

import math

import numpy as np
import pytest

from paretolab.api.interaction import arms_of, log_term, paired_term
from paretolab.errors import ConfigError
from paretolab.stats import Samples


def nll_samples(values, weights=None):
    v = np.asarray(values, dtype=float)
    return Samples(v, np.asarray(weights or [1.0] * len(v), dtype=float), True, "window")


def test_effects_that_multiply_have_no_interaction():
    ea, eb, eab, term = log_term(10.0, 12.0, 15.0, 18.0)  # 12/10 * 15/10 = 18/10
    assert (ea, eb, eab) == pytest.approx((math.log(1.2), math.log(1.5), math.log(1.8)))
    assert term == pytest.approx(0.0, abs=1e-12)
    assert log_term(10.0, 12.0, 15.0, 27.0)[3] == pytest.approx(math.log(27 / 18))  # stacking costs 1.5x more than predicted
    with pytest.raises(ConfigError, match="positive values"):
        log_term(0.0, 1.0, 1.0, 1.0)


def test_per_window_additive_losses_give_a_zero_interval_and_a_real_interaction_one_that_excludes_zero():
    rng = np.random.default_rng(0)
    base = rng.normal(3.0, 0.5, 16)
    a, b = base + rng.normal(0.1, 0.05, 16), base + rng.normal(0.2, 0.05, 16)
    additive = a + b - base  # log ppl is the mean NLL: window by window additive means a zero term on every resample
    low, high, n = paired_term(*(nll_samples(x) for x in (base, a, b, additive)))
    assert n == 16 and low == pytest.approx(0.0, abs=1e-12) and high == pytest.approx(0.0, abs=1e-12)
    worse = additive + 0.3 + rng.normal(0, 0.02, 16)
    low, high, _ = paired_term(*(nll_samples(x) for x in (base, a, b, worse)))
    assert 0.25 < low < 0.3 < high < 0.35
    assert paired_term(nll_samples(base), nll_samples(a), nll_samples(b), nll_samples(worse[:8])) is None  # other windows


def test_the_four_arms_are_found_by_label_and_a_missing_one_is_named():
    rows = [{"method": "none", "trial": 0}, {"method": "wanda", "trial": 1}, {"method": "rtn", "trial": 2}, {"method": "wanda+rtn", "trial": 3}]
    assert {k: v["trial"] for k, v in arms_of(rows, "rtn", "wanda", "s").items()} == {"base": 0, "A": 2, "B": 1, "A+B": 3}
    with pytest.raises(ConfigError, match=r"no complete trial of A \(magnitude\); it has none, rtn, wanda, wanda\+rtn"):
        arms_of(rows, "magnitude", "rtn", "s")
    with pytest.raises(ConfigError, match=r"no complete trial of A\+B \(rtn\+wanda or wanda\+rtn\)"):
        arms_of(rows[:3], "rtn", "wanda", "s")
