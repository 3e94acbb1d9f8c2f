"""The ``rl`` stage: GRPO-style RL post-training on generated arithmetic, run by the training loop through its hooks.

Shao et al., "DeepSeekMath" (GRPO, arXiv 2402.03300) and Schulman et al., "Proximal Policy
Optimization" (arXiv 1707.06347): for each prompt a group of G completions is sampled at
``temperature`` from the batched generator (:func:`paretolab.generation.decode_batch`, one
seeded random stream per row), each scored 1/0 by its exact answer
(:mod:`paretolab.training.arithmetic`); the advantage of a completion is its reward minus the
group's mean over the group's standard deviation (+1e-4), fixed at generation time; the
behaviour policy's log-probs of the sampled tokens (under the same temperature) are recorded
while sampling. The update maximises the PPO-clipped objective
``min(ρ·A, clip(ρ, 1-ε, 1+ε)·A)`` with ``ρ = exp(logπθ − logπ_behaviour)`` per completion token,
averaged over each completion's tokens and then over completions (GRPO's aggregation), minus
``kl`` × the k3 estimate of KL(πθ‖π_ref) to the policy at the start of the stage, plus
``entropy`` × the policy's token entropy (both off by default).

How it runs: the stage attaches a hook that owns the loop's data (rollouts, padded to one width
so the loop's FLOP counter sees one step shape) and loss, runs :func:`paretolab.training.loop.train`
(AdamW, constant lr after ``warmup``, gradient clipping, ``steps`` updates — or, with ``gen_groups``, as
many as a generation budget of that many prompt groups allows at the buffer's reuse — ``max_minutes``),
and detaches it. Rollouts come from a :class:`~paretolab.training.replay.ReplayBuffer`: with the
``replay`` method before this stage each group is reused up to ``reuse`` times, otherwise (the
``none`` baseline) each is used once, on-policy. AdamW starts with fresh moments.

Reported: ``rl_acc`` (greedy, exact answer) on ``eval_problems`` held-out pairs before and after
(``rl_acc_start``), ``rl_n``; ``rl_entropy`` (nats/token of the policy at ``temperature`` along
fresh sampled completions of the held-out prompts); ``gen_tokens`` (completion tokens sampled for
training) and ``gen_flops`` (their prefill + decode, :func:`generation_flops`: what FlopCounterMode counts
for a one-row decode, computed from the lengths so that counting costs no time) apart from ``update_flops`` (forward + backward of the updates, the reference
forward included when ``kl`` > 0); ``rl_s`` (wall time of the stage, evaluations included),
``gen_s``; the buffer's ``rl_reuse``, ``rl_staleness``. Ours: the task, the sizes, and that the
start-of-stage policy is the KL reference (GRPO's is the SFT model, which it is here).
"""

from __future__ import annotations

import copy
import dataclasses
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch

from paretolab.errors import ConfigError
from paretolab.generation import decode_batch
from paretolab.generation.decoding import Sampling, TokenChooser
from paretolab.plugin_api.context import TrialContext
from paretolab.plugin_api.hookspec import hookimpl
from paretolab.plugin_api.method import Method, Paper
from paretolab.plugin_api.metrics import Metric
from paretolab.plugin_api.options import parse_options
from paretolab.plugin_api.subject import Subject
from paretolab.stats import ARTIFACT, mean_with_stderr, per_example_json
from paretolab.training import arithmetic
from paretolab.training.hooks import TrainingHook, training_of
from paretolab.training.replay import ReplayBuffer, ReplayHook
from paretolab.training.rollouts import (
    RLOptions,
    Rollouts,
    clipped_policy_loss,
    pack,
    prompt_width,
    token_entropy,
)

VAL_CORPUS = "addition-val"


RL_METRICS: tuple[Metric, ...] = (
    Metric("rl_acc", "fraction", "maximize", "rl stage: exact-answer accuracy, greedy, on rl_n held-out arithmetic problems after RL"),
    Metric("rl_acc_stderr", "fraction", "minimize", "rl stage: standard error of rl_acc over problems"),
    Metric("rl_acc_start", "fraction", "maximize", "rl stage: rl_acc of the policy before RL (the warm start)"),
    Metric("rl_n", "problems", "maximize", "rl stage: held-out problems behind rl_acc"),
    Metric("rl_entropy", "nats/token", "maximize", "rl stage: policy entropy at the sampling temperature along sampled completions of the held-out prompts, after RL"),
    Metric("rl_entropy_start", "nats/token", "maximize", "rl stage: rl_entropy before RL"),
    Metric("rl_reward", "fraction", "maximize", "rl stage: mean reward of the rollouts generated for training"),
    Metric("gen_tokens", "tokens", "minimize", "rl stage: completion tokens sampled for training rollouts (evaluation left out)"),
    Metric("gen_flops", "FLOPs", "minimize", "rl stage: model FLOPs of generating the training rollouts (prefill + KV-cached decode, attention counted, padding left out)"),
    Metric("update_flops", "FLOPs", "minimize", "rl stage: FLOPs of the policy updates (forward + backward; the KL reference's forward when kl > 0)"),
    Metric("rl_s", "s", "minimize", "rl stage: wall time, rollouts, updates and evaluations"),
    Metric("gen_s", "s", "minimize", "rl stage: wall time spent generating training rollouts"),
    Metric("rl_steps", "steps", "maximize", "rl stage: policy updates"),
    Metric("rl_reuse", "uses", "maximize", "rl stage: mean updates each generated rollout group served in"),
    Metric("rl_staleness", "updates", "minimize", "rl stage: mean age of the rollout groups trained on (updates between generation and use)"),
    Metric("rl_evicted_unused", "groups", "minimize", "rl stage: groups the buffer evicted (FIFO capacity) before their last use"),
)


class GRPOHook(TrainingHook):
    """Owns the loop's data (rollouts from the buffer, packed) and loss (clipped policy loss ± KL ± entropy) for one rl stage."""

    replaces = ("data", "loss")

    def __init__(self, opts: RLOptions, rollouts: Rollouts, buffer: ReplayBuffer, width: int, pad_id: int,
                 reference: torch.nn.Module | None) -> None:
        self.opts, self.rollouts, self.buffer, self.width, self.pad_id = opts, rollouts, buffer, width, pad_id
        self.reference = reference
        self.current: dict[str, torch.Tensor] = {}
        self.entropies: list[float] = []

    def data(self, state: Any) -> Iterator[torch.Tensor]:
        def batches() -> Iterator[torch.Tensor]:
            while True:
                groups = self.buffer.take(self.opts.prompts, state.step, self.rollouts)
                self.current = pack(groups, self.width, self.pad_id, state.device)
                yield self.current["ids"]

        return batches()

    def loss(self, model: torch.nn.Module, batch: torch.Tensor, state: Any) -> torch.Tensor:
        cur = self.current
        logits = model(input_ids=batch[:, :-1], use_cache=False).logits.float() / self.opts.temperature
        logp_all = torch.log_softmax(logits, dim=-1)
        new_logp = logp_all.gather(-1, batch[:, 1:, None]).squeeze(-1)
        mask = cur["mask"]
        loss = clipped_policy_loss(new_logp, cur["old_logp"], cur["advantages"], mask, self.opts.clip_eps)
        entropy = -(logp_all.exp() * logp_all).sum(-1)
        mean_entropy = (entropy * mask).sum() / mask.sum().clamp_min(1.0)
        self.entropies.append(float(mean_entropy.detach()))
        if self.opts.entropy > 0:
            loss = loss - self.opts.entropy * mean_entropy
        if self.opts.kl > 0 and self.reference is not None:
            with torch.no_grad():
                ref_logits = self.reference(input_ids=batch[:, :-1]).logits.float() / self.opts.temperature
                ref_logp = torch.log_softmax(ref_logits, dim=-1).gather(-1, batch[:, 1:, None]).squeeze(-1)
            delta = ref_logp - new_logp
            k3 = torch.exp(delta) - delta - 1.0
            loss = loss + self.opts.kl * ((k3 * mask).sum(-1) / mask.sum(-1).clamp_min(1.0)).mean()
        return loss


@torch.no_grad()
def evaluate_policy(subject: Subject, opts: RLOptions, rollouts: Rollouts) -> tuple[dict[str, float], list[float]]:
    """Greedy exact-answer accuracy on the held-out problems (and each problem's hit), and the policy's entropy along
    sampled completions of them."""
    model = subject.model
    was_training = model.training
    model.eval()
    problems = arithmetic.heldout_problems(opts.eval_problems)
    prompts = [rollouts.prompt_ids(p) for p in problems]
    greedy = decode_batch(model, prompts, max_new_tokens=opts.max_new_tokens, stop_ids=rollouts.stops)
    hits = [arithmetic.reward(p, subject.tokenizer.decode(seq)) for p, seq in zip(problems, greedy.sequences, strict=True)]
    stats = mean_with_stderr("acc", hits)
    # entropy along one sampled completion per held-out prompt (a fixed stream: the same draws before and after)
    chooser = TokenChooser(Sampling(temperature=opts.temperature, seed=10_007), len(prompts))
    sampled = decode_batch(model, prompts, max_new_tokens=opts.max_new_tokens, stop_ids=rollouts.stops, chooser=chooser)
    total, count = 0.0, 0
    for prompt, seq in zip(prompts, sampled.sequences, strict=True):
        ids = torch.tensor([prompt + seq], dtype=torch.long, device=subject.device)
        logits = model(input_ids=ids[:, :-1], use_cache=False).logits[0, len(prompt) - 1 :].float() / opts.temperature
        total += float(token_entropy(logits).sum())
        count += logits.shape[0]
    model.train(was_training)
    summary = {"acc": stats["acc"], "stderr": stats.get("acc_stderr", 0.0), "n": float(len(hits)), "entropy": total / max(count, 1)}
    return summary, hits


def run_rl(subject: Subject, opts: RLOptions, ctx: TrialContext) -> dict[str, float]:
    """One rl stage on ``subject.model`` in place; returns its metrics (also kept in ``subject.info['rl_metrics']``)."""
    from paretolab.training.loop import train
    from paretolab.training.method import TrainOptions

    start = time.perf_counter()
    record = training_of(subject)
    replays = record.of_type(ReplayHook)
    settings = replays[-1] if replays else None
    buffer = ReplayBuffer(reuse=settings.reuse if settings else 1, capacity=settings.capacity if settings else opts.prompts,
                          seed=opts.seed)
    rollouts = Rollouts(subject, opts)
    before, _ = evaluate_policy(subject, opts, rollouts)
    width = prompt_width(rollouts) + opts.max_new_tokens - 1  # targets: every prompt token but the first, every completion token
    pad_id = subject.tokenizer.pad_token_id if subject.tokenizer.pad_token_id is not None else 0
    reference = None
    if opts.kl > 0:
        reference = copy.deepcopy(subject.model).eval()
        for p in reference.parameters():
            p.requires_grad_(False)
    hook = GRPOHook(opts, rollouts, buffer, width, pad_id, reference)
    record.attach(hook, method="rl")
    rows = opts.prompts * opts.group
    steps = max(1, opts.gen_groups * buffer.reuse // opts.prompts) if opts.gen_groups else opts.steps
    loop_opts = TrainOptions(tokens=steps * rows * width, seq_len=width, batch=rows, lr=opts.lr, warmup=opts.warmup,
                             min_lr_frac=1.0, weight_decay=0.0, clip=opts.clip, eval_every=steps, eval_tokens=256,
                             seed=opts.seed, corpus=VAL_CORPUS, init="keep", max_minutes=opts.max_minutes)
    flops_before, steps_before = record.flops, record.metrics.get("train_steps", 0.0)
    record.optimizer_state = {}  # RL starts with fresh AdamW moments (an SFT stage's mean nothing at RL's learning rate)
    try:
        train(subject, loop_opts, ctx, val_corpus=VAL_CORPUS)
    finally:
        record.hooks.remove(hook)
    after, hits = evaluate_policy(subject, opts, rollouts)
    # each held-out problem's hit, so a comparison of rl_acc counts the problems' noise, not only the seeds'
    ctx.add_artifact(ARTIFACT, per_example_json("problem", {"rl_acc": hits}))
    metrics = {
        "rl_acc": after["acc"], "rl_acc_stderr": after["stderr"], "rl_acc_start": before["acc"], "rl_n": after["n"],
        "rl_entropy": after["entropy"], "rl_entropy_start": before["entropy"],
        "rl_reward": sum(rollouts.rewards) / len(rollouts.rewards) if rollouts.rewards else 0.0,
        "gen_tokens": float(rollouts.tokens), "gen_flops": rollouts.flops, "update_flops": record.flops - flops_before,
        "rl_s": time.perf_counter() - start, "gen_s": rollouts.seconds,
        "rl_steps": record.metrics.get("train_steps", 0.0) - steps_before,
        **buffer.stats(),
    }
    subject.info["rl_metrics"] = metrics
    subject.info["rl_train_entropy"] = hook.entropies
    return metrics


class RL(Method):
    """GRPO-style RL post-training on generated arithmetic (see :mod:`paretolab.training.rl`); ``replay`` before it reuses rollouts."""

    name = "rl"
    kind = "training"
    paper = Paper("DeepSeekMath: Pushing the Limits of Mathematical Reasoning (GRPO)", "arXiv 2024", "https://arxiv.org/abs/2402.03300")
    cost_is = "real"
    metrics = tuple(m.name for m in RL_METRICS)

    def defaults(self) -> dict[str, Any]:
        return {f.name: f.default for f in dataclasses.fields(RLOptions)}

    def transform(self, subject: Subject, params: dict[str, Any], ctx: TrialContext) -> Subject:
        opts = parse_options(RLOptions, params, where=f"stages.{ctx.stage or 'rl'}.rl.params")
        if training_of(subject).owner("loss") is not None or training_of(subject).owner("data") is not None:
            owner = training_of(subject).owner("loss") or training_of(subject).owner("data")
            raise ConfigError(f"rl: method {owner.method!r} replaces the training loss or data; the rl stage needs both; drop one of them")
        run_rl(subject, opts, ctx)
        return subject

    def evaluate(self, subject: Subject, ctx: TrialContext) -> dict[str, float]:
        metrics = subject.info.get("rl_metrics", {})
        return {k: metrics[k] for k in ("rl_acc", "rl_acc_stderr", "rl_n") if k in metrics}

    def measure(self, subject: Subject, ctx: TrialContext) -> dict[str, float]:
        metrics = subject.info.get("rl_metrics", {})
        return {k: v for k, v in metrics.items() if k not in ("rl_acc", "rl_acc_stderr", "rl_n")}


@hookimpl
def register_methods(register: Callable[[Method], None]) -> None:
    register(RL())


@hookimpl
def register_metrics(register: Callable[[Metric], None]) -> None:
    for metric in RL_METRICS:
        register(metric)
