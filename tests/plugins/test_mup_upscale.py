"""mup_upscale: a widened model computes the narrow one's function; Adam's state and μP learning rates follow."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import torch

from paretolab import TrialContext
from paretolab.errors import ConfigError
from paretolab.models import TinyLlama
from paretolab.plugin_api.subject import Subject
from paretolab.plugins.mup_upscale import MuPGroups, MupUpscale, width_rules
from paretolab.testing import MethodContract, logits_of
from paretolab.training.hooks import training_of


def untied_llama() -> Subject:
    """A tiny Llama with an untied LM head and biases in attention (the rules' other branches)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    base = TinyLlama(layers=2, hidden=64).load()
    config = LlamaConfig(vocab_size=len(base.tokenizer), hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False, attention_bias=True)
    torch.manual_seed(3)
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight") or name.endswith("bias"):
                p.normal_(1.0 if name.endswith("weight") else 0.0, 0.3)  # not all ones/zeros: duplicates must carry values
    return Subject(model=model, tokenizer=base.tokenizer, model_name="untied")


@pytest.mark.parametrize("widen", ["both", "hidden", "intermediate"])
@pytest.mark.parametrize("make", [lambda: TinyLlama(layers=2, hidden=64).load(), untied_llama], ids=["tied", "untied"])
def test_zero_noise_computes_the_narrow_function(widen: str, make: Any, ctx: TrialContext) -> None:
    narrow = make()
    wide = MupUpscale().transform(narrow.copy(), {"factor": 3, "noise": 0.0, "widen": widen}, ctx)
    config, base = wide.model.config, narrow.model.config
    assert config.hidden_size == base.hidden_size * (1 if widen == "intermediate" else 3)
    assert config.intermediate_size == base.intermediate_size * (1 if widen == "hidden" else 3)
    assert sum(p.numel() for p in wide.model.parameters()) > sum(p.numel() for p in narrow.model.parameters())
    torch.testing.assert_close(logits_of(wide), logits_of(narrow), atol=2e-5, rtol=1e-5)


def test_noise_changes_the_function_and_follows_the_seed(ctx: TrialContext) -> None:
    narrow = TinyLlama(layers=2, hidden=64).load()
    noisy = [logits_of(MupUpscale().transform(narrow.copy(), {"noise": 0.5}, ctx)) for _ in range(2)]
    assert torch.equal(noisy[0], noisy[1])
    assert not torch.allclose(noisy[0], logits_of(narrow), atol=1e-3)


def test_tied_embeddings_stay_tied(ctx: TrialContext) -> None:
    wide = MupUpscale().transform(TinyLlama(layers=2, hidden=64).load(), {"noise": 1.0}, ctx).model
    assert wide.lm_head.weight is wide.model.embed_tokens.weight


def adam_state_by_name(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, dict[str, torch.Tensor]]:
    return {name: {k: v.clone() for k, v in optimizer.state[p].items()} for name, p in model.named_parameters() if p in optimizer.state}


def train(model: torch.nn.Module, optimizer: torch.optim.Optimizer, batches: list[torch.Tensor]) -> None:
    """A hand-written loop: next-token cross-entropy, AdamW steps."""
    model.train()
    for batch in batches:
        logits = model(input_ids=batch[:, :-1]).logits
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.eval()


def test_optimizer_state_widens_with_gradient_scales(ctx: TrialContext) -> None:
    subject = TinyLlama(layers=2, hidden=64).load()
    optimizer = torch.optim.AdamW(subject.model.parameters(), lr=1e-3)
    batches = [torch.randint(0, 250, (2, 17), generator=torch.Generator().manual_seed(i)) for i in range(2)]
    train(subject.model, optimizer, batches)
    training_of(subject).optimizer_state = adam_state_by_name(subject.model, optimizer)
    narrow_state = training_of(subject).optimizer_state
    wide = MupUpscale().transform(subject.copy(), {"factor": 2, "noise": 0.0}, ctx)
    state = training_of(wide).optimizer_state
    shapes = {name: tuple(p.shape) for name, p in wide.model.named_parameters()}
    assert set(state) == set(narrow_state)
    for name, entries in state.items():
        assert tuple(entries["exp_avg"].shape) == shapes[name] == tuple(entries["exp_avg_sq"].shape)
        assert entries["step"] == narrow_state[name]["step"]
    q = "model.layers.0.self_attn.q_proj.weight"  # duplicated 2×2 and divided by 2: gradients halve
    assert torch.allclose(state[q]["exp_avg"][0, 0], narrow_state[q]["exp_avg"][0, 0] / 2)
    assert torch.allclose(state[q]["exp_avg_sq"][0, 0], narrow_state[q]["exp_avg_sq"][0, 0] / 4)
    norm = "model.norm.weight"  # a tied head's 1/r folded into the final gain: gradients unchanged
    assert torch.allclose(state[norm]["exp_avg_sq"][:2], narrow_state[norm]["exp_avg_sq"][0].expand(2))


def test_mup_param_groups_scale_lr_eps_and_weight_decay(ctx: TrialContext) -> None:
    wide = MupUpscale().transform(TinyLlama(layers=2, hidden=64).load(), {"factor": 4, "noise": 0.0}, ctx)
    (hook,) = training_of(wide).of_type(MuPGroups)
    model = wide.model
    state = SimpleNamespace(model=model, params=SimpleNamespace(lr=1e-2, weight_decay=0.1))
    names, params = zip(*model.named_parameters(), strict=True)
    groups = hook.param_groups([{"params": list(params), "names": list(names), "weight_decay": 0.1}], state)
    of = {id(p): g for g in groups for p in g["params"]}
    by_name = dict(model.named_parameters())
    assert all(by_name[n] is p for g in groups for n, p in zip(g["names"], g["params"], strict=True))  # names split with params
    q, emb, gain = model.model.layers[0].self_attn.q_proj.weight, model.model.embed_tokens.weight, model.model.layers[0].input_layernorm.weight
    assert of[id(q)]["lr"] == pytest.approx(1e-2 / 4) and of[id(q)]["weight_decay"] == pytest.approx(0.4) and of[id(q)]["eps"] == pytest.approx(1e-8 / 4)
    assert of[id(emb)]["lr"] == pytest.approx(1e-2) and of[id(emb)]["weight_decay"] == pytest.approx(0.1)
    assert of[id(gain)]["lr"] == pytest.approx(1e-2) and of[id(gain)]["eps"] == pytest.approx(1e-8 / 4)
    assert sum(len(g["params"]) for g in groups) == len(list(model.parameters()))


def test_sp_attaches_no_lr_groups(ctx: TrialContext) -> None:
    wide = MupUpscale().transform(TinyLlama(layers=2, hidden=64).load(), {"parametrization": "sp"}, ctx)
    assert training_of(wide).of_type(MuPGroups) == []


def test_training_on_after_a_zero_noise_upscale_retraces_the_narrow_model(ctx: TrialContext) -> None:
    """The μP groups and the carried Adam state together: 3 narrow steps + 3 wide steps = 6 narrow steps."""
    torch.manual_seed(0)
    subject = TinyLlama(layers=2, hidden=64).load()
    batches = [torch.randint(0, 250, (2, 17), generator=torch.Generator().manual_seed(i)) for i in range(6)]
    settings = {"lr": 3e-3, "weight_decay": 0.1}
    optimizer = torch.optim.AdamW(subject.model.parameters(), **settings)
    train(subject.model, optimizer, batches[:3])
    training_of(subject).optimizer_state = adam_state_by_name(subject.model, optimizer)
    wide = MupUpscale().transform(subject.copy(), {"factor": 2, "noise": 0.0}, ctx)
    train(subject.model, optimizer, batches[3:])  # the narrow model goes on

    (hook,) = training_of(wide).of_type(MuPGroups)
    groups = hook.param_groups([{"params": list(wide.model.parameters()), **settings}], SimpleNamespace(model=wide.model, params=SimpleNamespace(**settings)))
    wide_optimizer = torch.optim.AdamW(groups, **settings)
    for name, p in wide.model.named_parameters():
        wide_optimizer.state[p] = dict(training_of(wide).optimizer_state[name])
    train(wide.model, wide_optimizer, batches[3:])
    torch.testing.assert_close(logits_of(wide), logits_of(subject), atol=1e-4, rtol=1e-4)


def test_unknown_parameter_is_refused_by_name() -> None:
    model = TinyLlama(layers=1, hidden=64).load().model
    model.model.extra = torch.nn.Linear(3, 5)
    with pytest.raises(ConfigError, match="model.extra.weight"):
        width_rules(model, 2, 2, sp=False)


@pytest.mark.parametrize("bad", [{"factor": 0}, {"noise": -1.0}, {"parametrization": "ntk"}, {"widen": "depth"}])
def test_bad_params_name_the_field(bad: dict[str, Any], ctx: TrialContext) -> None:
    with pytest.raises(ConfigError, match=f"mup_upscale.{next(iter(bad))}"):
        MupUpscale().transform(TinyLlama(layers=1, hidden=64).load(), bad, ctx)


class TestMupUpscaleContract(MethodContract):
    @pytest.fixture
    def method(self) -> MupUpscale:
        return MupUpscale()


from tests.training.conftest import make_ctx, small, tiny, train_text  # noqa: E402,F401  (the train stage's fixtures)


def train_stage(subject: Subject, params: dict[str, Any], where: Any, stage: str) -> Subject:
    from paretolab.plugin_api.manager import registries

    return registries().methods.get("train").transform(subject, dict(params), make_ctx(where, stage))


def test_train_upscale_train_at_zero_noise_retraces_the_narrow_run(tiny: Subject, small: dict[str, Any], tmp_path: Any, ctx: TrialContext) -> None:
    """Through the real train stage: carried AdamW state + μP groups make the wide stage the narrow one's twin (no clipping:
    the global gradient norm is not width-invariant)."""
    params = {**small, "clip": 0.0}
    narrow = train_stage(tiny, params, tmp_path / "s1", "s1")
    runs = {}
    for how in ("mup", "sp"):
        wide = MupUpscale().transform(narrow.copy(), {"noise": 0.0, "parametrization": how}, ctx)
        runs[how] = train_stage(wide, params, tmp_path / how, "s3")
    on = train_stage(narrow.copy(), params, tmp_path / "narrow", "s3")
    mup = runs["mup"].training.metrics
    assert runs["mup"].model.config.hidden_size == 2 * on.model.config.hidden_size
    assert mup["val_loss"] == pytest.approx(on.training.metrics["val_loss"], rel=1e-4)
    narrow_loss = on.training.metrics["val_loss"]
    assert abs(runs["sp"].training.metrics["val_loss"] - narrow_loss) > 10 * abs(mup["val_loss"] - narrow_loss)  # one lr for all: another run
    assert mup["train_flops"] > on.training.metrics["train_flops"]
    assert mup["train_tokens"] == on.training.metrics["train_tokens"] == 2 * small["tokens"]
