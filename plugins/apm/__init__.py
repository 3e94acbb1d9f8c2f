"""APM's analog (seed 000) as ``paired_retrieval`` methods: each puts a pair learner on the subject; the task fits on its pairs.

``apm`` distils ``pairs`` synthetic pairs by analytic parameter matching (:mod:`.distill` says what is the
paper's and what is ours); ``mtt`` by a small trajectory-matching baseline (:mod:`.mtt`); ``random_pairs`` keeps as many real pairs drawn at random, ``full_data`` all
of them (the upper bound). The task (:mod:`paretolab.tasks.paired_retrieval`) fits the same closed-form
ridge projectors on whichever pairs and scores cross-modal recall@1 on generated two-view data: an
analog of the paper's image-text retrieval, not a reproduction of its numbers.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from optuna.distributions import FloatDistribution, IntDistribution

from paretolab import Method, Paper, TrialContext, hookimpl
from paretolab.errors import ConfigError
from paretolab.plugin_api.metrics import Metric
from paretolab.plugin_api.subject import Subject
from paretolab.plugins.apm.distill import APM, FullData, RandomPairs
from paretolab.plugins.apm.mtt import MTT

PAPER = Paper("Analytic Parameter Matching (APM) for multi-modal dataset distillation", "ICML 2026", "")


class _Pairs(Method):
    """A method that chooses the pairs the paired_retrieval subject's projectors are fitted on."""

    kind = "paired_retrieval"
    cost_is = "real"

    def search_space(self) -> dict[str, Any]:
        return {}

    def defaults(self) -> dict[str, Any]:
        return {}

    def learner(self, p: dict[str, Any]) -> Any:
        raise NotImplementedError

    def transform(self, subject: Subject, params: dict[str, Any], ctx: TrialContext) -> Subject:
        p = {**self.defaults(), **params}
        if "pairs" in p and int(p["pairs"]) < 1:
            raise ConfigError(f"{self.name}.pairs: got {p['pairs']!r}; give at least 1 synthetic pair (the paper's budgets are 100-1000)")
        subject.info["learner"] = self.learner(p)
        subject.info["learner_name"] = self.name
        return subject


class RandomPairsMethod(_Pairs):
    """``pairs`` real train pairs drawn at random (seeded): the budget-matched baseline."""

    name = "random_pairs"
    metrics = ("pairs_kept", "pairs_storage_floats", "match_loss")

    def search_space(self) -> dict[str, Any]:
        # seed: which pairs (and apm's init; trials of two methods pair on it)
        return {"seed": IntDistribution(0, 1000), "pairs": IntDistribution(1, 100000, log=True)}

    def defaults(self) -> dict[str, Any]:
        return {"pairs": 100}

    def learner(self, p: dict[str, Any]) -> Any:
        return RandomPairs(pairs=int(p["pairs"]), seed=None if p.get("seed") is None else int(p["seed"]))


class FullDataMethod(_Pairs):
    """All real train pairs: the upper bound."""

    name = "full_data"
    metrics = ("pairs_kept", "pairs_storage_floats")

    def search_space(self) -> dict[str, Any]:
        return {"seed": IntDistribution(0, 1000)}  # accepted so a grid pairs it with the others; nothing in it is random

    def learner(self, p: dict[str, Any]) -> Any:
        return FullData()


class APMMethod(RandomPairsMethod):
    """APM: ``pairs`` synthetic pairs from ``steps`` Adam steps matching their closed-form projectors to the teacher's."""

    name = "apm"
    paper = PAPER
    metrics = ("pairs_kept", "pairs_storage_floats", "distill_s", "distill_storage_floats", "match_loss_init", "match_loss",
               "traj_storage_floats_model")

    def search_space(self) -> dict[str, Any]:
        return {**super().search_space(), "steps": IntDistribution(0, 100000), "lr": FloatDistribution(1e-4, 1.0, log=True),
                "traj_epochs": IntDistribution(1, 10000), "threads": IntDistribution(0, 64)}

    def defaults(self) -> dict[str, Any]:
        return {**super().defaults(), "steps": 300, "lr": 0.02, "traj_epochs": 50, "threads": 1}

    def learner(self, p: dict[str, Any]) -> Any:
        return APM(pairs=int(p["pairs"]), seed=None if p.get("seed") is None else int(p["seed"]), steps=int(p["steps"]),
                   lr=float(p["lr"]), traj_epochs=int(p["traj_epochs"]), threads=int(p["threads"]))


class MTTMethod(RandomPairsMethod):
    """A small trajectory-matching baseline: ``pairs`` synthetic pairs whose unrolled gradient steps follow expert checkpoints."""

    name = "mtt"
    metrics = ("pairs_kept", "pairs_storage_floats", "distill_s", "distill_storage_floats", "match_loss")

    def search_space(self) -> dict[str, Any]:
        return {**super().search_space(), "steps": IntDistribution(0, 100000), "lr": FloatDistribution(1e-4, 1.0, log=True),
                "expert_epochs": IntDistribution(1, 10000), "unroll": IntDistribution(1, 1000), "span": IntDistribution(1, 1000),
                "threads": IntDistribution(0, 64)}

    def defaults(self) -> dict[str, Any]:
        return {**super().defaults(), "steps": 300, "lr": 0.02, "expert_epochs": 50, "unroll": 10, "span": 2, "threads": 1}

    def learner(self, p: dict[str, Any]) -> Any:
        if int(p["span"]) > int(p["expert_epochs"]):
            raise ConfigError(f"mtt.span: {p['span']} is past the {p['expert_epochs']} expert epochs; give span <= expert_epochs")
        return MTT(pairs=int(p["pairs"]), seed=None if p.get("seed") is None else int(p["seed"]), steps=int(p["steps"]), lr=float(p["lr"]),
                   expert_epochs=int(p["expert_epochs"]), unroll=int(p["unroll"]), span=int(p["span"]), threads=int(p["threads"]))


METRICS = (
    Metric("pairs_kept", "pairs", "minimize", "paired_retrieval: pairs the projectors were fitted on (synthetic or real)"),
    Metric("pairs_storage_floats", "floats", "minimize", "paired_retrieval: floats of the kept pairs (pairs x (dim_a + dim_b))"),
    Metric("distill_s", "s", "minimize", "apm, mtt: wall time of distillation (teacher matrices or expert trajectories + matching steps)"),
    Metric("distill_storage_floats", "floats", "minimize",
           "apm, mtt: floats distillation keeps of the real data (apm: Gram of A, Gram of B, cross-covariance; mtt: every expert checkpoint)", exact=True),
    Metric("match_loss_init", "rel. sq. Frobenius", "minimize", "apm: parameter-matching loss of the initial (random real) pairs"),
    Metric("match_loss", "rel. sq. Frobenius", "minimize", "apm, mtt, random_pairs: the pairs' closed-form projectors against the teacher's"),
    Metric("traj_storage_floats_model", "floats", "minimize",
           "apm: a stated model, not a measurement: what a trajectory-matching method keeps (traj_epochs x both projectors' parameters)"),
)


@hookimpl
def register_methods(register: Callable[[Method], None]) -> None:
    register(APMMethod())
    register(MTTMethod())
    register(RandomPairsMethod())
    register(FullDataMethod())


@hookimpl
def register_metrics(register: Callable[[Metric], None]) -> None:
    for metric in METRICS:
        register(metric)
