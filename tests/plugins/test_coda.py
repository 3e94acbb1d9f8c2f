"""CoDA and the LTC baseline: the networks solve the ODEs they say they solve, the data are seeded, the methods keep the contract."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from torch.nn import functional as F

from paretolab.errors import ConfigError
from paretolab.plugins.coda import CoDAMethod, LTCMethod
from paretolab.plugins.coda.cells import LTC, CoDA
from paretolab.plugins.coda.learners import NetLearner
from paretolab.tasks.sequence import SequenceOptions, generate, load_sequences
from paretolab.testing import LearnerMethodContract


def _rk4_path(f, v: torch.Tensor, span: float, steps: int) -> torch.Tensor:
    h = span / steps
    for _ in range(steps):
        k1 = f(v)
        k2 = f(v + h / 2 * k1)
        k3 = f(v + h / 2 * k2)
        k4 = f(v + h * k3)
        v = v + h / 6 * (k1 + 2 * k2 + 2 * k3 + k4)
    return v


def test_the_ltc_fused_step_converges_to_the_ltc_ode():
    """Many fused steps over one observation land where a fine RK4 solve of cm dv/dt = gleak (vleak - v) + sum w s (E - v) does."""
    g = torch.Generator().manual_seed(0)
    layer = LTC(2, 5, unfolds=2000, g=g, device=torch.device("cpu")).double()
    x = torch.randn(3, 1, 2, generator=g, dtype=torch.float64)
    xi = x[:, 0] * layer.in_scale + layer.in_shift
    act_in = F.softplus(layer.in_w) * torch.sigmoid(layer.in_sigma * (xi.unsqueeze(-1) - layer.in_mu))
    w, gleak, cm = F.softplus(layer.w), F.softplus(layer.gleak), F.softplus(layer.cm)

    def rhs(v: torch.Tensor) -> torch.Tensor:
        act = w * torch.sigmoid(layer.sigma * (v.unsqueeze(-1) - layer.mu))
        syn = (act * (layer.erev - v.unsqueeze(1))).sum(1) + (act_in * (layer.in_erev - v.unsqueeze(1))).sum(1)
        return (gleak * (layer.vleak - v) + syn) / cm

    with torch.no_grad():
        exact = _rk4_path(rhs, torch.zeros(3, 5, dtype=torch.float64), 1.0, 400)
        fused = layer(x)
    assert torch.allclose(fused, exact, atol=2e-3), (fused - exact).abs().max()
    assert exact.abs().max() > 0.05  # the state moved: the comparison is not of two zeros


def test_codas_linear_ode_is_solved_exactly_between_observations():
    """z_T from the closed form equals stepping dz/dt = A z + u(t) (u held over each step) with a fine RK4, and the recurrence."""
    g = torch.Generator().manual_seed(1)
    layer = CoDA(2, 6, 3, g=g, device=torch.device("cpu")).double()
    x = torch.randn(2, 7, 2, generator=g, dtype=torch.float64)
    with torch.no_grad():
        h, _ = layer.gru(x)
        u = layer.drive(h)
        z = torch.zeros(2, 3, dtype=torch.float64)
        for t in range(x.shape[1]):
            z = _rk4_path(lambda s, t=t: s @ layer.a.T + u[:, t], z, 1.0, 200)
        out = layer(x)
    assert torch.allclose(out[:, :3], z, atol=1e-8), (out[:, :3] - z).abs().max()
    assert torch.allclose(out[:, 3:], h[:, -1])
    assert z.abs().max() > 0.01


def test_the_generated_sets_are_seeded_and_say_what_they_hold():
    small = SequenceOptions(sequences=80, length=10)
    x1, y1, classes = generate(small)
    x2, y2, _ = generate(small)
    assert np.array_equal(x1, x2) and np.array_equal(y1, y2) and classes == 4
    assert x1.shape == (80, 10, 2) and set(np.unique(y1)) <= {0, 1, 2, 3}
    xd, yd, reg = generate(SequenceOptions(dataset="duffing", sequences=80, length=10, noise=0.0))
    assert reg == 0 and xd.shape == (80, 10, 2)
    assert not np.allclose(yd, xd[:, -1, 0])  # the target lies past the last input
    data = load_sequences(SequenceOptions(sequences=100, length=10))
    assert abs(float(data.x["train"].mean())) < 1e-4 and len(data.x["test"]) == 20
    with pytest.raises(ConfigError, match="task.dataset"):
        generate(SequenceOptions(dataset="nope", sequences=80))


def test_coda_learns_the_regimes_past_chance():
    data = load_sequences(SequenceOptions(sequences=800, length=48))
    fit = NetLearner(arch="coda", units=16, latent=4, epochs=30, timing_s=0.5).fit_predict(data, seed=0, device=torch.device("cpu"))
    acc = float((fit.test_pred.argmax(1) == data.y["test"]).mean())
    assert acc > 0.45, acc  # chance is 0.25
    assert fit.extra["train_step_ms"] > 0 and fit.extra["train_speedup"] > 0


def test_the_sequence_task_without_a_learner_says_which_stage_to_add():
    from paretolab.records import TrialSettings
    from paretolab.study.trial import run_trial
    from paretolab.tasks.sequence import SequenceSource

    result = run_trial(SequenceSource().load(), [], TrialSettings("t", "sequence", {"sequences": 60, "length": 4}, {}, seed=0), number=0)
    assert result.failed and "add a sequence stage (method ltc or coda)" in result.error


class TestLTCContract(LearnerMethodContract):
    @pytest.fixture
    def method(self) -> LTCMethod:
        return LTCMethod()

    @pytest.fixture
    def params(self) -> dict[str, Any]:
        return {"units": 4, "unfolds": 2, "epochs": 1, "timing_s": 0.2}


class TestCoDAContract(LearnerMethodContract):
    @pytest.fixture
    def method(self) -> CoDAMethod:
        return CoDAMethod()

    @pytest.fixture
    def params(self) -> dict[str, Any]:
        return {"units": 4, "latent": 2, "epochs": 1, "timing_s": 0.2}


@pytest.mark.parametrize("dataset, names", [("regimes", ("acc", "log_loss")), ("duffing", ("rmse",))])
def test_the_scores_stored_per_sequence_give_back_the_reported_metrics(dataset: str, names: tuple[str, ...]):
    """A claim's interval resamples the stored per-sequence scores: each must rebuild the metric the trial reported."""
    import json

    from paretolab.stats import samples
    from paretolab.tasks.tabular import Fit, score_fit

    class Ctx:
        stored: dict[str, str] = {}

        def add_artifact(self, name: str, text: str) -> None:
            self.stored[name] = text

    data = load_sequences(SequenceOptions(dataset=dataset, sequences=100, length=8))
    rng = np.random.default_rng(0)
    n = len(data.y["test"])
    pred = rng.standard_normal(n) if data.regression else rng.dirichlet(np.ones(data.n_classes), size=n)
    ctx = Ctx()
    metrics = score_fit(data, Fit(pred, None, 1, 1), ctx)
    payload = json.loads(next(iter(ctx.stored.values())))
    for name in names:
        assert samples(payload, name).value() == pytest.approx(metrics[name]), name
