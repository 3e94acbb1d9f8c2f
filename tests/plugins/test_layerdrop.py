"""layerdrop: remove whole decoder layers by representation shift, at random, or by block influence."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from paretolab import TrialContext
from paretolab.errors import ConfigError
from paretolab.generation import greedy_decode
from paretolab.models import TinyLlama
from paretolab.plugin_api.method import validate_method
from paretolab.plugin_api.subject import Subject
from paretolab.plugins import layerdrop
from paretolab.plugins.layerdrop import SCORES, LayerDrop, representation_shift

SMALL = {"calib_samples": 4, "calib_seq_len": 48}


@pytest.fixture(scope="module")
def tiny6() -> Subject:
    return TinyLlama(layers=6).load()


@pytest.mark.parametrize("score", SCORES)
def test_removes_exactly_k_layers_and_renumbers_them(tiny6: Subject, ctx: TrialContext, score: str) -> None:
    before = sum(p.numel() for p in tiny6.model.parameters())
    per_layer = sum(p.numel() for p in tiny6.model.model.layers[0].parameters())
    subject = LayerDrop().transform(tiny6.copy(), {"k": 2, "score": score, **SMALL}, ctx)
    model = subject.model
    assert len(model.model.layers) == 4 == model.config.num_hidden_layers
    assert [layer.self_attn.layer_idx for layer in model.model.layers] == [0, 1, 2, 3]
    info = subject.info["layerdrop"]
    assert len(info["dropped"]) == 2 and sorted(info["dropped"] + info["kept"]) == list(range(6))
    assert sum(p.numel() for p in model.parameters()) == before - 2 * per_layer


@pytest.mark.parametrize("score", ["greedy_bi", "block_influence"])
def test_pruned_model_generates_with_the_kv_cache(tiny6: Subject, ctx: TrialContext, score: str) -> None:
    model = LayerDrop().transform(tiny6.copy(), {"k": 3, "score": score, **SMALL}, ctx).model
    prompt = torch.randint(0, 250, (1, 10), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        out = model(input_ids=prompt[:, :-1], use_cache=True)
        cache = out.cache if hasattr(out, "cache") else out.past_key_values  # transformers 5 renamed it
        step = {"cache": cache} if hasattr(out, "cache") else {"past_key_values": cache}
        assert cache.get_seq_length() == 9
        cached = model(input_ids=prompt[:, -1:], use_cache=True, **step).logits[:, -1]
        full = model(input_ids=prompt, use_cache=False).logits[:, -1]
    assert torch.allclose(cached, full, atol=1e-4)
    assert greedy_decode(model, prompt, 5).shape == (1, 5)


def test_layers_removed_runs_without_them_then_puts_everything_back(tiny6: Subject) -> None:
    model, ids = tiny6.model, torch.tensor([[5, 6, 7, 8, 9]])
    with torch.no_grad():
        before = model(input_ids=ids).logits
        with layerdrop.layers_removed(model, [1, 3]) as kept:
            assert kept == [0, 2, 4, 5] and model.config.num_hidden_layers == 4
            assert not torch.equal(model(input_ids=ids).logits, before)
        after = model(input_ids=ids).logits
    assert model.config.num_hidden_layers == 6 and len(model.model.layers) == 6
    assert [layer.self_attn.layer_idx for layer in model.model.layers] == list(range(6))
    assert torch.equal(after, before)


def test_block_influence_drops_the_lowest_shift_layers(tiny6: Subject, ctx: TrialContext) -> None:
    ids = ctx.calibration_ids(tiny6.tokenizer, n_samples=4, seq_len=48)
    shifts = representation_shift(tiny6.model, ids)
    subject = LayerDrop().transform(tiny6.copy(), {"k": 2, "score": "block_influence", **SMALL}, ctx)
    assert subject.info["layerdrop"]["dropped"] == sorted(torch.argsort(shifts)[:2].tolist())


def test_greedy_bi_starts_with_the_lowest_block_influence_layer(tiny6: Subject, ctx: TrialContext) -> None:
    ids = ctx.calibration_ids(tiny6.tokenizer, n_samples=4, seq_len=48)
    lowest = int(torch.argmin(representation_shift(tiny6.model, ids)))
    subject = LayerDrop().transform(tiny6.copy(), {"k": 1, "score": "greedy_bi", **SMALL}, ctx)
    assert subject.info["layerdrop"]["dropped"] == [lowest]


def test_storage_records_follow_the_renumbered_layers(tiny6: Subject, ctx: TrialContext) -> None:
    subject = tiny6.copy()
    for i in range(6):
        subject.set_storage(f"model.layers.{i}.mlp.up_proj.weight", value_bits=i + 2)
    subject = LayerDrop().transform(subject, {"k": 2, "score": "random"}, ctx)
    kept = subject.info["layerdrop"]["kept"]
    bits = [subject.storage_of(f"model.layers.{i}.mlp.up_proj.weight").value_bits for i in range(4)]
    assert bits == [old + 2 for old in kept]
    assert "model.layers.5.mlp.up_proj.weight" not in subject.storage


def test_random_is_seeded_by_the_trial(tiny6: Subject, tmp_path: Path) -> None:
    def dropped(seed: int) -> list[int]:
        ctx = TrialContext(seed=seed, workdir=tmp_path)
        return LayerDrop().transform(tiny6.copy(), {"k": 3, "score": "random"}, ctx).info["layerdrop"]["dropped"]

    assert dropped(1) == dropped(1)


@pytest.mark.parametrize("bad", [{"k": 6}, {"k": -1}, {"score": "entropy"}])
def test_bad_params_raise_config_errors(tiny6: Subject, ctx: TrialContext, bad: dict[str, object]) -> None:
    with pytest.raises(ConfigError, match="layerdrop"):
        LayerDrop().transform(tiny6.copy(), {**SMALL, **bad}, ctx)


def test_registers_a_real_cost_method() -> None:
    methods: list[object] = []
    layerdrop.register_methods(methods.append)
    validate_method(methods[0], "test")
    assert methods[0].cost_is == "real"  # type: ignore[attr-defined]


def test_shift_is_the_old_name_of_greedy_bi(tiny6: Subject, ctx: TrialContext) -> None:
    old = LayerDrop().transform(tiny6.copy(), {"k": 2, "score": "shift", **SMALL}, ctx).info["layerdrop"]
    new = LayerDrop().transform(tiny6.copy(), {"k": 2, "score": "greedy_bi", **SMALL}, ctx).info["layerdrop"]
    assert old == new and new["score"] == "greedy_bi"


def test_random_seed_param_gives_another_draw_and_seed_0_the_old_one(tiny6: Subject, tmp_path: Path) -> None:
    ctx = TrialContext(seed=0, workdir=tmp_path)

    def dropped(seed: int) -> list[int]:
        return LayerDrop().transform(tiny6.copy(), {"k": 3, "score": "random", "seed": seed}, ctx).info["layerdrop"]["dropped"]

    old = sorted(torch.randperm(6, generator=ctx.generator(offset=53))[:3].tolist())
    assert dropped(0) == old
    assert any(dropped(s) != old for s in (1, 2, 3))


@pytest.mark.slow
@pytest.mark.results
def test_block_influence_beats_random_layers_keeping_23_to_30_percent_of_smollm2s_30(tmp_path: Path) -> None:
    """The direction pipelines/layerdrop_fewlayer[_k].yaml measured (README: layerdrop_fewlayer, layerdrop_fewlayer_k):
    keeping 9, 8 or 7 of 30 layers (k = 21, 22, 23 dropped), a scored choice beats random ones by orders of magnitude."""
    from paretolab.models import SmolLM2
    from paretolab.tasks import Perplexity, PerplexityOptions
    from tests.plugins.test_wanda import wikitext2_or_pydoc

    base = SmolLM2().load()
    ctx = TrialContext(seed=0, workdir=tmp_path)
    options = PerplexityOptions(corpus=wikitext2_or_pydoc(), max_tokens=2048)

    def ppl(params: dict[str, object]) -> float:
        return Perplexity().evaluate(LayerDrop().transform(base.copy(), params, ctx), options, ctx)["ppl"]

    for k in (21, 22, 23):
        scored = ppl({"k": k, "score": "block_influence"})
        randoms = [ppl({"k": k, "score": "random", "seed": seed}) for seed in (0, 1)]
        assert all(scored < r for r in randoms), (k, scored, randoms)
