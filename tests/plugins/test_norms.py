"""bhyt and dyt (tanh norms in place of RMSNorm) and the hidden_var measure."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from paretolab import TrialContext
from paretolab.errors import ConfigError
from paretolab.models import TinyLlama
from paretolab.plugin_api.method import Method
from paretolab.plugin_api.subject import Subject
from paretolab.plugins import norms
from paretolab.plugins.norms import (
    BHyT,
    BHyTNorm,
    BHyTPostNorm,
    DyT,
    DyTMethod,
    HiddenVar,
    attention_gain,
    hidden_variance,
)
from paretolab.testing import MethodContract


@pytest.fixture
def tiny() -> Subject:
    return TinyLlama(layers=2, hidden=64).load()


@pytest.fixture
def ctx(tmp_path: Path) -> TrialContext:
    return TrialContext(seed=0, workdir=tmp_path)


def ids(n: int = 32, batch: int = 2) -> torch.Tensor:
    return torch.randint(3, 250, (batch, n), generator=torch.Generator().manual_seed(1))


def test_bhyt_replaces_both_layer_norms_keeps_the_final_rmsnorm(tiny: Subject, ctx: TrialContext) -> None:
    out = BHyT().transform(tiny, {}, ctx).model
    for layer in out.model.layers:
        assert type(layer.input_layernorm) is BHyTNorm and type(layer.post_attention_layernorm) is BHyTPostNorm
        assert float(layer.input_layernorm.lam.detach()) == 2.0 and float(layer.post_attention_layernorm.lam.detach()) == 1.0
    assert type(out.model.norm).__name__ == "LlamaRMSNorm"
    with torch.no_grad():
        assert out(input_ids=ids()).logits.shape == (2, 32, 258)


def test_bhyt_computes_the_papers_formula(tiny: Subject, ctx: TrialContext) -> None:
    layer = BHyT().transform(tiny, {"input_lam": 3.0, "post_lam": 1.5, "kappa": 10.0}, ctx).model.model.layers[0]
    first, second = layer.input_layernorm, layer.post_attention_layernorm
    x, h = torch.randn(2, 8, 64, generator=torch.Generator().manual_seed(0)), torch.randn(2, 8, 64, generator=torch.Generator().manual_seed(1))
    var_x = x.pow(2).mean(-1, keepdim=True)
    with torch.no_grad():
        torch.testing.assert_close(first(x), torch.tanh(3.0 * 0.1 * x / torch.sqrt(var_x + 1e-6)))
        out = second(h)
    attn = layer.self_attn  # GQA: 4 query heads share 2 value heads, so W_V is expanded to 4 heads
    w_v = attn.v_proj.weight.reshape(2, 16, 64).repeat_interleave(2, dim=0).reshape(64, 64)
    c_attn = float(torch.linalg.matrix_norm(w_v.T @ attn.o_proj.weight.T).detach() ** 2) / (8 * 64)  # T = 8 (first forward), d = 64
    assert second.c_attn == pytest.approx(c_attn, rel=1e-5)
    var_next = var_x + c_attn * 3.0**2 * 0.01
    torch.testing.assert_close(out, torch.tanh(1.5 * 0.1 * h / torch.sqrt(var_next + 1e-6)))


@pytest.mark.parametrize("scale", [1e-3, 1.0, 1e4])
def test_outputs_are_bounded_by_the_gain(scale: float) -> None:
    x = torch.randn(4, 16, 64, generator=torch.Generator().manual_seed(0)) * scale
    bhyt, dyt = BHyTNorm(64, lam=5.0, kappa=1.0), DyT(64, alpha=0.5)
    with torch.no_grad():
        bhyt.weight.uniform_(-2, 2)
        dyt.weight.uniform_(-2, 2)
        dyt.bias.uniform_(-1, 1)
        assert (bhyt(x).abs() <= bhyt.weight.abs()).all()
        assert ((dyt(x) - dyt.bias).abs() <= dyt.weight.abs() + 1e-6).all()  # + rounding of w·tanh + b − b
        assert bhyt(x).shape == dyt(x).shape == x.shape


def test_reset_parameters_restores_the_init_and_remeasures_c_attn(tiny: Subject, ctx: TrialContext) -> None:
    model = BHyT().transform(tiny, {}, ctx).model
    layer = model.model.layers[0]
    with torch.no_grad():
        model(input_ids=ids(32))
    assert layer.post_attention_layernorm.c_attn is not None
    with torch.no_grad():
        for module in (layer.input_layernorm, layer.post_attention_layernorm):
            module.lam.fill_(7.0)
            module.weight.fill_(3.0)
        layer.self_attn.v_proj.weight.mul_(2.0)
    for module in model.modules():
        if isinstance(module, (BHyTNorm, DyT)):
            module.reset_parameters()
    assert float(layer.input_layernorm.lam.detach()) == 2.0 and float(layer.post_attention_layernorm.lam.detach()) == 1.0
    assert bool((layer.input_layernorm.weight == 1).all()) and layer.post_attention_layernorm.c_attn is None
    with torch.no_grad():
        model(input_ids=ids(16))
    assert layer.post_attention_layernorm.c_attn == pytest.approx(attention_gain(layer.self_attn, seq_len=16))


def test_bhyt_fixes_c_attn_before_training_with_the_train_seq_len(tiny: Subject, ctx: TrialContext) -> None:
    from types import SimpleNamespace

    from paretolab.plugins.norms import BHyTGain
    from paretolab.training.hooks import training_of

    subject = BHyT().transform(tiny, {}, ctx)
    [hook] = training_of(subject).of_type(BHyTGain)
    hook.convert_model(subject.model, SimpleNamespace(params=SimpleNamespace(seq_len=128)))
    layer = subject.model.model.layers[1]
    assert layer.post_attention_layernorm.c_attn == pytest.approx(attention_gain(layer.self_attn, seq_len=128))
    with torch.no_grad():
        subject.model(input_ids=ids(16))  # a later forward of another length keeps it
    assert layer.post_attention_layernorm.c_attn == pytest.approx(attention_gain(layer.self_attn, seq_len=128))


def test_bhyt_copies_keep_their_own_links(tiny: Subject, ctx: TrialContext) -> None:
    subject = BHyT().transform(tiny, {}, ctx)
    copy = subject.copy()
    layer = copy.model.model.layers[0]
    source, attention = layer.post_attention_layernorm._links
    assert source is layer.input_layernorm and attention is layer.self_attn


def test_dyt_replaces_every_norm_and_trains(tiny: Subject, ctx: TrialContext) -> None:
    model = DyTMethod().transform(tiny, {"alpha": 0.8}, ctx).model.train()
    assert sum(isinstance(m, DyT) for m in model.modules()) == 2 * 2 + 1
    assert not any("RMSNorm" in type(m).__name__ for m in model.modules())
    model(input_ids=ids(), labels=ids()).loss.backward()
    assert model.model.norm.alpha.grad is not None and float(model.model.norm.alpha.detach()) == pytest.approx(0.8)


def test_bhyt_trains_lambda(tiny: Subject, ctx: TrialContext) -> None:
    model = BHyT().transform(tiny, {}, ctx).model.train()
    model(input_ids=ids(), labels=ids()).loss.backward()
    layer = model.model.layers[1]
    assert layer.input_layernorm.lam.grad is not None and layer.post_attention_layernorm.lam.grad is not None


def test_refuses_bad_parameters(tiny: Subject, ctx: TrialContext) -> None:
    with pytest.raises(ConfigError, match="bhyt.kappa must be > 0"):
        BHyT().transform(tiny.copy(), {"kappa": 0}, ctx)
    with pytest.raises(ConfigError, match="dyt.alpha must be > 0"):
        DyTMethod().transform(tiny.copy(), {"alpha": -1}, ctx)


def test_hidden_variance_stays_bounded_with_depth_at_init(ctx: TrialContext) -> None:
    """At random init on a 16-layer model: RMSNorm's residual variance grows ~13x over depth, BHyT's < 1.5x (measured 1.09)."""
    growth = {}
    for name, method in (("none", None), ("bhyt", BHyT()), ("dyt", DyTMethod())):
        subject = TinyLlama(layers=16, hidden=64).load()
        if method is not None:
            subject = method.transform(subject, {}, ctx)
        var = hidden_variance(subject.model, ids(64, batch=2))
        assert len(var) == 17
        growth[name] = var[-1] / var[1]
    assert growth["bhyt"] < 1.5 and growth["dyt"] < 1.5
    assert growth["none"] > 5 * growth["bhyt"]


def test_hidden_var_measure_reports_every_model(tiny: Subject, ctx: TrialContext) -> None:
    metrics = HiddenVar().measure(tiny, {"max_tokens": 256, "seq_len": 64}, ctx)
    assert set(metrics) == {"hidden_var_last", "hidden_var_growth"} and all(math.isfinite(v) for v in metrics.values())
    artifact = json.loads((ctx.workdir / "hidden_var.json").read_text())
    assert len(artifact["var"]) == 3 and artifact["var"][-1] == pytest.approx(metrics["hidden_var_last"])
    with pytest.raises(ConfigError, match="seq_len"):
        HiddenVar().measure(tiny, {"max_tokens": 64, "seq_len": 128}, ctx)


def test_registers_methods_measure_and_metrics() -> None:
    methods, measures, metrics = [], [], []
    norms.register_methods(methods.append)
    norms.register_measures(measures.append)
    norms.register_metrics(metrics.append)
    assert [m.name for m in methods] == ["bhyt", "dyt"]
    assert set(measures[0].metrics) == {m.name for m in metrics} == {"hidden_var_last", "hidden_var_growth"}


class TestBHyTContract(MethodContract):
    @pytest.fixture
    def method(self) -> Method:
        return BHyT()


class TestDyTContract(MethodContract):
    @pytest.fixture
    def method(self) -> Method:
        return DyTMethod()


@pytest.mark.parametrize("method", ["bhyt", "dyt"])
def test_trains_as_a_trial_after_re_initialisation(tiny: Subject, tmp_path: Path, method: str) -> None:
    import inspect
    import textwrap

    from paretolab.records import StagePlan, TrialSettings
    from paretolab.study.trial import run_trial

    text = tmp_path / "train.txt"
    text.write_text(inspect.getsource(textwrap), encoding="utf-8")
    tiny.info["weights"] = "random init"  # train's init: auto re-initialises it, our modules through reset_parameters()
    train = {"tokens": 2048, "seq_len": 32, "batch": 8, "eval_every": 4, "eval_tokens": 256, "corpus": str(text)}
    settings = TrialSettings("t", "perplexity", {"corpus": "pydoc", "max_tokens": 256, "context": 64, "stride": 64},
                             {"hidden_var": {"max_tokens": 256, "seq_len": 64}}, seed=0, cpus=1, timeout_s=600)
    result = run_trial(tiny, [StagePlan("s0", method, {}), StagePlan("s1", "train", train)], settings, number=0)
    assert not result.failed, result.traceback
    assert math.isfinite(result.metrics["val_loss"]) and result.metrics["hidden_var_growth"] > 0
    assert "hidden_var.json" in result.artifacts
