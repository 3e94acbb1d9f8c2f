"""``replay``: experience replay for the ``rl`` stage — each rollout group is reused for up to ``reuse`` updates.

Arnal, Cabannes, Cohen, Kempe, Munos, "Efficient RL Training for LLMs with Experience Replay",
arXiv 2604.08706 (2026); no official code found. The buffer's rules, what is the paper's, ours and
guessed, are in :mod:`paretolab.training.replay`. This method only attaches the settings; a later
``rl`` stage builds its buffer from them and generates ``ceil(prompts / reuse)`` fresh groups per
update instead of ``prompts``. Baseline: ``none`` (on-policy GRPO, every rollout used once).
The saving is real: fewer rollouts are generated (``gen_tokens``, ``gen_flops``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from optuna.distributions import IntDistribution

from paretolab import Method, Paper, TrialContext, hookimpl
from paretolab.errors import ConfigError
from paretolab.plugin_api.subject import Subject
from paretolab.training.hooks import training_of
from paretolab.training.replay import ReplayHook

PAPER = Paper("Efficient RL Training for LLMs with Experience Replay", "arXiv 2026", "https://arxiv.org/abs/2604.08706")


class Replay(Method):
    """Reuse each RL rollout group up to ``reuse`` times from a FIFO buffer of ``capacity`` groups (uniform draws)."""

    name = "replay"
    kind = "training"
    paper = PAPER
    cost_is = "real"

    def search_space(self) -> dict[str, Any]:
        return {"reuse": IntDistribution(1, 8), "capacity": IntDistribution(8, 256, log=True)}

    def defaults(self) -> dict[str, Any]:
        return {"reuse": 2, "capacity": 32}

    def transform(self, subject: Subject, params: dict[str, Any], ctx: TrialContext) -> Subject:
        p = {**self.defaults(), **params}
        try:
            reuse, capacity = int(p["reuse"]), int(p["capacity"])
        except (TypeError, ValueError):
            raise ConfigError(f"replay.reuse and replay.capacity must be integers, got {p['reuse']!r} and {p['capacity']!r}") from None
        training_of(subject).attach(ReplayHook(reuse, capacity), method=self.name)
        subject.info["replay"] = {"reuse": reuse, "capacity": capacity}
        return subject


@hookimpl
def register_methods(register: Callable[[Method], None]) -> None:
    register(Replay())
