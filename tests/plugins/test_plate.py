"""plate: after training only A has changed (B, Q, every base weight bit-identical); ΔW stays in B's rows and Q's span;
lora (peft) trains as many parameters as plate when matched; the forgetting measure pairs a model with its base."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch

from paretolab import Method, TrialContext
from paretolab.errors import ConfigError
from paretolab.models import TinyLlama
from paretolab.plugin_api.manager import registries
from paretolab.plugin_api.subject import Subject
from paretolab.plugins.forgetting import Forgetting, ForgettingOptions
from paretolab.plugins.lora import Lora, params_per_rank
from paretolab.plugins.plate import (
    Plate,
    PlateLinear,
    low_energy_basis,
    redundant_rows,
    trainable_count,
)
from paretolab.testing import MethodContract

TRAIN = {"tokens": 1024, "seq_len": 32, "batch": 4, "lr": 1e-2, "eval_every": 4, "eval_tokens": 64, "corpus": "arith-train", "init": "keep"}


@pytest.fixture
def tiny() -> Subject:
    return TinyLlama(layers=2, hidden=64).load()


def train(subject: Subject, tmp_path: Path) -> Subject:
    ctx = TrialContext(seed=0, workdir=tmp_path / "trial", task={"name": "perplexity", "corpus": "arith-val"}, stage="train", cpus=1)
    return registries().methods.get("train").transform(subject, dict(TRAIN), ctx)


def snapshot(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def test_training_changes_only_a(tiny: Subject, tmp_path: Path, ctx: TrialContext) -> None:
    subject = Plate().transform(tiny, {"r": 4, "col_tau": 0.8}, ctx)
    before = snapshot(subject.model)
    subject = train(subject, tmp_path)
    after = subject.model.state_dict()
    changed = {k for k in before if not torch.equal(before[k], after[k])}
    a_names = {k for k in before if k.endswith("plate_A")}
    assert len(a_names) == 14  # 2 layers × q, k, v, o, gate, up, down
    assert changed == a_names  # every A moved; B, Q, the base Linears, embeddings and norms are bit-identical
    assert set(subject.training.optimizer_state) == a_names  # AdamW held (and decayed) only A
    assert any(k.endswith("plate_B") for k in before) and any(k.endswith("plate_Q") for k in before)


def test_delta_weight_lies_in_the_chosen_rows_and_the_low_energy_inputs(tiny: Subject, ctx: TrialContext) -> None:
    subject = Plate().transform(tiny, {"r": 3, "col_tau": 0.8, "alpha": 0.5}, ctx)
    layer = subject.model.model.layers[0].mlp.down_proj
    assert isinstance(layer, PlateLinear)
    with torch.no_grad():
        layer.plate_A.normal_()
    delta = layer.delta_weight()
    rows = layer.plate_B.argmax(0)
    untouched = torch.ones(delta.shape[0], dtype=torch.bool)
    untouched[rows] = False
    assert torch.count_nonzero(delta[untouched]) == 0 and torch.count_nonzero(delta[rows]) > 0
    q = layer.plate_Q
    assert torch.allclose(q.T @ q, torch.eye(q.shape[1]), atol=1e-5)
    assert torch.allclose(delta @ q @ q.T, delta, atol=1e-5)  # no component outside span(Q)
    x = torch.randn(5, layer.base.in_features)
    assert torch.allclose(layer(x), x @ (layer.base.weight + delta).T, atol=1e-5)


def test_redundant_rows_and_low_energy_basis() -> None:
    gen = torch.Generator().manual_seed(0)
    weight = torch.randn(40, 16, generator=gen)
    weight[[3, 7, 11]] = weight[0] * torch.tensor([[1.0], [-2.0], [0.5]])  # rows 0, 3, 7, 11 are one direction: redundant
    assert set(redundant_rows(weight, 4).tolist()) == {0, 3, 7, 11}
    low = torch.randn(40, 16, generator=gen) @ torch.diag(torch.tensor([10.0] * 8 + [0.01] * 8))
    q = low_energy_basis(low, col_tau=0.99, max_rank=100)
    assert q.shape == (16, 8)
    assert (low @ q).norm() < 0.01 * low.norm()  # Q spans the directions the rows barely read
    assert low_energy_basis(low, col_tau=0.99, max_rank=3).shape == (16, 3)


@pytest.mark.parametrize("shape", [(40, 16), (6, 16), (12, 16)])
def test_q_holds_the_least_energy_any_basis_can(shape: tuple[int, int]) -> None:
    w = torch.randn(*shape, generator=torch.Generator().manual_seed(1)) @ torch.diag(torch.logspace(1, -2, shape[1]))
    energies = torch.linalg.svdvals(w).square()
    spectrum = torch.cat([energies, torch.zeros(shape[1] - energies.numel())]).sort().values  # every input direction's, ascending
    for tau, cap in ((0.9, 100), (0.99, 3), (0.999, 8)):
        q = low_energy_basis(w, col_tau=tau, max_rank=cap)
        k = q.shape[1]
        assert torch.allclose(q.T @ q, torch.eye(k), atol=1e-4)
        assert (w @ q).square().sum() == pytest.approx(float(spectrum[:k].sum()), rel=1e-3, abs=1e-6)  # the k smallest energies


def test_plate_refuses_bad_knobs(tiny: Subject, ctx: TrialContext) -> None:
    with pytest.raises(ConfigError, match="plate.r"):
        Plate().transform(tiny.copy(), {"r": 0}, ctx)
    with pytest.raises(ConfigError, match="plate.col_tau"):
        Plate().transform(tiny.copy(), {"col_tau": 1.0}, ctx)


def test_lora_matches_plate_count_and_trains_only_its_adapters(tiny: Subject, tmp_path: Path, ctx: TrialContext) -> None:
    per_rank = params_per_rank(tiny.model)
    plate = Plate().transform(tiny.copy(), {"r": 8, "col_tau": 0.9}, ctx)
    lora = Lora().transform(tiny.copy(), {"match_plate_r": 8, "match_col_tau": 0.9}, ctx)
    plate_n, lora_n = trainable_count(plate.model), trainable_count(lora.model)
    assert lora.info["lora_matched_plate_params"] == plate_n
    assert lora_n % per_rank == 0 and abs(lora_n - plate_n) <= per_rank / 2  # the nearest rank
    assert Lora().measure(lora, ctx)["trainable_params"] == lora_n and Plate().measure(plate, ctx)["trainable_params"] == plate_n
    before = snapshot(lora.model)
    lora = train(lora, tmp_path)
    after = lora.model.state_dict()
    changed = {k for k in before if not torch.equal(before[k], after[k])}
    assert changed and all("lora_" in k for k in changed)  # peft's B starts at zero and moves; base weights stay
    assert all("lora_" in k for k in lora.training.optimizer_state)


def test_forgetting_measure_pairs_with_the_base(tiny: Subject, tmp_path: Path, ctx: TrialContext) -> None:
    options = ForgettingOptions(corpus="pydoc", max_tokens=128, seq_len=64, task_tokens=128, mc_limit=0, acc_problems=2, acc_new_tokens=4)
    same = Forgetting().measure(tiny, options, TrialContext(seed=0, workdir=tmp_path / "a", base=tiny))
    assert same["forget_nll"] == 0.0 and same["gain_nll"] == 0.0 and math.isinf(same["forget_per_gain"])
    tuned = train(Plate().transform(tiny.copy(), {"r": 8}, ctx), tmp_path)
    out = Forgetting().measure(tuned, options, TrialContext(seed=0, workdir=tmp_path / "b", base=tiny))
    assert out["base_wiki_ppl"] == pytest.approx(same["wiki_ppl"]) and out["base_task_nll"] == pytest.approx(same["task_nll"])
    assert out["gain_nll"] == pytest.approx(out["base_task_nll"] - out["task_nll"]) and out["gain_nll"] > 0  # it learnt the arithmetic text
    assert out["forget_per_gain"] == pytest.approx(out["forget_nll"] / out["gain_nll"])
    assert out["task_acc_n"] == 2.0 and 0.0 <= out["task_acc"] <= 1.0


class TestPlateContract(MethodContract):
    @pytest.fixture
    def method(self) -> Method:
        return Plate()

    @pytest.fixture
    def params(self) -> dict[str, Any]:
        return {"r": 4, "col_tau": 0.9, "max_rank": 64, "alpha": 1.0}


class TestLoraContract(MethodContract):
    @pytest.fixture
    def method(self) -> Method:
        return Lora()

    @pytest.fixture
    def params(self) -> dict[str, Any]:
        return {"rank": 2, "alpha": 4.0}
