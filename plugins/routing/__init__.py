"""Routing methods over several models (pipeline ``models:`` by role): SDR and LazyStack with their baselines.

A routing method does not change a model: its ``transform`` sets ``subject.router``, a policy the
``mc_routing`` task fits on a calibration split of the recorded answers and scores on the rest
(:mod:`paretolab.plugins.routing.task`). The role models are loaded once per worker and shared;
their answers are recorded once and replayed, so these methods are ``cost_is: simulated``: the
cost a route would have is read from the recording, not saved by a live run (labelled
``replayed`` in each trial's info; ``route_gflops`` is an estimate).

Papers (only their abstracts could be read here; no official code was found for either):
- SDR, Selective Deferred Routing (ICML 2026 list): a small local model answers; a light decider
  on its hidden representation of the request keeps the answer or defers once to the most
  suitable larger model; trained on calibration data, swept over a cost weight.
- LazyStack (ICML 2026 list, https://ashwincolaco.github.io/lazystack): after each model of an
  ensemble, exit when the accumulated evidence (a trained meta-learner) is confident; aggregators
  only for the common execution paths; the order by value iteration over an MDP. Claim: up to
  38x speed-up at >= 97 % of the full ensemble's accuracy.
What is ours and what was guessed is said in each policy's docstring (policies.py).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

from optuna.distributions import (
    CategoricalDistribution,
    FloatDistribution,
    IntDistribution,
)

from paretolab import Method, Paper, TrialContext, hookimpl
from paretolab.plugin_api.subject import Subject
from paretolab.plugins.routing import policies

SDR_PAPER = Paper("Selective Deferred Routing (SDR)", "ICML 2026")
LAZYSTACK_PAPER = Paper("LazyStack: efficient model ensemble inference", "ICML 2026", "https://ashwincolaco.github.io/lazystack")
ROLES = ("small", "medium", "large", "best")  # role names a fixed route may name (`best`: the most accurate on calibration)


class RoutingMethod(Method):
    """A routing policy as a method: ``transform`` puts the policy (with its knob and split seed) on the subject."""

    kind = "routing"
    cost_is = "simulated"  # costs replayed from recorded answers
    knob: ClassVar[str] = ""
    knob_space: ClassVar[Any] = None
    knob_default: ClassVar[float] = 0.0
    metrics = ()  # the mc_routing task reports the route metrics

    def make(self, knob: float, seed: int, params: dict[str, Any]) -> policies.Policy:
        raise NotImplementedError

    def search_space(self) -> dict[str, Any]:
        space = {"split": IntDistribution(0, 9)}
        if self.knob:
            space[self.knob] = self.knob_space
        return space

    def defaults(self) -> dict[str, Any]:
        return {"split": 0, **({self.knob: self.knob_default} if self.knob else {})}

    def transform(self, subject: Subject, params: dict[str, Any], ctx: TrialContext) -> Subject:
        subject.router = self.make(float(params.get(self.knob, self.knob_default)) if self.knob else 0.0, int(params.get("split", 0)), params)
        subject.info["router"] = self.name
        return subject


class SDRMethod(RoutingMethod):
    name = "sdr"
    paper = SDR_PAPER
    knob, knob_space, knob_default = "cost_weight", FloatDistribution(0.0, 1.0), 0.2

    def make(self, knob: float, seed: int, params: dict[str, Any]) -> policies.Policy:
        return policies.SDR(knob=knob, seed=seed)


class QueryRouter(RoutingMethod):
    name = "route_query"
    paper = "baseline: a router on the query text alone (hashed n-grams, logistic regression per model)"
    knob, knob_space, knob_default = "cost_weight", FloatDistribution(0.0, 1.0), 0.2

    def make(self, knob: float, seed: int, params: dict[str, Any]) -> policies.Policy:
        return policies.QueryOnly(knob=knob, seed=seed)


class ConfidenceCascade(RoutingMethod):
    name = "route_confidence"
    paper = "baseline: confidence cascade (defer when the small model's top choice probability is below a threshold)"
    knob, knob_space, knob_default = "threshold", FloatDistribution(0.0, 1.0), 0.5

    def make(self, knob: float, seed: int, params: dict[str, Any]) -> policies.Policy:
        return policies.Cascade(knob=knob, seed=seed)


class RandomRoute(RoutingMethod):
    name = "route_random"
    paper = "baseline: random routing (defer a given share of questions at random)"
    knob, knob_space, knob_default = "rate", FloatDistribution(0.0, 1.0), 0.5

    def make(self, knob: float, seed: int, params: dict[str, Any]) -> policies.Policy:
        return policies.Random(knob=knob, seed=seed)


class FixedRoute(RoutingMethod):
    name = "route_fixed"
    paper = "baseline: one model answers everything (small only, a large only, or the best single model on calibration)"

    def search_space(self) -> dict[str, Any]:
        return {**super().search_space(), "role": CategoricalDistribution(ROLES)}

    def defaults(self) -> dict[str, Any]:
        return {**super().defaults(), "role": "small"}

    def make(self, knob: float, seed: int, params: dict[str, Any]) -> policies.Policy:
        return policies.Fixed(seed=seed, role=str(params.get("role", "small")))


class LazyStackMethod(RoutingMethod):
    name = "lazystack"
    paper = LAZYSTACK_PAPER
    knob, knob_space, knob_default = "threshold", FloatDistribution(0.3, 1.01), 0.9

    order: ClassVar[str] = "learned"

    def search_space(self) -> dict[str, Any]:
        space = super().search_space()
        if self.order == "learned":
            space["cost_weight"] = FloatDistribution(0.0, 2.0)
        return space

    def defaults(self) -> dict[str, Any]:
        return {**super().defaults(), **({"cost_weight": 0.5} if self.order == "learned" else {})}

    def make(self, knob: float, seed: int, params: dict[str, Any]) -> policies.Policy:
        return policies.LazyStack(knob=knob, seed=seed, cost_weight=float(params.get("cost_weight", 0.5)), order=self.order)


class CheapestFirst(LazyStackMethod):
    name = "cascade_cheapest"
    paper = "baseline: the same cascade and meta-learners in cheapest-first order"
    order = "cheapest"


class FullStack(RoutingMethod):
    name = "stack_full"
    paper = "baseline: the full stacking ensemble (every model runs; one meta-learner over all)"

    def make(self, knob: float, seed: int, params: dict[str, Any]) -> policies.Policy:
        return policies.Stack(seed=seed)


@hookimpl
def register_methods(register: Callable[[Method], None]) -> None:
    for method in (SDRMethod(), QueryRouter(), ConfidenceCascade(), RandomRoute(), FixedRoute(), LazyStackMethod(), CheapestFirst(), FullStack()):
        register(method)


from paretolab.plugins.routing.models import register_models  # noqa: E402,F401  (the layer-dropped SmolLM2 joins the plugin)
from paretolab.plugins.routing.task import register_metrics, register_tasks  # noqa: E402,F401  (the task and its metrics join the plugin)
