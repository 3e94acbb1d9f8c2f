"""prac: the compressed weight gradient is unbiased, the saved activations really shrink, the model is plain again after training."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch

from paretolab import TrialContext
from paretolab.errors import ConfigError
from paretolab.plugin_api.manager import registries
from paretolab.plugin_api.subject import Subject
from paretolab.plugins.prac import (
    Prac,
    PracHook,
    PracLinear,
    budget,
    complement_sample,
    principal_basis,
)
from paretolab.testing import MethodContract
from paretolab.training.hooks import training_of
from tests.training.conftest import make_ctx, train_text  # noqa: F401  (the train stage's corpus fixture)


def low_rank_input(n: int = 256, d: int = 32, seed: int = 0) -> torch.Tensor:
    """Activations with a decaying spectrum (as LLM activations have), so the principal part matters."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, d, generator=g) @ torch.diag(torch.logspace(0, -2, d)) @ torch.linalg.qr(torch.randn(d, d, generator=g)).Q


def weight_grads(mode: str, x: torch.Tensor, grad_out: torch.Tensor, draws: int, keep: float = 0.25) -> torch.Tensor:
    """(draws, out, d) grad_weight of a PracLinear over fresh random draws (one basis, refreshed once)."""
    rank, k = budget(x.shape[1], keep, 0.5, mode)
    layer = PracLinear(torch.nn.Linear(x.shape[1], grad_out.shape[1], bias=False), rank=rank, k=k, seed=3).train()
    grads = []
    for _ in range(draws):
        layer.weight.grad = None
        xi = x.clone().requires_grad_(True)
        layer(xi).backward(grad_out)
        grads.append(layer.weight.grad.clone())
        assert torch.allclose(xi.grad, grad_out @ layer.weight.detach(), atol=1e-5)  # grad_input is exact
    return torch.stack(grads)


@pytest.mark.parametrize("mode", ["prac", "random"])
def test_compressed_weight_gradient_is_unbiased(mode: str) -> None:
    x, g = low_rank_input(), torch.randn(256, 8, generator=torch.Generator().manual_seed(1))
    exact = g.T @ x
    grads = weight_grads(mode, x, g, draws=1500)
    mean, stderr = grads.mean(0), grads.std(0) / math.sqrt(grads.shape[0])
    z = (mean - exact) / stderr.clamp_min(1e-12)
    assert z.abs().max() < 5.0, f"max |z| = {z.abs().max():.2f}: the mean of the compressed gradients is off by more than 5 standard errors"
    assert (mean - exact).norm() < 0.1 * exact.norm()


def test_prac_has_less_variance_than_random_at_the_same_bytes_and_principal_only_is_biased() -> None:
    x, g = low_rank_input(), torch.randn(256, 8, generator=torch.Generator().manual_seed(1))
    exact = g.T @ x
    error = {mode: (weight_grads(mode, x, g, draws=200) - exact).pow(2).sum((1, 2)).mean() for mode in ("prac", "random")}
    assert error["prac"] < 0.5 * error["random"]
    principal = weight_grads("principal", x, g, draws=5)
    assert torch.equal(principal[0], principal[-1]) and not torch.allclose(principal[0], exact, rtol=1e-3)  # deterministic, biased


def test_bases_are_orthonormal_and_the_sample_lies_in_the_complement() -> None:
    x = low_rank_input()
    u = principal_basis(x, 4, torch.Generator().manual_seed(0))
    _, _, vh = torch.linalg.svd(x, full_matrices=False)
    assert torch.allclose(u.T @ u, torch.eye(4), atol=1e-5)
    assert torch.linalg.svdvals(u.T @ vh[:4].T).min() > 0.99  # spans the exact top-4 right singular subspace
    q = complement_sample(u, 32, 6, torch.Generator().manual_seed(0), device=torch.device("cpu"), dtype=torch.float32)
    assert torch.allclose(q.T @ q, torch.eye(6), atol=1e-5) and (u.T @ q).abs().max() < 1e-5


def test_budget_splits_the_kept_dims() -> None:
    assert budget(128, 0.25, 0.5, "prac") == (16, 16)
    assert budget(128, 0.25, 0.5, "principal") == (32, 0) and budget(128, 0.25, 0.5, "random") == (0, 32)
    assert budget(288, 0.25, 0.25, "prac") == (18, 54)


def train_stage(subject: Subject, where: Path, corpus: str, **params: Any) -> Subject:
    stage = {"tokens": 1024, "seq_len": 64, "batch": 8, "eval_every": 2, "eval_tokens": 256, "corpus": corpus, **params}
    return registries().methods.get("train").transform(subject, stage, make_ctx(where, "s1"))


def test_peak_activation_memory_drops_on_scratch_1m_and_the_linears_come_back(tmp_path: Path, train_text: str, ctx: TrialContext) -> None:
    source = registries().models.get("scratch-1m")
    plain = train_stage(source.load(), tmp_path / "none", train_text)
    compressed = Prac().transform(source.load(), {"keep": 0.25, "refresh": 1}, ctx)
    compressed = train_stage(compressed, tmp_path / "prac", train_text)
    before, after = plain.training.metrics, compressed.training.metrics
    # measured 23.06 -> 21.24 MiB: the Linears' inputs (3.2 MiB) shrink to 1.4 MiB with their bases; the
    # log-softmax of the 4096-token vocabulary (8 MiB), the MLP's gate/up outputs, norms and attention are not compressed
    assert after["peak_act_mb"] < before["peak_act_mb"] - 1.5, (before["peak_act_mb"], after["peak_act_mb"])
    assert after["train_steps"] == before["train_steps"] and math.isfinite(after["val_loss"])
    assert abs(after["val_loss"] - before["val_loss"]) < 0.5
    assert not any(isinstance(m, PracLinear) for m in compressed.model.modules())
    assert compressed.model.lm_head.weight is compressed.model.model.embed_tokens.weight  # tied embeddings untouched


def test_eval_and_no_grad_forwards_are_exact(ctx: TrialContext) -> None:
    linear = torch.nn.Linear(32, 8)
    layer = PracLinear(linear, rank=2, k=2, seed=0).train()
    x = torch.randn(4, 32)
    with torch.no_grad():
        assert torch.equal(layer(x), linear(x))
    assert torch.allclose(layer(x), linear(x), atol=1e-6)  # training forward: exact output too


def test_transform_attaches_the_hook_and_refuses_bad_params(tiny: Subject, ctx: TrialContext) -> None:
    out = Prac().transform(tiny, {"mode": "random", "keep": 0.5}, ctx)
    (hook,) = training_of(out).of_type(PracHook)
    assert hook.mode == "random" and hook.keep == 0.5 and hook.method == "prac"
    for bad, match in (({"mode": "svd"}, "prac.mode"), ({"keep": 1.0}, "prac.keep"), ({"refresh": 0}, "prac.refresh")):
        with pytest.raises(ConfigError, match=match):
            Prac().transform(tiny.copy(), bad, ctx)


@pytest.fixture
def tiny() -> Subject:
    from paretolab.models import TinyLlama

    return TinyLlama(layers=2, hidden=64).load()


class TestPracContract(MethodContract):
    @pytest.fixture
    def method(self) -> Prac:
        return Prac()
