"""layer_dropout: layers skipped during training really do not run; the rate rises with depth and time; all come back."""

from __future__ import annotations

import math
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from paretolab import TrialContext
from paretolab.errors import ConfigError
from paretolab.models import TinyLlama
from paretolab.plugin_api.manager import registries
from paretolab.plugin_api.subject import Subject
from paretolab.plugins.layer_dropout import (
    EarlyExit,
    EarlyExitOptions,
    LayerDropout,
    LayerDropoutHook,
    drop_rates,
    exit_cross_entropy,
    skipped_layers,
)
from paretolab.testing import MethodContract, logits_of
from paretolab.training.hooks import training_of

BATCH = torch.randint(0, 250, (2, 33), generator=torch.Generator().manual_seed(0))


@pytest.fixture
def tiny6() -> Subject:
    return TinyLlama(layers=6).load()


def test_rate_rises_with_depth_and_time() -> None:
    early, late = drop_rates(6, 10, 100, 0.5), drop_rates(6, 100, 100, 0.5)
    assert early[0] == late[0] == 0.0  # the first layer always runs
    assert all(a < b for a, b in zip(late, late[1:], strict=False))
    assert all(e < v for e, v in zip(early[1:], late[1:], strict=True))
    assert late[-1] == pytest.approx(0.5) and drop_rates(6, 500, 100, 0.5) == late  # flat after the ramp


def test_nothing_is_skipped_before_the_loop_knows_its_length(tiny6: Subject) -> None:
    hook = LayerDropoutHook(p_max=0.7, ramp=0.5)
    assert hook.choose(state_of(tiny6.model, 0, max_steps=0)) == ()  # step 0: t = 0 on any ramp
    assert LayerDropoutHook(p_max=0.7, ramp=0.0).choose(state_of(tiny6.model, 0, max_steps=0)) != ()  # no ramp: full rates at once


def test_skip_draws_are_deterministic_and_follow_the_rates() -> None:
    rates = drop_rates(6, 1, 0, 0.6)
    assert skipped_layers(rates, 3, 17) == skipped_layers(rates, 3, 17)
    draws = [skipped_layers(rates, 3, step) for step in range(2000)]
    assert len(set(draws)) > 10
    for layer, rate in enumerate(rates):
        assert sum(layer in d for d in draws) / len(draws) == pytest.approx(rate, abs=0.04)


def state_of(model: torch.nn.Module, step: int, *, max_steps: int = 100, seed: int = 0) -> Any:
    """The part of the train loop's state the hook reads."""
    return SimpleNamespace(model=model, step=step, max_steps=max_steps, params=SimpleNamespace(seed=seed, lr=1e-3))


def attention_calls(model: torch.nn.Module) -> list[int]:
    calls = [0] * len(model.model.layers)
    for i, layer in enumerate(model.model.layers):
        layer.self_attn.register_forward_hook(lambda *a, i=i: calls.__setitem__(i, calls[i] + 1))
        layer.mlp.register_forward_hook(lambda *a, i=i: calls.__setitem__(i, calls[i] + 1))
    return calls


def step_with(hook: LayerDropoutHook, model: torch.nn.Module, state: Any, optimizer: torch.optim.Optimizer) -> None:
    """One step of a hand-written loop, calling the hook's events where the train stage does."""
    hook.before_step(state)
    logits = model(input_ids=BATCH[:, :-1]).logits
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), BATCH[:, 1:].reshape(-1))
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    hook.after_backward(state)
    optimizer.step()
    hook.after_step(state)


def test_skipped_layers_do_not_run_and_get_no_gradient(tiny6: Subject) -> None:
    model = tiny6.model.train()
    hook = LayerDropoutHook(p_max=0.7, ramp=0.0)
    calls = attention_calls(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    seen = 0
    for step in range(6):
        state = state_of(model, step)
        before = list(calls)
        hook.before_step(state)
        skipped = hook.skipped
        assert hook.step_signature(state) == ("skip", skipped)
        hook.after_step(state)
        step_with(hook, model, state, optimizer)
        ran = [c - b for c, b in zip(calls, before, strict=True)]
        assert [i for i, n in enumerate(ran) if n == 0] == list(skipped)
        for i in skipped:
            assert all(p.grad is None for p in model.model.layers[i].parameters())
        seen += len(skipped)
    assert seen > 0


def test_every_layer_is_back_after_each_step_and_after_training(tiny6: Subject) -> None:
    before = logits_of(tiny6)
    hook = LayerDropoutHook(p_max=0.7, ramp=0.0)
    hook.before_step(state_of(tiny6.model, 5))
    assert hook.skipped and not torch.equal(logits_of(tiny6), before)
    hook.end_of_training(state_of(tiny6.model, 5))
    assert torch.equal(logits_of(tiny6), before)
    assert all("forward" not in layer.__dict__ for layer in tiny6.model.model.layers)
    hook.before_step(state_of(tiny6.model, 5))
    hook.after_step(state_of(tiny6.model, 5))
    assert torch.equal(logits_of(tiny6), before)


def step_flops(model: torch.nn.Module) -> int:
    with FlopCounterMode(display=False) as counter:
        logits = model(input_ids=BATCH[:, :-1]).logits
        logits.float().logsumexp(-1).sum().backward()
    return counter.get_total_flops()


def test_a_step_with_skipped_layers_costs_fewer_flops(tiny6: Subject) -> None:
    model = tiny6.model
    full = step_flops(model)
    hook = LayerDropoutHook(p_max=0.7, ramp=0.0)
    hook.before_step(state_of(model, 3))
    k = len(hook.skipped)
    assert k > 0
    dropped = step_flops(model)
    hook.end_of_training(state_of(model, 3))
    per_layer = (full - step_flops(TinyLlama(layers=5).load().model)) or 1
    assert dropped == pytest.approx(full - k * per_layer, rel=1e-6)


def test_transform_attaches_one_hook_and_refuses_bad_rates(tiny6: Subject, ctx: TrialContext) -> None:
    out = LayerDropout().transform(tiny6, {"p_max": 0.4}, ctx)
    (hook,) = training_of(out).of_type(LayerDropoutHook)
    assert hook.method == "layer_dropout" and hook.p_max == 0.4
    with pytest.raises(ConfigError, match="layer_dropout.p_max"):
        LayerDropout().transform(TinyLlama(layers=2).load(), {"p_max": 1.0}, ctx)


def test_exit_at_full_depth_is_the_model_and_earlier_exits_differ(tiny6: Subject) -> None:
    ids = BATCH.reshape(-1)
    with torch.no_grad():
        logits = tiny6.model(input_ids=BATCH, use_cache=False).logits[:, :-1]
    full = float(torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), BATCH[:, 1:].reshape(-1)))
    assert exit_cross_entropy(tiny6.model, ids, 6, 33) == pytest.approx(full, rel=1e-5)
    assert exit_cross_entropy(tiny6.model, ids, 2, 33) != pytest.approx(full, rel=1e-5)  # a random model: close, not equal
    assert len(tiny6.model.model.layers) == 6


def test_early_exit_measure_reports_registered_finite_metrics(tiny6: Subject, ctx: TrialContext) -> None:
    options = EarlyExitOptions(max_tokens=256, seq_len=64, prompts=2, prompt_tokens=16, new_tokens=8, draft_k=3)
    out = EarlyExit().measure(tiny6, options, ctx)
    registered = registries().metrics
    assert set(out) == set(EarlyExit.metrics) and all(name in registered for name in out)
    assert all(math.isfinite(v) for v in out.values())
    assert 1.0 <= out["selfspec_accepted_len"] <= 4.0


class TestLayerDropoutContract(MethodContract):
    @pytest.fixture
    def method(self) -> LayerDropout:
        return LayerDropout()


from tests.training.conftest import make_ctx, small, train_text  # noqa: E402,F401  (the train stage's fixtures)


def train_stage(subject: Subject, params: dict[str, Any], where: Any) -> Subject:
    return registries().methods.get("train").transform(subject, dict(params), make_ctx(where, "s2"))


def test_the_train_stage_counts_fewer_flops_with_dropout_and_ends_with_every_layer(tiny6: Subject, small: dict[str, Any], tmp_path: Any, ctx: TrialContext) -> None:
    tiny6.info["weights"] = "random init"
    small = {**small, "tokens": 2048}  # 8 steps
    plain = train_stage(tiny6.copy(), small, tmp_path / "none").training.metrics
    runs = [train_stage(LayerDropout().transform(tiny6.copy(), {"p_max": 0.6, "ramp": 0.25}, ctx), small, tmp_path / f"drop{i}") for i in range(2)]
    dropped = runs[0].training.metrics
    assert dropped["train_steps"] == plain["train_steps"] and dropped["train_tokens"] == plain["train_tokens"]
    assert dropped["train_flops"] < 0.9 * plain["train_flops"]
    assert runs[0].info["train_flop_shapes"] > 1  # one count per distinct skipped set
    assert runs[1].training.metrics["val_loss"] == dropped["val_loss"]  # the skips follow the stage's seed
    assert all("forward" not in layer.__dict__ for layer in runs[0].model.model.layers)
    with torch.no_grad():
        assert torch.isfinite(runs[0].model(input_ids=BATCH).logits).all()
