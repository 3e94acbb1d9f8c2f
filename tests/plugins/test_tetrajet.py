"""tetrajet: the NVFP4 quantiser is exact on hand examples, SR is unbiased, the Hadamard backward is the plain one, OsciReset fires."""

from __future__ import annotations

import math
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from paretolab import TrialContext
from paretolab.errors import ConfigError
from paretolab.plugin_api.manager import registries
from paretolab.plugin_api.subject import Subject
from paretolab.plugins._nvfp4 import (
    E2M1_GRID,
    mxfp8,
    nvfp4,
    random_hadamard,
    rotate16,
    round_e2m1,
    to_e4m3,
)
from paretolab.plugins.tetrajet import (
    NVFP4Linear,
    Recipe,
    TetraJet,
    TetraJetHook,
    _NVFP4Linear,
    osci_reset,
    osci_snapshot,
    osci_track,
)
from paretolab.testing import MethodContract
from paretolab.training.hooks import training_of
from tests.training.conftest import make_ctx, train_text  # noqa: F401  (the train stage's corpus fixture)


def test_e2m1_rounds_to_nearest_grid_value_ties_to_even() -> None:
    v = torch.tensor([0.0, 0.2, 0.25, 0.3, 0.75, 1.25, 1.3, 1.75, 2.5, 2.6, 3.5, 4.9, 5.0, 5.1, 7.0, 100.0, -0.8, -2.9])
    want = torch.tensor([0.0, 0.0, 0.0, 0.5, 1.0, 1.0, 1.5, 2.0, 2.0, 3.0, 4.0, 4.0, 4.0, 6.0, 6.0, 6.0, -1.0, -3.0])
    assert torch.equal(round_e2m1(v), want)
    grid = torch.tensor(E2M1_GRID)
    assert torch.equal(round_e2m1(grid), grid) and torch.equal(round_e2m1(-grid), -grid)  # grid values are fixed points


def test_block_scales_round_to_e4m3() -> None:
    assert to_e4m3(torch.tensor([17.0, 0.3, 1 / 1024, 3 / 1024, 1000.0])).tolist() == [16.0, 0.3125, 0.0, 0.00390625, 448.0]
    # one block of 16, per-tensor scale: s0 = 6/(448·6) = 1/448; s1 = E4M3(6/(s0·6)) = 448 -> the block's step is exactly 1·(s0·s1) = 1
    x = torch.tensor([6.0, 5.2, -2.4, 1.25, 0.7, 0.2, 0.0, 3.4] + [0.0] * 8)
    want = torch.tensor([6.0, 6.0, -2.0, 1.0, 0.5, 0.0, 0.0, 3.0] + [0.0] * 8)
    assert torch.allclose(nvfp4(x, outer=0), want, rtol=1e-6, atol=0)
    # a block whose scale is not an E4M3 number: amax 2.9 in a tensor of amax 6 -> s1 = E4M3(2.9·448/6 = 216.53) = 224
    y = torch.tensor([6.0] + [0.0] * 15 + [2.9, 1.0] + [0.0] * 14)
    step = 224.0 / 448.0  # s0·s1
    out = nvfp4(y, outer=0)
    assert out[16].item() == pytest.approx(round_e2m1(torch.tensor(2.9 / step)).item() * step)  # 5.8 -> 6 -> 3.0
    assert out[16].item() == pytest.approx(3.0) and out[17].item() == pytest.approx(1.0)


def test_outer_scale_is_per_128_or_per_tensor() -> None:
    x = torch.cat([torch.full((128,), 1e-5), torch.full((128,), 100.0)])
    x[0], x[128] = 2e-5, 150.0
    per_block, per_tensor = nvfp4(x, outer=128), nvfp4(x, outer=0)
    assert (per_block[:128] - x[:128]).abs().max() < 0.1 * 2e-5  # its own fp32 scale keeps the small block
    assert per_tensor[:128].abs().max() == 0.0  # under the 150-wide tensor scale the small block's E4M3 scale underflows
    assert torch.equal(per_block[128:], per_tensor[128:])


def test_widths_that_are_not_a_multiple_of_the_block_are_padded() -> None:
    x = torch.randn(3, 45, generator=torch.Generator().manual_seed(0))
    q = nvfp4(x, outer=128)
    assert q.shape == x.shape and torch.equal(q, nvfp4(torch.nn.functional.pad(x, (0, 83)), outer=128)[:, :45])  # zeros change no scale
    assert mxfp8(x).shape == x.shape and (mxfp8(x) - x).abs().max() < 0.125 * x.abs().max()  # E4M3 steps, saturation at 448


def test_stochastic_rounding_is_unbiased() -> None:
    x = torch.linspace(-5.5, 5.5, 64).repeat(4000, 1)  # each row one block set; values between grid points
    x[:, 0] = 6.0  # pin every block's amax so the scales are exact
    for b in range(1, 4):
        x[:, 16 * b] = 6.0
    q = nvfp4(x, outer=0, stochastic=True, generator=torch.Generator().manual_seed(0))
    values = set(q.unique().tolist())
    assert values <= {s * g for g in E2M1_GRID for s in (1, -1)}
    mean, stderr = q.mean(0), q.std(0) / math.sqrt(q.shape[0])
    assert ((mean - x[0]).abs() / stderr.clamp_min(1e-9)).max() < 5.0
    assert (nvfp4(x[:1], outer=0) - x[0]).abs().max() > 0.2  # while round-to-nearest is off by up to a half step


def test_hadamard_backward_without_quantisation_is_the_plain_backward() -> None:
    rotation = random_hadamard(torch.Generator().manual_seed(1), "cpu")
    assert torch.allclose(rotation @ rotation.T, torch.eye(16), atol=1e-6)
    a, b = torch.randn(5, 40), torch.randn(7, 40)
    assert torch.allclose(rotate16(a, rotation) @ rotate16(b, rotation).T, a @ b.T, atol=1e-5)
    x = torch.randn(4, 24, 32, requires_grad=True)
    linear = torch.nn.Linear(32, 48)
    g = torch.randn(4, 24, 48)
    linear(x).backward(g)
    plain = [t.grad.clone() for t in (x, linear.weight, linear.bias)]
    for t in (x, linear.weight, linear.bias):
        t.grad = None
    _NVFP4Linear.apply(x, linear.weight, linear.bias, Recipe(quantize=False, hadamard=True, stochastic=True), 5, None, None).backward(g)
    for want, got in zip(plain, (x.grad, linear.weight.grad, linear.bias.grad), strict=True):
        assert torch.allclose(got, want, rtol=1e-5, atol=1e-4)


def test_the_quantised_linear_is_close_and_naive_is_deterministic() -> None:
    torch.manual_seed(0)
    linear = torch.nn.Linear(64, 32)
    x = torch.randn(128, 64)
    exact = linear(x)
    for recipe in (Recipe(), Recipe(hadamard=False, stochastic=False)):
        layer = NVFP4Linear(linear, recipe=recipe, seed=0).train()
        out = layer(x)
        rel = (out - exact).norm() / exact.norm()
        assert 0.02 < rel < 0.2  # 4-bit: visibly off, still the same function
    grads = []
    for _ in range(2):
        linear.weight.grad = None
        NVFP4Linear(linear, recipe=Recipe(hadamard=False, stochastic=False), seed=0).train()(x).sum().backward()
        grads.append(linear.weight.grad.clone())
    assert torch.equal(grads[0], grads[1])


def test_osci_reset_snaps_an_oscillating_weight_to_its_grid_point() -> None:
    linear = torch.nn.Linear(16, 2, bias=False)
    with torch.no_grad():
        linear.weight.copy_(torch.tensor([[6.0] + [1.25] + [0.0] * 14, [6.0] + [2.0] + [0.0] * 14]))
    layer = NVFP4Linear(linear, recipe=Recipe(), seed=0)  # a scale of exactly 1 per element (amax 6)
    osci_snapshot(layer)
    for step in range(10):
        with torch.no_grad():  # w[0,1] wobbles across the 1.0/1.5 grid edge (1.25); w[1,1] drifts by the same tiny amount inside a bin
            layer.weight[0, 1] = 1.25 + (0.01 if step % 2 == 0 else -0.01)
            layer.weight[1, 1] = 2.0 + 0.002 * step
        osci_track(layer)
    ratio = layer.osci["dist_q"] / layer.osci["dist_w"].clamp_min(1e-30)
    assert ratio[0, 1] > 8 and ratio[1, 1] == 0
    assert osci_reset(layer, threshold=8.0) == 1
    assert layer.weight[0, 1].item() == pytest.approx(1.0)  # reset to Q(w): 1.24 rounds to 1.0
    assert layer.weight[1, 1].item() == pytest.approx(2.018) and layer.osci == {}


def test_out_control_keeps_the_largest_channels_in_mxfp8() -> None:
    linear = torch.nn.Linear(20, 4)
    layer = NVFP4Linear(linear, recipe=Recipe(), seed=0).train()
    layer.channel_norms = torch.zeros(20)
    x = torch.randn(64, 20)
    x[:, [3, 11]] *= 50.0
    layer(x)
    layer.choose_outliers(0.1)
    assert layer.fp8_idx.tolist() == [3, 11] and layer.fp4_idx.numel() == 18
    out = layer(x)
    out.sum().backward()
    assert torch.isfinite(linear.weight.grad).all()
    outlier_only = torch.zeros_like(x)
    outlier_only[:, [3, 11]] = x[:, [3, 11]]
    with torch.no_grad():
        want = mxfp8(outlier_only[:, [3, 11]]) @ mxfp8(linear.weight[:, [3, 11]]).T + linear.bias
    assert torch.allclose(layer(outlier_only), want, atol=1e-5)


def test_trains_on_scratch_1m_with_out_control_and_osci_reset(tmp_path: Path, train_text: str, ctx: TrialContext) -> None:
    source = registries().models.get("scratch-1m")
    stage = {"tokens": 768, "seq_len": 32, "batch": 4, "eval_every": 3, "eval_tokens": 128, "corpus": train_text}  # 6 steps
    params = {"osci_period": 3, "osci_window": 1, "osci_start": 0.0, "outlier_steps": 1}  # OutControl from step 1, a reset at step 5
    subject = TetraJet().transform(source.load(), params, ctx)
    subject = registries().methods.get("train").transform(subject, stage, make_ctx(tmp_path, "s1"))
    assert math.isfinite(subject.training.metrics["val_loss"]) and subject.training.metrics["train_steps"] == 6
    modules = [m for m in subject.model.modules() if isinstance(m, NVFP4Linear)]
    assert len(modules) == 3 * 7 and subject.model.lm_head.weight is subject.model.model.embed_tokens.weight  # the tied head stays fp32
    assert all(m.fp8_idx is not None and m.fp8_idx.numel() == round(0.1 * m.in_features) for m in modules)
    assert "osci_resets" in subject.info


def test_transform_attaches_the_hook_and_refuses_bad_params(ctx: TrialContext) -> None:
    from paretolab.models import TinyLlama

    subject = TetraJet().transform(TinyLlama(layers=2, hidden=64).load(), {"recipe": "naive"}, ctx)
    (hook,) = training_of(subject).of_type(TetraJetHook)
    assert not hook.recipe.hadamard and not hook.recipe.stochastic and not hook.osci and not hook.outliers
    assert TetraJet.cost_is == "simulated"
    for bad, match in (({"recipe": "fp8"}, "tetrajet.recipe"), ({"outer": 100}, "tetrajet.outer"), ({"osci_window": 30}, "tetrajet.osci_window"),
                       ({"outlier_ratio": 1.0}, "tetrajet.outlier_ratio")):
        with pytest.raises(ConfigError, match=match):
            TetraJet().transform(TinyLlama(layers=2, hidden=64).load(), bad, ctx)


def test_hook_wraps_once() -> None:
    from paretolab.models import TinyLlama

    model = TinyLlama(layers=2, hidden=64).load().model
    hook = TetraJet().transform(TinyLlama(layers=2, hidden=64).load(), {}, TrialContext(seed=0, workdir=Path("."))).training.hooks[0]
    state = SimpleNamespace(params=SimpleNamespace(seed=0))
    hook.convert_model(model, state)
    first = [m for m in model.modules() if isinstance(m, NVFP4Linear)]
    hook.convert_model(model, state)  # a second train stage: nothing wrapped twice
    assert [m for m in model.modules() if isinstance(m, NVFP4Linear)] == first


class TestTetraJetContract(MethodContract):
    @pytest.fixture
    def method(self) -> TetraJet:
        return TetraJet()
