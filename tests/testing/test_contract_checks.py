"""The contract suite catches the mistakes a plugin author makes (each bad method below fails one check)."""

from __future__ import annotations

import optuna
import pytest
import torch

from paretolab import Method
from paretolab.testing import MethodContract
from tests.fixtures.testplugin.paretolab_testplugin import Noise


class GlobalRngNoise(Noise):
    """Noise drawn from torch's global RNG instead of ctx.generator()."""

    def transform(self, subject, params, ctx):
        with torch.no_grad():
            for p in subject.model.parameters():
                if p.dim() == 2:
                    p.add_(torch.randn(p.shape) * params["std"])
        return subject


class HiddenCopy(Method):
    """Claims a real format but keeps a full copy of a weight as a plain buffer, unreported."""

    name = "hidden_copy"
    cost_is = "real"

    def transform(self, subject, params, ctx):
        layer = subject.model.model.layers[0].mlp.up_proj
        layer.register_buffer("packed", layer.weight.detach().clone())
        return subject


class TypoDefault(Noise):
    """A default for 'sdt' where the space has 'std'."""

    def defaults(self):
        return {"sdt": 0.01}


class DoesNothing(Method):
    name = "does_nothing"

    def search_space(self):
        return {"strength": optuna.distributions.FloatDistribution(0.0, 1.0)}

    def transform(self, subject, params, ctx):
        return subject


@pytest.fixture
def contract():
    return MethodContract()


@pytest.fixture
def small():
    from paretolab.models import TinyLlama

    return TinyLlama(layers=2, hidden=64).load()


@pytest.fixture
def trial_ctx(tmp_path):
    from paretolab.plugin_api.context import TrialContext

    return TrialContext(seed=0, workdir=tmp_path / "trial")


def test_global_rng_is_caught(contract, small, tmp_path):
    with pytest.raises(AssertionError, match="global RNG"):
        contract.test_ignores_the_global_rng(GlobalRngNoise(), small, {"std": 0.01}, tmp_path)
    contract.test_ignores_the_global_rng(Noise(), small, {"std": 0.01}, tmp_path)


def test_unreported_storage_is_caught(contract, small, trial_ctx):
    with pytest.raises(AssertionError, match="more than size_bytes reports"):
        contract.test_reports_what_it_stores(HiddenCopy(), small, {}, trial_ctx)


def test_misspelt_default_is_caught(contract):
    with pytest.raises(AssertionError, match="did you mean 'std'"):
        contract.test_defaults_belong_to_the_space(TypoDefault())
    contract.test_defaults_belong_to_the_space(Noise())


def test_a_method_that_changes_nothing_is_caught(contract, small, trial_ctx):
    with pytest.raises(AssertionError, match="changed neither"):
        contract.test_changes_the_subject(DoesNothing(), small, {"strength": 0.5}, trial_ctx)
    contract.test_changes_the_subject(Noise(), small, {"std": 0.01}, trial_ctx)
