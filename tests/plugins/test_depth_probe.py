"""depth_probe: per-layer cross-entropy of intermediate hidden states and the CE∞ + A·l^−α fit."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from paretolab import TrialContext
from paretolab.errors import ConfigError
from paretolab.models import TinyLlama
from paretolab.plugin_api.subject import Subject
from paretolab.plugins import depth_probe
from paretolab.plugins.depth_probe import (
    DepthProbe,
    DepthProbeOptions,
    bootstrap_alpha,
    fit_alpha_batch,
    fit_inverse_depth,
    layer_cross_entropy,
)
from paretolab.tasks import corpus_ids


@pytest.fixture(scope="module")
def tiny4() -> Subject:
    return TinyLlama(layers=4).load()


def test_measure_reports_finite_fit_and_writes_a_curve_per_layer(tiny4: Subject, ctx: TrialContext) -> None:
    metrics = DepthProbe().measure(tiny4, {"max_tokens": 512, "seq_len": 128}, ctx)
    assert set(metrics) == set(DepthProbe.metrics)
    assert all(math.isfinite(v) for v in metrics.values())
    assert metrics["depth_alpha_ci_low"] <= metrics["depth_alpha_ci_high"]
    assert metrics["depth_alpha_n_windows"] == 4 and metrics["depth_alpha_boot_failed"] == 0
    artifact = json.loads((ctx.workdir / "depth_probe.json").read_text())
    assert len(artifact["ce"]) == 4
    assert artifact["fit"]["alpha"] == pytest.approx(metrics["depth_alpha"])
    assert np.mean(artifact["window_ce"], axis=0) == pytest.approx(artifact["ce"])  # equal windows: CE(l) is their mean


@pytest.mark.parametrize("through_last_layer", [True, False])
def test_deepest_probe_is_the_models_own_loss(tiny4: Subject, through_last_layer: bool) -> None:
    ce = layer_cross_entropy(tiny4, DepthProbeOptions(max_tokens=256, seq_len=128, through_last_layer=through_last_layer))
    ids = corpus_ids(tiny4.tokenizer, "pydoc", 256).reshape(2, 128)
    with torch.no_grad():
        loss = float(tiny4.model(input_ids=ids, labels=ids).loss)
    assert len(ce) == 4
    assert ce[-1] == pytest.approx(loss, rel=1e-4)


def test_fit_recovers_a_known_power_law() -> None:
    ce = [2.5 + 3.0 * depth**-1.0 for depth in range(1, 31)]
    fit = fit_inverse_depth(ce)
    assert fit["alpha"] == pytest.approx(1.0, abs=0.05)
    assert fit["ce_inf"] == pytest.approx(2.5, abs=0.05)
    steeper = fit_inverse_depth([1.0 + 2.0 * depth**-2.0 for depth in range(1, 31)], fit_from_layer=2)
    assert steeper["alpha"] == pytest.approx(2.0, abs=0.1)
    assert fit["r2"] > 0.999


def test_fit_quality_is_low_for_a_curve_that_is_no_power_law() -> None:
    zigzag = [3.0 + (0.5 if depth % 2 else 0.0) + 0.01 * (30 - depth) for depth in range(1, 31)]
    fit = fit_inverse_depth(zigzag)
    assert fit["r2"] < 0.9


DEPTHS = np.arange(1, 25)


def window_table(noise: float, *, offset: float = 0.0, windows: int = 64, seed: int = 0) -> np.ndarray:
    """Per-window CE (windows × depths) around CE(l) = 2 + 3·l^−1 (α = 1, CE∞ = 2): independent noise per
    window and depth, plus ``offset`` × a per-window shift shared by all depths (a harder stretch of text)."""
    rng = np.random.default_rng(seed)
    return 2.0 + 3.0 * DEPTHS**-1.0 + noise * rng.standard_normal((windows, DEPTHS.size)) + offset * rng.standard_normal((windows, 1))


def test_alpha_interval_holds_the_true_alpha_and_narrows_with_less_noise() -> None:
    noisy, quiet = bootstrap_alpha(window_table(0.02)), bootstrap_alpha(window_table(0.005))
    for boot in (noisy, quiet):
        assert boot["low"] < 1.0 < boot["high"]
        assert boot["n_windows"] == 64 and boot["failed"] == 0
    # the floor is the CE∞ grid's step (about top / 400), so the width shrinks less than the noise
    assert quiet["high"] - quiet["low"] < 0.75 * (noisy["high"] - noisy["low"])


def test_alpha_interval_resamples_the_same_windows_at_every_depth() -> None:
    # a shift shared by all depths of a window moves CE∞, not α; drawn per depth it would bend the curve
    boot = bootstrap_alpha(window_table(0.002, offset=0.3))
    assert boot["low"] < 1.0 < boot["high"]
    assert boot["high"] - boot["low"] < 0.05


def test_alpha_interval_is_reproducible() -> None:
    table = window_table(0.02)
    assert bootstrap_alpha(table) == bootstrap_alpha(table.copy())


def test_failed_resamples_are_dropped_and_counted() -> None:
    table = window_table(0.005, windows=20)
    table[0, 4] = math.nan  # every resample that draws window 0 fails: 1 − 0.95^20 of them
    boot = bootstrap_alpha(table)
    assert boot["failed"] == pytest.approx(1 - 0.95**20, abs=0.04)
    assert boot["low"] < 1.0 < boot["high"]
    assert bootstrap_alpha(table, fit_from_layer=6)["failed"] == 0  # the bad depth is left out of that fit


def test_batch_fit_matches_the_point_fit() -> None:
    curves = [window_table(0.02, windows=1, seed=seed)[0] for seed in range(4)] + [1.0 + 2.0 * DEPTHS**-2.0]
    for fit_from_layer in (1, 2):
        expected = [fit_inverse_depth(c.tolist(), fit_from_layer=fit_from_layer)["alpha"] for c in curves]
        assert fit_alpha_batch(np.stack(curves), fit_from_layer=fit_from_layer) == pytest.approx(expected, abs=1e-9)


def test_options_are_checked(tiny4: Subject, ctx: TrialContext) -> None:
    with pytest.raises(ConfigError, match="seq_len"):
        DepthProbe().measure(tiny4, {"max_tokens": 64, "seq_len": 128}, ctx)
    with pytest.raises(ConfigError, match="unknown option"):
        DepthProbe().measure(tiny4, {"tokens": 64}, ctx)
    with pytest.raises(ConfigError, match="at least 3 layers"):
        fit_inverse_depth([3.0, 2.0, 1.5], fit_from_layer=2)


def test_registers_the_measure_and_its_metrics() -> None:
    measures, metrics = [], []
    depth_probe.register_measures(measures.append)
    depth_probe.register_metrics(metrics.append)
    assert measures[0].name == "depth_probe" and not measures[0].default
    assert set(measures[0].metrics) == {m.name for m in metrics} == {
        "depth_alpha", "depth_ce_inf", "depth_fit_r2",
        "depth_alpha_ci_low", "depth_alpha_ci_high", "depth_alpha_n_windows", "depth_alpha_boot_failed",
    }
    direction = {m.name: m.direction for m in metrics}
    assert direction["depth_alpha_ci_low"] == direction["depth_alpha_ci_high"] == direction["depth_alpha"]
