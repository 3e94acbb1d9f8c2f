"""cgls: depth grows at the set shares of the steps, AdamW moments are carried, FLOPs match a hand count, the curriculum is deterministic."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch

from paretolab import TrialContext
from paretolab.errors import ConfigError
from paretolab.models import TinyLlama
from paretolab.plugin_api.manager import registries
from paretolab.plugin_api.subject import Subject
from paretolab.plugins.cgls import (
    CGLS,
    CGLSCurriculum,
    CGLSHook,
    CGLSStacking,
    curriculum_batches,
    depth_schedule,
    easy_to_hard,
    grow,
    stage_of,
    window_difficulty,
)
from paretolab.testing import MethodContract
from paretolab.training import TrainingHook, training_of
from tests.training.conftest import make_ctx, small, train_text  # noqa: F401  (the train stage's fixtures)


@pytest.fixture
def tiny4() -> Subject:
    subject = TinyLlama(layers=4, hidden=64).load()
    subject.info["weights"] = "random init"
    return subject


@pytest.fixture
def ctx(tmp_path: Path) -> TrialContext:
    return TrialContext(seed=0, workdir=tmp_path, cpus=1)


def step_flops_by_hand(config: Any, depth: int, batch: int, seq: int) -> int:
    """Matmul FLOPs of one forward + backward (backward = 2 × forward): q/k/v/o, SwiGLU, SDPA per layer, plus the LM head."""
    h, i, v, t = config.hidden_size, config.intermediate_size, config.vocab_size, batch * seq
    heads, kv = config.num_attention_heads, config.num_key_value_heads * (config.hidden_size // config.num_attention_heads)
    per_layer = 2 * t * h * (2 * h + 2 * kv) + 3 * 2 * t * h * i + 4 * batch * heads * seq * seq * (h // heads)
    return 3 * (depth * per_layer + 2 * t * h * v)


def test_depth_schedule_and_stages() -> None:
    assert depth_schedule(1, 5, 3) == [1, 3, 5] and depth_schedule(2, 6, 3) == [2, 4, 6] and depth_schedule(1, 4, 3) == [1, 3, 4]
    assert [stage_of(s, 9, 3) for s in range(9)] == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    assert stage_of(5, 0, 3) == 0  # before the loop knows its length


class MomentWatch(TrainingHook):
    """Attached after cgls: records the AdamW moments before each step and checks them after a growth's rebuild."""

    def __init__(self) -> None:
        self.before: dict[str, torch.Tensor] = {}
        self.checked: list[int] = []

    def before_step(self, state: Any) -> None:  # runs after cgls grew, before the loop rebuilds: the old optimizer
        named = dict(state.model.named_parameters())
        self.before = {n: state.optimizer.state[p]["exp_avg"].clone() for n, p in named.items() if p in state.optimizer.state}

    def after_backward(self, state: Any) -> None:
        named = dict(state.model.named_parameters())
        in_opt = {id(p) for g in state.optimizer.param_groups for p in g["params"]}
        assert all(id(p) in in_opt for p in named.values())  # every parameter, new layers too, is optimised
        if state.step in (3, 6):
            for name, moment in self.before.items():
                assert torch.equal(state.optimizer.state[named[name]]["exp_avg"], moment), name
            new = [n for n in named if n not in self.before]
            assert new and all(named[n] not in state.optimizer.state for n in new)
            self.checked.append(int(state.step))


def test_grows_at_the_set_fractions_carries_moments_and_counts_flops_exactly(tiny4: Subject, small: dict[str, Any], ctx: TrialContext,
                                                                              tmp_path: Path) -> None:
    subject = CGLS().transform(tiny4, {"start_layers": 1, "stages": 3}, ctx)
    assert len(subject.model.model.layers) == 1 and subject.model.config.num_hidden_layers == 1
    watch = training_of(subject).attach(MomentWatch(), method="watch")
    params = {**small, "tokens": 9 * 8 * 32}  # 9 steps of 8 × 32: stages of 3 steps
    registries().methods.get("train").transform(subject, params, make_ctx(tmp_path))
    assert subject.info["cgls"]["grown_at"] == [[3, 3], [6, 4]]  # 1 layer, 3 layers at step 3 (1/3), 4 at step 6 (2/3)
    assert len(subject.model.model.layers) == subject.model.config.num_hidden_layers == 4
    assert CGLS().measure(subject, ctx) == {"cgls_final_layers": 4.0}
    assert [layer.self_attn.layer_idx for layer in subject.model.model.layers] == [0, 1, 2, 3]
    assert watch.checked == [3, 6]
    by_hand = 3 * sum(step_flops_by_hand(subject.model.config, d, 8, 32) for d in (1, 3, 4))
    assert training_of(subject).metrics["train_flops"] == by_hand
    assert subject.info["train_flop_shapes"] == 3  # one count per depth
    full = TinyLlama(layers=4, hidden=64).load()
    full.info["weights"] = "random init"
    registries().methods.get("train").transform(full, {**small, "tokens": 8 * 32}, make_ctx(tmp_path / "full"))
    # activations are weighed at each depth's first step: the peak is the full depth's, not the first (1-layer) step's
    assert training_of(subject).metrics["peak_act_mb"] == pytest.approx(training_of(full).metrics["peak_act_mb"], rel=1e-6)


def test_identity_growth_keeps_the_function_copies_do_not(ctx: TrialContext) -> None:
    ids = torch.randint(3, 250, (2, 16), generator=torch.Generator().manual_seed(0))
    base = TinyLlama(layers=2, hidden=64).load().model
    with torch.no_grad():
        before = base(input_ids=ids).logits
        for how, preserved in (("identity", True), ("copy_top", False)):
            model = TinyLlama(layers=2, hidden=64).load().model
            assert grow(model, 4, how) == [0, 1]  # the top two layers, copied on top
            assert len(model.model.layers) == 4 and model.config.num_hidden_layers == 4
            after = model(input_ids=ids).logits
            if preserved:
                assert torch.equal(after, before)  # zero output projections: each new layer adds exactly nothing
            else:
                assert not torch.allclose(after, before, atol=1e-4)  # a copy adds its layer's update a second time
            out = model.generate(ids[:1], max_new_tokens=3, do_sample=False)  # the KV cache has a slot per grown layer
            assert out.shape[1] == 19


def test_difficulty_on_a_hand_example_and_a_deterministic_order() -> None:
    ids = torch.tensor([0, 0, 0, 1, 0, 1, 1, 2, 2, 2, 2, 2])  # counts 0:4, 1:3, 2:5 of 12
    s = {t: -math.log(c / 12) for t, c in {0: 4, 1: 3, 2: 5}.items()}
    expected = [(3 * s[0] + s[1]) / 4, (s[0] + 2 * s[1] + s[2]) / 4, s[2]]
    assert window_difficulty(ids, 4).tolist() == pytest.approx(expected)
    assert easy_to_hard(ids, 4).tolist() == [2, 0, 1]  # the all-common window first, the one with two rare tokens last
    big = torch.randint(0, 50, (5000,), generator=torch.Generator().manual_seed(1))
    assert torch.equal(easy_to_hard(big, 33), easy_to_hard(big.clone(), 33))


def test_curriculum_draws_from_the_easiest_share_then_from_all() -> None:
    ids = torch.randint(0, 50, (33 * 30,), generator=torch.Generator().manual_seed(2))
    order = easy_to_hard(ids, 33)
    stage = [0]

    def draw(seed: int) -> list[torch.Tensor]:
        batches = curriculum_batches(ids, order, batch=4, seq_len=32, stage=lambda: stage[0], stages=3,
                                     generator=torch.Generator().manual_seed(seed), device=torch.device("cpu"))
        return [next(batches) for _ in range(20)]

    easy = {tuple(ids[i * 33 : (i + 1) * 33].tolist()) for i in order[:10].tolist()}
    first = draw(0)
    assert all(tuple(row.tolist()) in easy for b in first for row in b)  # stage 0: the easiest third only
    assert all(torch.equal(a, b) for a, b in zip(first, draw(0), strict=True))  # the same seed, the same batches
    stage[0] = 2
    seen = {tuple(row.tolist()) for b in draw(0) for row in b}
    assert seen - easy  # the last stage draws harder windows too


def test_variants_own_the_data_and_grow_as_named(ctx: TrialContext) -> None:
    for variant, grows, owns in (("cgls", True, True), ("stacking", True, False), ("curriculum", False, True)):
        subject = CGLS().transform(TinyLlama(layers=4, hidden=64).load(), {"variant": variant}, ctx)
        hook = training_of(subject).of_type(CGLSHook)[0]
        assert (len(subject.model.model.layers) < 4) == grows and (hook.depths[0] < 4) == grows
        assert (training_of(subject).owner("data") is hook) == owns


def test_growth_needs_a_token_budget(tiny4: Subject, small: dict[str, Any], ctx: TrialContext, tmp_path: Path) -> None:
    subject = CGLS().transform(tiny4, {}, ctx)
    with pytest.raises(ConfigError, match="give train.tokens"):
        registries().methods.get("train").transform(subject, {**small, "tokens": None, "flops": 1.0e12}, make_ctx(tmp_path))


def test_ablation_methods_are_cgls_with_a_fixed_variant(ctx: TrialContext) -> None:
    for method, variant in ((CGLSStacking(), "stacking"), (CGLSCurriculum(), "curriculum")):
        subject = method.transform(TinyLlama(layers=4, hidden=64).load(), {}, ctx)
        assert subject.info["cgls"]["variant"] == variant and "variant" not in method.search_space()
        with pytest.raises(ConfigError, match=f"{method.name}.variant"):
            method.transform(TinyLlama(layers=4, hidden=64).load(), {"variant": "cgls"}, ctx)


@pytest.mark.parametrize("bad", [{"variant": "both"}, {"start_layers": 9}, {"stages": 1}, {"new_layers": "random"}])
def test_bad_params_name_the_field(ctx: TrialContext, bad: dict[str, Any]) -> None:
    with pytest.raises(ConfigError, match=f"cgls.{next(iter(bad))}"):
        CGLS().transform(TinyLlama(layers=4, hidden=64).load(), bad, ctx)


class TestCGLSContract(MethodContract):
    @pytest.fixture
    def method(self) -> CGLS:
        return CGLS()


class TestCGLSStackingContract(MethodContract):
    @pytest.fixture
    def method(self) -> CGLSStacking:
        return CGLSStacking()


def test_the_pipeline_gives_every_arm_the_same_flops() -> None:
    """pipelines/cgls.yaml: its flops cap covers cgls's whole token budget, and the full-depth arms' last step lands within 1 %."""
    import yaml

    spec = yaml.safe_load((Path(__file__).parents[2] / "pipelines" / "cgls.yaml").read_text())
    train = next(s for s in spec["stages"] if s.get("method") == "train")["params"]
    cgls = next(c for c in spec["stages"][0]["choice"] if c["method"] == "cgls")["params"]
    from paretolab.training.tokenizer import pystdlib_tokenizer

    config = registries().models.get(spec["model"]).shape.config(pystdlib_tokenizer())  # the preset's config, no weights built
    steps = train["tokens"] // (train["batch"] * train["seq_len"])
    depths = depth_schedule(cgls["start_layers"], config.num_hidden_layers, cgls["stages"])
    grown = sum(step_flops_by_hand(config, depths[stage_of(s, steps, len(depths))], train["batch"], train["seq_len"]) for s in range(steps))
    full_step = step_flops_by_hand(config, config.num_hidden_layers, train["batch"], train["seq_len"])
    full = (train["flops"] // full_step) * full_step
    assert grown <= train["flops"] and abs(full - grown) / grown < 0.01
