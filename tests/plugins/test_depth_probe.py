"""depth_probe: per-layer cross-entropy of intermediate hidden states and the CE∞ + A·l^−α fit."""

from __future__ import annotations

import json
import math

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
    fit_inverse_depth,
    layer_cross_entropy,
)
from paretolab.tasks import corpus_ids


@pytest.fixture(scope="module")
def tiny4() -> Subject:
    return TinyLlama(layers=4).load()


def test_measure_reports_finite_fit_and_writes_a_curve_per_layer(tiny4: Subject, ctx: TrialContext) -> None:
    metrics = DepthProbe().measure(tiny4, {"max_tokens": 256, "seq_len": 128}, ctx)
    assert set(metrics) == {"depth_alpha", "depth_ce_inf", "depth_fit_r2"}
    assert all(math.isfinite(v) for v in metrics.values())
    artifact = json.loads((ctx.workdir / "depth_probe.json").read_text())
    assert len(artifact["ce"]) == 4
    assert artifact["fit"]["alpha"] == pytest.approx(metrics["depth_alpha"])


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
    assert set(measures[0].metrics) == {m.name for m in metrics} == {"depth_alpha", "depth_ce_inf", "depth_fit_r2"}
