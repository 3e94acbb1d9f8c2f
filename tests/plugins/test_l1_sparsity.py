"""l1_sparsity: exact zeros from the ReLU gate, sparse decode FFN == dense FFN, the L1 term by hand, the sparse path really runs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from paretolab import TrialContext
from paretolab.errors import ConfigError
from paretolab.generation import greedy_decode
from paretolab.models import TinyLlama
from paretolab.plugin_api.subject import Subject
from paretolab.plugins import l1_sparsity
from paretolab.plugins.l1_sparsity import (
    FFNSparsity,
    FFNSparsityOptions,
    L1Hook,
    L1Sparsity,
    ReluGLU,
    l1_term,
    sparse_path,
    zero_fraction,
)
from paretolab.testing import MethodContract
from paretolab.training.hooks import training_of


@pytest.fixture
def tiny() -> Subject:
    return TinyLlama(layers=2, hidden=64).load()


@pytest.fixture
def ctx(tmp_path: Path) -> TrialContext:
    return TrialContext(seed=0, workdir=tmp_path, cpus=1)


def ids(n: int = 24, batch: int = 2) -> torch.Tensor:
    return torch.randint(3, 250, (batch, n), generator=torch.Generator().manual_seed(1))


def kill_units(model: torch.nn.Module, fraction: float) -> None:
    """Zero the gate rows of ``fraction`` of each layer's units: those units are exactly 0 for every token."""
    gen = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for layer in model.model.layers:
            w = layer.mlp.gate_proj.weight
            w[torch.randperm(w.shape[0], generator=gen)[: int(w.shape[0] * fraction)]] = 0.0


@pytest.mark.parametrize("act", ["relu", "relu2"])
def test_gate_gives_exact_zeros_and_keeps_the_weights(tiny: Subject, ctx: TrialContext, act: str) -> None:
    before = {k: v.clone() for k, v in tiny.model.state_dict().items()}
    out = L1Sparsity().transform(tiny.copy(), {"act": act, "lam": 0.0}, ctx)
    mlp = out.model.model.layers[0].mlp
    assert isinstance(mlp, ReluGLU) and out.model.config.hidden_act == act
    assert out.model.state_dict().keys() == before.keys()  # same names: a saved checkpoint reloads into a Llama
    assert all(torch.equal(out.model.state_dict()[k], v) for k, v in before.items())
    x = torch.randn(3, 7, 64, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        h = mlp.hidden(x)
        g = mlp.gate_proj(x)
    assert torch.equal(h == 0, g <= 0)  # zero exactly where the gate is not positive
    assert 0.3 < zero_fraction(out.model, ids(64, 1).reshape(-1), 32) < 0.7  # at init about half
    assert zero_fraction(tiny.model, ids(64, 1).reshape(-1), 32) == 0.0  # SiLU: no exact zeros
    assert not training_of(out).hooks  # lam 0: the same gate without the penalty


@pytest.mark.parametrize(("act", "dead"), [("relu", 0.0), ("relu", 0.9), ("relu2", 0.5), ("relu", 1.0)])
def test_sparse_token_ffn_equals_the_dense_ffn(tiny: Subject, ctx: TrialContext, act: str, dead: float) -> None:
    out = L1Sparsity().transform(tiny.copy(), {"act": act, "lam": 0.0}, ctx)
    kill_units(out.model, dead)
    mlp = out.model.model.layers[1].mlp
    for seed in range(5):
        x = torch.randn(1, 1, 64, generator=torch.Generator().manual_seed(seed))
        with torch.no_grad():
            assert mlp.uses_sparse_path(x)
            sparse = mlp(x)
            dense = mlp.down_proj(mlp.hidden(x))
        torch.testing.assert_close(sparse, dense, rtol=1e-5, atol=1e-6)
    with torch.no_grad():
        assert not mlp.uses_sparse_path(torch.randn(1, 2, 64))  # prefill: dense
    assert not mlp.uses_sparse_path(x)  # grad enabled (training): dense


def test_sparse_path_follows_weight_updates(tiny: Subject, ctx: TrialContext) -> None:
    mlp = L1Sparsity().transform(tiny.copy(), {"lam": 0.0}, ctx).model.model.layers[0].mlp
    x = torch.randn(1, 1, 64, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        mlp(x)  # builds the transposed copy
        mlp.down_proj.weight.mul_(2.0)  # what an optimizer step does: in place
        torch.testing.assert_close(mlp(x), mlp.down_proj(mlp.hidden(x)), rtol=1e-5, atol=1e-6)


def test_decode_runs_the_sparse_path_and_matches_dense_decoding(tiny: Subject, ctx: TrialContext, monkeypatch: pytest.MonkeyPatch) -> None:
    out = L1Sparsity().transform(tiny.copy(), {"lam": 0.0}, ctx)
    kill_units(out.model, 0.8)
    calls = [0]
    real = l1_sparsity.sparse_token_ffn
    monkeypatch.setattr(l1_sparsity, "sparse_token_ffn", lambda *a: (calls.__setitem__(0, calls[0] + 1), real(*a))[1])
    prompt = ids(8, 1)
    with torch.no_grad():
        sparse = greedy_decode(out.model, prompt, 6)
        assert calls[0] == 2 * 5  # two layers × five one-token steps (the first token comes from the prefill)
        with sparse_path(out.model, False):
            dense = greedy_decode(out.model, prompt, 6)
        assert calls[0] == 10
    assert torch.equal(sparse, dense)


def test_l1_term_on_a_hand_example() -> None:
    # layer 1: tokens |h| sums 3 and 1 -> mean 2; layer 2: one token, |h| sum 6 -> 6; mean over layers: 4
    h1 = torch.tensor([[[1.0, -2.0, 0.0], [0.0, 0.0, 1.0]]])
    h2 = torch.tensor([[[0.0, 6.0, 0.0]]])
    assert float(l1_term([h1, h2])) == pytest.approx(4.0)


def test_l1_hook_adds_lam_times_the_l1_of_the_hidden_activations(tiny: Subject, ctx: TrialContext) -> None:
    from types import SimpleNamespace

    from paretolab.training.loop import _default_loss

    out = L1Sparsity().transform(tiny.copy(), {"lam": 0.5}, ctx)
    hook = training_of(out).owner("loss")
    assert isinstance(hook, L1Hook) and hook.method == "l1_sparsity"
    batch = ids(17, 2)
    state = SimpleNamespace(extra={})
    loss = hook.loss(out.model, batch, state)
    with torch.no_grad():
        ce = _default_loss(out.model, batch, state)
        hidden = []
        handles = [layer.mlp.down_proj.register_forward_pre_hook(lambda m, i: hidden.append(i[0])) for layer in out.model.model.layers]
        out.model(input_ids=batch[:, :-1])
        for handle in handles:
            handle.remove()
    by_hand = sum(float(h.abs().sum(-1).mean()) for h in hidden) / len(hidden)
    assert state.extra["l1"] == pytest.approx(by_hand, rel=1e-5)
    assert float(loss.detach()) == pytest.approx(float(ce) + 0.5 * by_hand, rel=1e-5)
    loss.backward()
    assert out.model.model.layers[0].mlp.gate_proj.weight.grad is not None


def test_a_second_loss_owner_is_refused(tiny: Subject, ctx: TrialContext) -> None:
    out = L1Sparsity().transform(tiny.copy(), {"lam": 0.1}, ctx)
    with pytest.raises(ConfigError, match="both replace the training loss"):
        training_of(out).attach(L1Hook(0.2), method="other")


def test_training_with_l1_raises_the_zero_fraction(ctx: TrialContext, tmp_path: Path) -> None:
    """Through the real train stage on tiny-llama: the L1 run ends sparser than the same gate without it."""
    from paretolab.plugin_api.manager import registries
    from tests.training.conftest import make_ctx

    # a fixed corpus: on README.md the effect moved with every edit of the README (0.97 vs 0.58, then 0.64 vs 0.56)
    params = {"tokens": 6144, "seq_len": 32, "batch": 8, "eval_every": 100, "eval_tokens": 256, "corpus": "pystdlib-train", "lr": 1e-2}
    frac = {}
    for lam in (0.0, 0.5):
        subject = TinyLlama(layers=2, hidden=64).load()
        subject.info["weights"] = "random init"
        subject = L1Sparsity().transform(subject, {"lam": lam}, ctx)
        registries().methods.get("train").transform(subject, dict(params), make_ctx(tmp_path / str(lam)))
        frac[lam] = zero_fraction(subject.model, ids(64, 2).reshape(-1), 32)
    assert frac[0.5] > frac[0.0] + 0.2, frac


def test_measure_reports_zero_fraction_and_paired_decode_rates(tiny: Subject, ctx: TrialContext) -> None:
    options = FFNSparsityOptions(max_tokens=128, seq_len=64, prompt_tokens=8, new_tokens=3, repeats=2, max_repeats=2)
    dense_only = FFNSparsity().measure(tiny, options, ctx)
    assert dense_only == {"ffn_zero_frac": 0.0}  # SwiGLU: no exact zeros, no sparse path to time
    out = L1Sparsity().transform(tiny.copy(), {"lam": 0.0}, ctx)
    kill_units(out.model, 0.9)
    metrics = FFNSparsity().measure(out, options, ctx)
    assert metrics["ffn_zero_frac"] >= 0.9
    assert metrics["sparse_decode_tok_s"] > 0 and metrics["dense_decode_tok_s"] > 0 and metrics["sparse_decode_speedup"] > 0
    assert all(m.sparse_decode for m in l1_sparsity.relu_glus(out.model))  # the sparse path is left on


@pytest.mark.parametrize("bad", [{"lam": -1.0}, {"act": "gelu"}])
def test_bad_params_name_the_field(tiny: Subject, ctx: TrialContext, bad: dict[str, Any]) -> None:
    with pytest.raises(ConfigError, match=f"l1_sparsity.{next(iter(bad))}"):
        L1Sparsity().transform(tiny.copy(), bad, ctx)


class TestL1SparsityContract(MethodContract):
    @pytest.fixture
    def method(self) -> L1Sparsity:
        return L1Sparsity()
