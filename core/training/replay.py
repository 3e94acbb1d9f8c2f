"""The rollout buffer of the ``rl`` stage: FIFO, uniform sampling, each rollout group served at most ``reuse`` times.

Arnal, Cabannes, Cohen, Kempe, Munos, "Efficient RL Training for LLMs with Experience Replay"
(FAIR at Meta, arXiv 2604.08706, 2026; no code found). Read from its abstract and public
summaries; the full text was not available here.

The paper's: inference workers push rollouts into a FIFO buffer of size N; trainers sample
uniformly from it, and sampling does not remove an item, so a rollout is reused while it is in
the buffer; the cost per update falls with the ratio of generation to training workers (W/T);
staleness adds variance, reuse saves generation; entropy is preserved.

Ours (for one synchronous process, no workers): each update needs ``batch`` groups; before it,
``ceil(batch / reuse)`` fresh groups are generated and pushed (the generation-to-update ratio
1/reuse plays the role of W/T), plus as many more as needed when the buffer holds fewer than
``batch`` groups (the first updates, or after evictions). The update's groups are drawn
uniformly *without replacement* from the whole buffer (no group twice in one update).

Guessed (not in what we could read): a hard cap — a group is evicted as soon as it has been
served ``reuse`` times, so no rollout is ever used more than ``reuse`` times (the paper bounds
reuse only in expectation, through N and W/T); eviction of the oldest group when more than
``capacity`` are held, whether or not it was used up (FIFO, counted as ``evicted_unused``); the
unit is a prompt's whole group of rollouts (its group-normalised advantages are fixed at
generation time, against the behaviour policy's log-probs recorded then). ``reuse=1`` is
on-policy GRPO: every group is generated, used once, and evicted.
"""

from __future__ import annotations

import math
import random
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from paretolab.errors import ConfigError
from paretolab.training.hooks import TrainingHook


@dataclass
class Entry:
    """One stored group of rollouts, with how often it was served and the update it was generated before."""

    item: Any
    born: int
    uses: int = 0


@dataclass
class ReplayBuffer:
    """FIFO buffer of rollout groups; ``take`` serves ``n`` distinct groups uniformly, each at most ``reuse`` times in all."""

    reuse: int = 1
    capacity: int = 64
    seed: int = 0
    entries: deque[Entry] = field(default_factory=deque)
    pushed: int = 0  # groups ever pushed
    served: int = 0  # group servings, all updates
    evicted_unused: int = 0  # groups evicted by capacity before their last use
    staleness: list[int] = field(default_factory=list)  # age (updates since generation) of every serving

    def __post_init__(self) -> None:
        if self.reuse < 1:
            raise ConfigError(f"replay.reuse must be >= 1 (uses per rollout; 1 is on-policy), got {self.reuse}")
        if self.capacity < 1:
            raise ConfigError(f"replay.capacity must be >= 1 (groups held), got {self.capacity}")
        self._rng = random.Random(f"replay-{self.seed}")

    def fresh_per_update(self, batch: int) -> int:
        """Groups generated before each update: ceil(batch / reuse)."""
        return math.ceil(batch / self.reuse)

    def push(self, items: list[Any], step: int) -> None:
        """Add freshly generated groups; evict the oldest beyond ``capacity`` (FIFO)."""
        for item in items:
            self.entries.append(Entry(item, step))
            self.pushed += 1
        while len(self.entries) > self.capacity:
            old = self.entries.popleft()
            if old.uses < self.reuse:
                self.evicted_unused += 1

    def take(self, n: int, step: int, generate: Callable[[int], list[Any]]) -> list[Any]:
        """``n`` distinct groups for update ``step``: push ``fresh_per_update`` new ones (more if too few are held), sample
        uniformly, count the use, evict a group at its ``reuse``-th use."""
        if n > self.capacity:
            raise ConfigError(f"replay.capacity: {self.capacity} groups cannot serve a batch of {n}; raise capacity to at least rl.prompts")
        self.push(generate(self.fresh_per_update(n)), step)
        if len(self.entries) < n:
            self.push(generate(n - len(self.entries)), step)
        chosen = self._rng.sample(range(len(self.entries)), n)
        out = []
        for index in sorted(chosen):
            entry = self.entries[index]
            entry.uses += 1
            self.served += 1
            self.staleness.append(step - entry.born)
            out.append(entry.item)
        self.entries = deque(e for e in self.entries if e.uses < self.reuse)
        return out

    def stats(self) -> dict[str, float]:
        """Mean uses per generated group, mean staleness (updates) of what was served, and groups evicted unused."""
        return {
            "rl_reuse": self.served / self.pushed if self.pushed else 0.0,
            "rl_staleness": sum(self.staleness) / len(self.staleness) if self.staleness else 0.0,
            "rl_evicted_unused": float(self.evicted_unused),
        }


class ReplayHook(TrainingHook):
    """Attached by the ``replay`` method: tells a later ``rl`` stage to reuse each rollout group up to ``reuse`` times."""

    def __init__(self, reuse: int, capacity: int) -> None:
        self.reuse, self.capacity = reuse, capacity
        ReplayBuffer(reuse=reuse, capacity=capacity)  # refuse bad settings at transform time, not at the first update
