"""GRPO's rollouts and losses for the ``rl`` stage: the stage's options, groups of sampled completions with their
rewards and advantages, the clipped policy loss, token entropy, and the generation FLOPs of a rollout.

The stage itself (its hook on the training loop, evaluation and metrics) is :mod:`paretolab.training.rl`.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from paretolab.data import encode
from paretolab.generation.decoding import Sampling, TokenChooser
from paretolab.generation.generate import decode_batch
from paretolab.plugin_api.options import option
from paretolab.plugin_api.subject import Subject
from paretolab.training import arithmetic

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


def prompt_width(rollouts: Rollouts) -> int:
    """The longest prompt of any pair (0–99 + 0–99), in tokens: packed batches have one shape."""
    return max(len(rollouts.prompt_ids(arithmetic.Problem(a, b))) for a in range(100) for b in range(100))
