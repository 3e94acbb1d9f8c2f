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
import math
import random
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from paretolab.context import TrialContext
from paretolab.data import encode
from paretolab.decoding import Sampling, TokenChooser
from paretolab.errors import ConfigError
from paretolab.generation import decode_batch
from paretolab.hookspec import hookimpl
from paretolab.method import Method, Paper
from paretolab.metrics import Metric
from paretolab.options import option, parse_options
from paretolab.stats import mean_with_stderr
from paretolab.subject import Subject
from paretolab.training import arithmetic
from paretolab.training.hooks import TrainingHook, training_of
from paretolab.training.replay import ReplayBuffer, ReplayHook

VAL_CORPUS = "addition-val"
ADV_EPS = 1e-4


@dataclass(frozen=True)
class RLOptions:
    steps: int = option(40, low=1)  # policy updates (optimizer steps), unless gen_groups sets them
    gen_groups: int = option(0, low=0)  # >0: a generation budget in prompt groups; steps = gen_groups × reuse / prompts (equal generation across reuse)
    prompts: int = option(8, low=1)  # prompt groups per update
    group: int = option(8, low=2)  # completions sampled per prompt (G)
    temperature: float = option(1.0, low=0.05, high=5.0)  # sampling temperature; log-probs and entropy are taken at it too
    max_new_tokens: int = option(24, low=1)
    lr: float = option(1.0e-4, low=0.0, high=1.0)
    warmup: float = option(0.0, low=0.0, high=1.0)  # fraction of the steps warming up; constant lr after
    clip: float = option(1.0, low=0.0)  # max global gradient norm (0: none)
    clip_eps: float = option(0.2, low=0.0, high=1.0)  # PPO ratio clip ε
    kl: float = option(0.0, low=0.0)  # coefficient of the k3 KL to the start-of-stage policy
    entropy: float = option(0.0, low=0.0)  # coefficient of the entropy bonus
    eval_problems: int = option(200, low=1)  # held-out problems behind rl_acc
    seed: int = option(0, low=0)  # training prompts, sampling streams and buffer draws
    max_minutes: float = option(8.0, low=0.01, high=24 * 60.0)


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


@dataclass
class Group:
    """One prompt's G rollouts: token ids, where the completion starts, behaviour log-probs, rewards and advantages."""

    prompt: list[int]
    completions: list[list[int]]
    behaviour_logp: list[list[float]]
    rewards: list[float]
    advantages: list[float]


class RecordingChooser(TokenChooser):
    """The generator's sampler, also recording log π_behaviour(token) of every sampled token per row (at the temperature)."""

    def __init__(self, sampling: Sampling, rows: int) -> None:
        super().__init__(sampling, rows)
        self.logp: list[list[float]] = [[] for _ in range(rows)]

    def choose(self, logits: torch.Tensor, row_ids: Sequence[int]) -> torch.Tensor:
        ids = super().choose(logits, row_ids)
        logp = torch.log_softmax(logits.float() / self.sampling.temperature, dim=-1).gather(-1, ids[:, None]).squeeze(-1)
        for row, value in zip(row_ids, logp.tolist(), strict=True):
            self.logp[row].append(value)
        return ids


def group_advantages(rewards: Sequence[float]) -> list[float]:
    """(r − mean) / (std + 1e-4) within a group (sample std); all-equal rewards give zeros."""
    n = len(rewards)
    mean = sum(rewards) / n
    std = math.sqrt(sum((r - mean) ** 2 for r in rewards) / (n - 1)) if n > 1 else 0.0
    return [(r - mean) / (std + ADV_EPS) for r in rewards]


def clipped_policy_loss(new_logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor,
                        clip_eps: float) -> torch.Tensor:
    """−mean over completions of the mean over their tokens of min(ρ·A, clip(ρ, 1±ε)·A), ρ = exp(new − old).

    ``new_logp``, ``old_logp``, ``mask``: (rows, T) with mask 1 on completion tokens; ``advantages``: (rows,).
    """
    ratio = torch.exp(new_logp - old_logp)
    adv = advantages[:, None]
    objective = torch.minimum(ratio * adv, ratio.clamp(1.0 - clip_eps, 1.0 + clip_eps) * adv)
    per_row = (objective * mask).sum(-1) / mask.sum(-1).clamp_min(1.0)
    return -per_row.mean()


def token_entropy(logits: torch.Tensor) -> torch.Tensor:
    """Entropy (nats) of softmax(logits) over the last dimension."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    return -(logp.exp() * logp).sum(-1)


def newline_ids(tokenizer: Any) -> list[int]:
    """Token ids that end a completion: end of sequence and any token holding a newline."""
    from paretolab.tasks.generation import tokens_containing

    stops = set(tokens_containing(tokenizer, "\n"))
    if getattr(tokenizer, "eos_token_id", None) is not None:
        stops.add(tokenizer.eos_token_id)
    return sorted(stops)


class Rollouts:
    """Samples groups of completions for arithmetic prompts from the policy; counts tokens, FLOPs and time."""

    def __init__(self, subject: Subject, opts: RLOptions) -> None:
        self.subject, self.opts = subject, opts
        self.tokenizer = subject.tokenizer
        self.stops = newline_ids(self.tokenizer)
        self.problems = random.Random(f"rl-prompts-{opts.seed}")
        self.calls = 0
        self.tokens = 0
        self.flops = 0.0
        self.seconds = 0.0
        self.rewards: list[float] = []

    def prompt_ids(self, problem: arithmetic.Problem) -> list[int]:
        # a newline first: in the SFT corpus every problem starts a line
        return encode(self.tokenizer, "\n" + problem.prompt)

    def sample(self, model: torch.nn.Module, prompts: list[list[int]], seed: int) -> tuple[list[list[int]], list[list[float]]]:
        """Completions (a stop token kept as their last id) and their behaviour log-probs, ``group`` per prompt, seeded by ``seed``."""
        rows = [p for p in prompts for _ in range(self.opts.group)]
        chooser = RecordingChooser(Sampling(temperature=self.opts.temperature, seed=seed), len(rows))
        was_training = model.training
        model.eval()
        with torch.no_grad():
            out = decode_batch(model, rows, max_new_tokens=self.opts.max_new_tokens, stop_ids=self.stops, chooser=chooser)
        model.train(was_training)
        completions, logps = [], []
        for seq, logp in zip(out.sequences, chooser.logp, strict=True):  # a stop token stays: the policy learns to end
            completions.append(list(seq))
            logps.append(logp[: len(seq)])
        return completions, logps

    def __call__(self, n: int) -> list[Group]:
        """``n`` fresh groups on training problems (the held-out pairs never appear)."""
        model = self.subject.model
        problems = [arithmetic.draw(self.problems, heldout=False) for _ in range(n)]
        prompts = [self.prompt_ids(p) for p in problems]
        start = time.perf_counter()
        completions, logps = self.sample(model, prompts, seed=self.opts.seed * 1_000_003 + self.calls)
        self.seconds += time.perf_counter() - start
        self.calls += 1
        groups = []
        g = self.opts.group
        for i, (problem, prompt) in enumerate(zip(problems, prompts, strict=True)):
            comps, lps = completions[i * g : (i + 1) * g], logps[i * g : (i + 1) * g]
            rewards = [arithmetic.reward(problem, self.tokenizer.decode(c)) for c in comps]
            self.tokens += sum(map(len, comps))
            self.flops += sum(generation_flops(model, len(prompt), len(c)) for c in comps)
            self.rewards += rewards
            groups.append(Group(prompt, comps, lps, rewards, group_advantages(rewards)))
        return groups


def generation_flops(model: torch.nn.Module, prompt_len: int, new_tokens: int) -> float:
    """Model FLOPs of sampling ``new_tokens`` after a ``prompt_len``-token prompt with a KV cache, counted as FlopCounterMode
    counts a one-row decode: 2·(Linear weights) per position fed (the LM head on the last prompt position only) plus
    attention 4·s_q·s_k·(heads·head_dim) per layer; the last token needs no forward. Padding is left out."""
    config = model.config
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    layers, width = config.num_hidden_layers, config.num_attention_heads * head_dim
    head = model.get_output_embeddings()
    head_params = head.weight.numel() if head is not None else 0
    body = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear) and m is not head)
    flops = 2.0 * body * prompt_len + 2.0 * head_params + 4.0 * layers * width * prompt_len * prompt_len
    for k in range(1, new_tokens):  # the k-th sampled token is fed; the context then holds prompt_len + k positions
        flops += 2.0 * (body + head_params) + 4.0 * layers * width * (prompt_len + k)
    return flops


def pack(groups: list[Group], width: int, pad_id: int, device: torch.device) -> dict[str, torch.Tensor]:
    """Right-padded (rows, width + 1) ids, and per target position (rows, width): completion mask and behaviour log-probs."""
    rows = [(g.prompt, c, lp, a) for g in groups for c, lp, a in zip(g.completions, g.behaviour_logp, g.advantages, strict=True)]
    ids = torch.full((len(rows), width + 1), pad_id, dtype=torch.long, device=device)
    mask = torch.zeros((len(rows), width), dtype=torch.float32, device=device)
    old = torch.zeros((len(rows), width), dtype=torch.float32, device=device)
    for r, (prompt, comp, lp, _) in enumerate(rows):
        seq = prompt + comp
        ids[r, : len(seq)] = torch.tensor(seq, dtype=torch.long, device=device)
        first = len(prompt) - 1  # target position t predicts token t + 1: the completion's first token is predicted at len(prompt) − 1
        mask[r, first : first + len(comp)] = 1.0
        old[r, first : first + len(comp)] = torch.tensor(lp, dtype=torch.float32, device=device)
    advantages = torch.tensor([a for *_, a in rows], dtype=torch.float32, device=device)
    return {"ids": ids, "mask": mask, "old_logp": old, "advantages": advantages}


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
        logits = model(input_ids=batch[:, :-1]).logits.float() / self.opts.temperature
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
def evaluate_policy(subject: Subject, opts: RLOptions, rollouts: Rollouts) -> dict[str, float]:
    """Greedy exact-answer accuracy on the held-out problems, and the policy's entropy along sampled completions of them."""
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
        logits = model(input_ids=ids[:, :-1]).logits[0, len(prompt) - 1 :].float() / opts.temperature
        total += float(token_entropy(logits).sum())
        count += logits.shape[0]
    model.train(was_training)
    return {"acc": stats["acc"], "stderr": stats.get("acc_stderr", 0.0), "n": float(len(hits)), "entropy": total / max(count, 1)}


def prompt_width(rollouts: Rollouts) -> int:
    """The longest prompt of any pair (0–99 + 0–99), in tokens: packed batches have one shape."""
    return max(len(rollouts.prompt_ids(arithmetic.Problem(a, b))) for a in range(100) for b in range(100))


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
    before = evaluate_policy(subject, opts, rollouts)
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
    after = evaluate_policy(subject, opts, rollouts)
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
