"""psumquant: b-bit partial sums per 128-wide K tile, scale from the input crest factor vs a fixed one."""

from __future__ import annotations

import json

import pytest
import torch

from paretolab import TrialContext
from paretolab.errors import ConfigError
from paretolab.plugin_api.method import validate_method
from paretolab.plugin_api.subject import Subject
from paretolab.plugins import psumquant
from paretolab.plugins.psumquant import (
    PsumLinear,
    PsumQuant,
    fit_psum_linear,
    tile_features,
    tile_psums,
)

SMALL = {"calib_samples": 4, "calib_seq_len": 64, "fit_tokens": 128, "sqnr_tokens": 64}


def varying_crest_inputs(n: int, k: int, gen: torch.Generator) -> torch.Tensor:
    """Tokens with log-normal magnitudes, some tiles flat (crest ~3) and some with a few spikes (crest ~10)."""
    x = torch.randn(n, k, generator=gen) * torch.exp(torch.randn(n, 1, generator=gen))
    spikes = torch.rand(n, k, generator=gen) < 0.01
    return x + spikes * torch.randn(n, k, generator=gen) * 40


def rel_error(layer: torch.nn.Module, reference: torch.nn.Linear, x: torch.Tensor) -> float:
    with torch.no_grad():
        y = reference(x)
        return float((layer(x) - y).pow(2).mean() / y.pow(2).mean())


def test_tile_psums_add_up_to_the_matmul_with_a_short_last_tile() -> None:
    gen = torch.Generator().manual_seed(0)
    x, w = torch.randn(5, 320, generator=gen), torch.randn(7, 320, generator=gen)
    psums = tile_psums(x, w, 128)
    assert psums.shape == (5, 3, 7)
    assert torch.allclose(psums.sum(1), x @ w.T, atol=1e-4)
    log_max, log_rms = tile_features(x, 128)
    assert log_max.shape == (5, 3)
    assert torch.allclose(log_rms[:, 2].exp(), x[:, 256:].pow(2).mean(-1).sqrt())


@pytest.mark.parametrize("mode", ["crest", "tile", "fixed"])
def test_16_bit_psums_are_almost_exact(tiny: Subject, ctx: TrialContext, mode: str) -> None:
    prompt = torch.randint(0, 250, (2, 24), generator=torch.Generator().manual_seed(3))
    method = PsumQuant()
    subject = method.transform(tiny.copy(), {"psum_bits": 16, "scale": mode, **SMALL}, ctx)
    assert isinstance(subject.model.model.layers[1].self_attn.o_proj, PsumLinear)
    with torch.no_grad():
        reference = tiny.model(input_ids=prompt).logits
        logits = subject.model(input_ids=prompt).logits
    assert float((logits - reference).norm() / reference.norm()) < 1e-2
    assert method.evaluate(subject, ctx)["psum_sqnr_db"] > 60


def test_crest_predictor_beats_a_fixed_scale_at_low_bits() -> None:
    gen = torch.Generator().manual_seed(0)
    linear = torch.nn.Linear(256, 64, bias=False)
    fit_x, test_x = varying_crest_inputs(2000, 256, gen), varying_crest_inputs(500, 256, gen)
    for bits in (4, 6, 8):
        crest = fit_psum_linear(linear, fit_x, bits=bits, tile=128, mode="crest")
        fixed = fit_psum_linear(linear, fit_x, bits=bits, tile=128, mode="fixed")
        assert rel_error(crest, linear, test_x) <= rel_error(fixed, linear, test_x)


def test_tile_scale_is_static_per_tile_and_tracks_each_tiles_range() -> None:
    gen = torch.Generator().manual_seed(2)
    linear = torch.nn.Linear(384, 16, bias=False)
    x = torch.randn(400, 384, generator=gen) * torch.tensor([1.0, 10.0, 0.1]).repeat_interleave(128)  # tiles of very different size
    tile = fit_psum_linear(linear, x, bits=6, tile=128, mode="tile")
    ranges = tile.log_ranges(x[:5])
    assert ranges.shape == (1, 3)  # one range per tile position, the same for every token
    assert ranges[0, 1] > ranges[0, 0] > ranges[0, 2]
    fixed = fit_psum_linear(linear, x, bits=6, tile=128, mode="fixed")
    assert rel_error(tile, linear, x) < rel_error(fixed, linear, x)


def test_more_psum_bits_means_less_error() -> None:
    gen = torch.Generator().manual_seed(1)
    linear = torch.nn.Linear(256, 32, bias=True)
    x = varying_crest_inputs(1000, 256, gen)
    errors = [rel_error(fit_psum_linear(linear, x, bits=b, tile=128, mode="crest"), linear, x) for b in (4, 8, 12)]
    assert errors[0] > errors[1] > errors[2]


def test_writes_per_layer_sqnr_artifact(tiny: Subject, ctx: TrialContext) -> None:
    PsumQuant().transform(tiny.copy(), {"psum_bits": 8, **SMALL}, ctx)
    report = json.loads((ctx.workdir / "psum_sqnr.json").read_text())
    assert report["scale"] == "crest" and len(report["psum_sqnr_db"]) == 14


@pytest.mark.parametrize("bad", [{"scale": "dynamic"}, {"psum_bits": 1}, {"tile": 0}])
def test_bad_params_raise_config_errors(tiny: Subject, ctx: TrialContext, bad: dict[str, object]) -> None:
    with pytest.raises(ConfigError, match="psumquant"):
        PsumQuant().transform(tiny.copy(), {**SMALL, **bad}, ctx)


def test_registers_a_simulated_method_and_its_metric() -> None:
    methods, metrics = [], []
    psumquant.register_methods(methods.append)
    psumquant.register_metrics(metrics.append)
    validate_method(methods[0], "test")
    assert methods[0].cost_is == "simulated" and [m.name for m in metrics] == ["psum_sqnr_db"]
