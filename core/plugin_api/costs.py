"""Per-model cost of a trial that calls several models by role: calls, tokens, seconds and a simulated price.

A trial's ``ctx.costs`` ledger collects what each role's model did (``add``); run_trial reports the
totals as metrics (``model_calls``, ``model_tokens``, ``model_s``, ``model_price``) and each role's
numbers in the trial's info (``cost.<role>.calls`` ...), with how each was obtained: seconds are
``measured`` in the trial or ``replayed`` from a recording (:mod:`paretolab.recorded`); a price is a
pipeline's price per token times the tokens, always ``simulated`` (nobody was billed).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from paretolab.plugin_api.hookspec import hookimpl
from paretolab.plugin_api.metrics import Metric


@dataclass
class RoleCost:
    """What one role's model did in a trial."""

    calls: int = 0
    tokens: int = 0
    seconds: float = 0.0
    replayed: bool = False  # seconds and tokens come from a recording, not from this trial


@dataclass
class CostLedger:
    """Costs by role; ``prices`` holds the pipeline's price per token of each role (simulated)."""

    prices: dict[str, float] = field(default_factory=dict)
    roles: dict[str, RoleCost] = field(default_factory=dict)

    def add(self, role: str, *, calls: int = 1, tokens: int = 0, seconds: float = 0.0, replayed: bool = False) -> None:
        cost = self.roles.setdefault(role, RoleCost(replayed=replayed))
        cost.calls += int(calls)
        cost.tokens += int(tokens)
        cost.seconds += float(seconds)
        cost.replayed = cost.replayed or replayed

    def price(self, role: str) -> float:
        return self.prices.get(role, 0.0) * self.roles[role].tokens if role in self.roles else 0.0

    def metrics(self) -> dict[str, float]:
        """Totals over the roles (empty when no model call was recorded)."""
        if not self.roles:
            return {}
        out = {
            "model_calls": float(sum(c.calls for c in self.roles.values())),
            "model_tokens": float(sum(c.tokens for c in self.roles.values())),
            "model_s": sum(c.seconds for c in self.roles.values()),
        }
        if self.prices:
            out["model_price"] = sum(self.price(role) for role in self.roles)
        return out

    def info(self) -> dict[str, str | float]:
        """Each role's calls, tokens, seconds (and price), and how they were obtained."""
        out: dict[str, str | float] = {}
        for role, cost in sorted(self.roles.items()):
            out.update({f"cost.{role}.calls": float(cost.calls), f"cost.{role}.tokens": float(cost.tokens),
                        f"cost.{role}.s": cost.seconds, f"cost.{role}.s_is": "replayed" if cost.replayed else "measured"})
            if role in self.prices:
                out[f"cost.{role}.price"] = self.price(role)
                out[f"cost.{role}.price_is"] = "simulated"
        return out


@hookimpl
def register_metrics(register: Callable[[Metric], None]) -> None:
    register(Metric("model_calls", "calls", "minimize", "calls to the trial's role models (forward passes per question; replayed or measured, see info cost.<role>.s_is)"))
    register(Metric("model_tokens", "tokens", "minimize", "tokens the trial's role models processed"))
    register(Metric("model_s", "s", "minimize", "seconds the trial's role models ran (replayed from a recording where info says so)"))
    register(Metric("model_price", "price units", "minimize", "the pipeline's price per token times the tokens, per role, summed: simulated", estimated=True))
