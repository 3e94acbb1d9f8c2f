"""tabpack: per-member early stopping, members kept apart in one pack, greedy ensembles, the tabular task; contract for every learner."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from paretolab.errors import ConfigError
from paretolab.plugins.tabpack import HGB, TabM, TabPack, TunedMLP
from paretolab.plugins.tabpack.ensemble import ensemble_loss, greedy_ensemble
from paretolab.plugins.tabpack.pack import MemberConfig, PackedMLP, member_seeds, train_pack
from paretolab.tasks.tabular import TabularOptions, load_tabular
from paretolab.testing import LearnerMethodContract

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def small() -> Any:
    return load_tabular(TabularOptions(dataset="synth-class", rows=600))


def test_a_member_that_stops_improving_stops_updating_while_others_go_on(small: Any) -> None:
    frozen = MemberConfig(width=32, depth=1, dropout=0.0, lr=0.0, weight_decay=0.0)  # val loss never improves after epoch 0
    learner = MemberConfig(width=64, depth=2, dropout=0.0, lr=3e-3, weight_decay=1e-5)
    run = train_pack([frozen, learner], small, seed=0, device=CPU, epochs=8, patience=2, batch=64)
    steps_per_epoch = -(-len(small.y["train"]) // 64)
    assert run.stopped_at[0] == 2  # best at epoch 0, no better at epochs 1 and 2: out of the pack
    assert run.updates[0] == 3 * steps_per_epoch
    assert run.updates[1] > run.updates[0] and run.stopped_at[1] != 2
    assert run.best_val_loss[1] < run.best_val_loss[0]


def test_members_do_not_affect_each_other(small: Any) -> None:
    a = MemberConfig(width=32, depth=2, dropout=0.0, lr=1e-3, weight_decay=1e-5)
    runs = [train_pack([a, MemberConfig(64, 1, 0.0, lr, 1e-4)], small, seed=3, device=CPU, epochs=3, patience=5, batch=64) for lr in (1e-3, 3e-4)]
    assert runs[0].best_val_loss[0] == pytest.approx(runs[1].best_val_loss[0], rel=1e-6)
    assert runs[0].best_val_loss[1] != runs[1].best_val_loss[1]


MIXED = [MemberConfig(32, 2, 0.1, 1e-3, 1e-5), MemberConfig(128, 3, 0.2, 3e-3, 1e-4), MemberConfig(64, 1, 0.0, 2e-3, 0.0)]


def own(model: PackedMLP, m: int, c: MemberConfig) -> dict[str, torch.Tensor]:
    """Member ``m``'s weights in its own shapes (the pack pads them to its widest width and deepest depth)."""
    w, hidden = c.width, c.depth - 1
    return {"w_in": model.w_in[m, :, :w], "b_in": model.b_in[m, :, :w], "w_hidden": model.w_hidden[m, :hidden, :w, :w],
            "b_hidden": model.b_hidden[m, :hidden, :, :w], "w_out": model.w_out[m, :w], "b_out": model.b_out[m]}


def test_a_member_initialises_and_trains_as_it_would_alone(small: Any) -> None:
    seeds = member_seeds(7, len(MIXED))
    d_in = small.x["train"].shape[1]
    with torch.no_grad():
        pack = PackedMLP(MIXED, d_in, small.n_classes, device=CPU, seeds=seeds)
        for m, c in enumerate(MIXED):
            alone = PackedMLP([c], d_in, small.n_classes, device=CPU, seeds=[seeds[m]])
            mine, theirs = own(pack, m, c), own(alone, 0, c)
            for name in mine:
                assert torch.equal(mine[name], theirs[name]), (m, name)  # same seed, same initial weights, bit for bit
            assert float(alone.w_out.abs().max()) > 0.9 / c.width**0.5  # the member's own fan-in: U(±1/√width)
            padded = sum(float(p.abs().sum()) for p in (pack.w_in[m, :, c.width :], pack.w_out[m, c.width :], pack.w_hidden[m, c.depth - 1 :]))
            assert padded == 0.0
    # a few epochs (~6 steps each, dropout on): each member's predictions as if it had trained alone
    packed = train_pack(MIXED, small, seed=7, device=CPU, epochs=3, patience=5, batch=64)
    for m, c in enumerate(MIXED):
        alone_run = train_pack([c], small, seed=7, device=CPU, epochs=3, patience=5, batch=64, seeds=[seeds[m]])
        assert packed.best_val_loss[m] == pytest.approx(alone_run.best_val_loss[0], rel=1e-6)  # bit-equal on CPU here
        np.testing.assert_allclose(packed.test_pred[m], alone_run.test_pred[0], rtol=1e-5, atol=1e-7)


def test_greedy_ensemble_is_no_worse_than_the_best_member() -> None:
    rng = np.random.default_rng(0)
    y = rng.integers(0, 3, 400)
    truth = np.eye(3)[y]
    preds = [np.clip(0.5 * truth + rng.dirichlet(np.ones(3), 400), 1e-6, None) for _ in range(5)]
    preds = [p / p.sum(1, keepdims=True) for p in preds]
    chosen = greedy_ensemble(preds, y, regression=False)
    ensemble = np.mean([preds[i] for i in chosen], axis=0)
    assert len(set(chosen)) > 1
    assert ensemble_loss(ensemble, y, False) < min(ensemble_loss(p, y, False) for p in preds)


def test_regression_data_reports_rmse_in_target_units() -> None:
    data = load_tabular(TabularOptions(dataset="diabetes"))
    assert data.regression and data.y_scale > 10  # diabetes targets span ~25..346
    with pytest.raises(ConfigError, match="task.dataset"):
        load_tabular(TabularOptions(dataset="nope"))


class TestTabPackContract(LearnerMethodContract):
    @pytest.fixture
    def method(self) -> TabPack:
        return TabPack()

    @pytest.fixture
    def params(self) -> dict[str, Any]:
        return {"members": 3, "epochs": 3, "patience": 1}


class TestTunedMLPContract(LearnerMethodContract):
    @pytest.fixture
    def method(self) -> TunedMLP:
        return TunedMLP()

    @pytest.fixture
    def params(self) -> dict[str, Any]:
        return {"trials": 2, "epochs": 2, "patience": 1}


class TestHGBContract(LearnerMethodContract):
    @pytest.fixture
    def method(self) -> HGB:
        return HGB()

    @pytest.fixture
    def params(self) -> dict[str, Any]:
        return {"max_iter": 10}


class TestTabMContract(LearnerMethodContract):
    @pytest.fixture
    def method(self) -> TabM:
        return TabM()

    @pytest.fixture
    def params(self) -> dict[str, Any]:
        return {"k": 2, "epochs": 2, "patience": 1}
