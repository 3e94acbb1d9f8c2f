"""The rl stage: the clipped policy loss by hand, group advantages, behaviour log-probs, generation FLOPs, a run on scratch-1m."""

from __future__ import annotations

import json
import math

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from paretolab.generation import decode_batch
from paretolab.plugins.replay import Replay
from paretolab.stats import ARTIFACT, samples
from paretolab.training import arithmetic
from paretolab.training.flops import ATTENTION_FORMULAS
from paretolab.training.rl import RL
from paretolab.training.rollouts import (
    RLOptions,
    Rollouts,
    clipped_policy_loss,
    generation_flops,
    group_advantages,
    pack,
    prompt_width,
)

from .conftest import make_ctx


def test_policy_loss_equals_the_hand_computed_value() -> None:
    # three completions, two token slots; ε = 0.2
    ratios = torch.tensor([[1.5, 0.9], [0.5, 1.0], [1.1, 1.3]])
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0], [1.0, 1.0]])  # the second completion has one token
    advantages = torch.tensor([1.0, -2.0, -1.0])
    old = torch.full((3, 2), math.log(0.5))
    new = (old + ratios.log()).requires_grad_(True)
    # row 0 (A=+1): min(1.5, 1.2)=1.2, min(0.9, 0.9)=0.9 -> 1.05
    # row 1 (A=-2): min(-1.0, 0.8·-2=-1.6) = -1.6
    # row 2 (A=-1): min(-1.1, -1.1)=-1.1, min(-1.3, -1.2)=-1.3 -> -1.2
    hand = -(1.05 - 1.6 - 1.2) / 3
    loss = clipped_policy_loss(new, old, advantages, mask, clip_eps=0.2)
    assert float(loss.detach()) == pytest.approx(hand, abs=1e-6)
    loss.backward()
    grad = new.grad
    assert grad[0, 0] == 0.0 and grad[1, 0] == 0.0  # clipped: no gradient pushes ρ further out
    assert grad[1, 1] == 0.0  # masked out
    assert grad[0, 1] == pytest.approx(-(0.9 * 1.0) / 2 / 3)  # d(-ρA/2/3)/dlogπ = -ρA/6
    assert grad[2, 1] == pytest.approx(-(1.3 * -1.0) / 2 / 3)  # unclipped branch is the min for A<0 and ρ>1+ε


def test_group_advantages_are_normalised_within_the_group() -> None:
    adv = group_advantages([1.0, 0.0, 0.0, 1.0])
    a = 0.5 / (math.sqrt(1 / 3) + 1e-4)  # sample std of (1, 0, 0, 1)
    assert adv == pytest.approx([a, -a, -a, a])
    assert group_advantages([1.0, 1.0, 1.0]) == [0.0, 0.0, 0.0]


def test_generation_flops_are_what_the_flop_counter_counts(tiny) -> None:
    with FlopCounterMode(display=False, custom_mapping=ATTENTION_FORMULAS) as counter:
        out = decode_batch(tiny.model, [[5, 6, 7, 8, 9]], max_new_tokens=6)
    assert generation_flops(tiny.model, 5, len(out.sequences[0])) == counter.get_total_flops()


def test_behaviour_logprobs_recorded_while_sampling_match_a_forward(tiny) -> None:
    opts = RLOptions(prompts=2, group=3, max_new_tokens=5, temperature=0.8)
    rollouts = Rollouts(tiny, opts)
    groups = rollouts(2)
    assert rollouts.tokens == sum(len(c) for g in groups for c in g.completions) > 0
    batch = pack(groups, prompt_width(rollouts) + opts.max_new_tokens - 1, 0, tiny.device)
    with torch.no_grad():
        logits = tiny.model(input_ids=batch["ids"][:, :-1]).logits.float() / opts.temperature
    new = torch.log_softmax(logits, -1).gather(-1, batch["ids"][:, 1:, None]).squeeze(-1)
    assert float(((new - batch["old_logp"]) * batch["mask"]).abs().max()) < 1e-4
    assert batch["mask"].sum() == rollouts.tokens


def test_worked_solutions_and_heldout_pairs() -> None:
    assert arithmetic.Problem(47, 38).solution == " 7+8=15, 4+3+1=8, answer 85"
    assert arithmetic.Problem(3, 4).solution == " 3+4=7, answer 7"
    assert arithmetic.reward(arithmetic.Problem(47, 38), " 7+8=15, 4+3+1=8, answer 85\n12") == 1.0
    assert arithmetic.reward(arithmetic.Problem(47, 38), " 7+8=15, 4+3+1=8, answer 84") == 0.0
    train = arithmetic.corpus_text("addition-train").splitlines()[:2000]
    assert not any(arithmetic.is_heldout(*map(int, line.split("=")[0].split("+"))) for line in train)
    assert all(arithmetic.is_heldout(p.a, p.b) for p in arithmetic.heldout_problems(50))


def run_stage(subject, tmp_path, **params):
    ctx = make_ctx(tmp_path, "rl")
    cheap = {"steps": 2, "prompts": 2, "group": 2, "max_new_tokens": 4, "eval_problems": 4, **params}
    return RL().transform(subject, cheap, ctx).info["rl_metrics"]


def test_rl_stage_runs_a_few_steps_on_scratch_1m(tmp_path) -> None:
    from paretolab.plugin_api.manager import registries

    subject = registries().models.get("scratch-1m").load()
    before = [p.detach().clone() for p in subject.model.parameters()]
    metrics = run_stage(subject, tmp_path, kl=0.1, entropy=0.01)
    assert metrics["rl_steps"] == 2 and metrics["rl_n"] == 4
    assert metrics["gen_tokens"] == 2 * 2 * 2 * 4  # random weights never stop early: every rollout runs to max_new_tokens
    assert metrics["gen_flops"] > 0 and metrics["update_flops"] > 0
    assert all(math.isfinite(v) for v in metrics.values())
    assert subject.training is not None and not subject.training.hooks  # the stage's own hook is gone after it
    assert any(not torch.equal(a, b) for a, b in zip(before, subject.model.parameters(), strict=True))
    # every held-out problem's hit is kept, so a verdict on rl_acc counts the problems' noise
    per_problem = samples(json.loads((tmp_path / "trial" / ARTIFACT).read_text()), "rl_acc")
    assert per_problem is not None and per_problem.n == 4 and per_problem.unit == "problem"
    assert per_problem.value() == pytest.approx(metrics["rl_acc"])


def test_replay_generates_fewer_rollouts_for_the_same_updates(tiny, tmp_path) -> None:
    on_policy = run_stage(tiny.copy(), tmp_path / "a", steps=4)
    replayed = tiny.copy()
    Replay().transform(replayed, {"reuse": 2, "capacity": 8}, make_ctx(tmp_path, "replay"))
    reused = run_stage(replayed, tmp_path / "b", steps=4)
    assert on_policy["rl_reuse"] == 1.0 and on_policy["rl_staleness"] == 0.0
    assert 1.0 < reused["rl_reuse"] <= 2.0
    assert reused["gen_flops"] < on_policy["gen_flops"] and reused["rl_steps"] == on_policy["rl_steps"] == 4


def test_a_generation_budget_gives_reuse_times_more_updates(tiny, tmp_path) -> None:
    replayed = tiny.copy()
    Replay().transform(replayed, {"reuse": 2, "capacity": 8}, make_ctx(tmp_path, "replay"))
    metrics = run_stage(replayed, tmp_path / "b", gen_groups=4)
    assert metrics["rl_steps"] == 4  # 4 groups x reuse 2 / 2 per update
    assert run_stage(tiny.copy(), tmp_path / "a", gen_groups=4)["rl_steps"] == 2
