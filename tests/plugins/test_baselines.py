"""The baselines pass the contract and do what their names say."""

from __future__ import annotations

import pytest
import torch

from paretolab.plugin_api.context import TrialContext
from paretolab.plugin_api.method import NoMethod
from paretolab.plugins.baselines import RTN, Magnitude, linear_weights, quantize_rtn
from paretolab.testing import MethodContract


class TestMagnitudeContract(MethodContract):
    @pytest.fixture
    def method(self):
        return Magnitude()


class TestRTNContract(MethodContract):
    @pytest.fixture
    def method(self):
        return RTN()


class TestNoneContract(MethodContract):
    @pytest.fixture
    def method(self):
        return NoMethod()


@pytest.mark.parametrize("scope", ["row", "matrix"])
def test_magnitude_prunes_the_smallest_weights(tiny, tmp_path, scope):
    original = {n: m.weight.detach().clone() for n, m in linear_weights(tiny.model)}
    out = Magnitude().transform(tiny.copy(), {"sparsity": 0.5, "scope": scope}, TrialContext(0, tmp_path))
    for name, layer in linear_weights(out.model):
        w, before = layer.weight, original[name]
        zero = w == 0
        if scope == "row":
            assert (zero.sum(1) == w.shape[1] // 2).all()
        else:
            assert zero.sum() == w.numel() // 2
        rows = range(w.shape[0]) if scope == "row" else [slice(None)]
        for r in rows:
            assert before[r][zero[r]].abs().max() <= before[r][~zero[r]].abs().min()


def test_rtn_uses_at_most_two_to_the_bits_levels_per_group():
    w = torch.randn(8, 64)
    q = quantize_rtn(w, bits=3, group_size=32)
    for group in q.reshape(8, 2, 32).reshape(-1, 32):
        assert group.unique().numel() <= 8
    assert (q - w).abs().max() < w.abs().max() / 3  # error within half a step of the absmax scale
    assert torch.equal(quantize_rtn(w, 16, 64), quantize_rtn(w, 16, 64))


def test_rtn_groups_that_do_not_divide_the_row_end_short(tiny, tmp_path):
    w = torch.randn(4, 80)
    q = quantize_rtn(w, bits=4, group_size=32)  # groups 32, 32, 16
    assert torch.equal(q[:, 64:], quantize_rtn(w[:, 64:], bits=4, group_size=16))
    out = RTN().transform(tiny.copy(), {"bits": 4, "group_size": 48}, TrialContext(0, tmp_path))
    name, layer = next(iter(linear_weights(out.model)))
    assert out.storage_of(f"{name}.weight").group_size == 48


def test_rtn_refuses_a_zero_group(tiny, tmp_path):
    from paretolab.errors import ConfigError

    with pytest.raises(ConfigError, match="rtn.group_size must be a positive"):
        RTN().transform(tiny.copy(), {"bits": 4, "group_size": 0}, TrialContext(0, tmp_path))
