"""The ``mc_routing`` task: multiple-choice questions answered by the pipeline's role models under a routing policy.

Each role model's answers are recorded once (:mod:`paretolab.plugins.routing.answers`) and replayed;
the questions are split (seeded by the routing method's ``split``) into a calibration half the
policy fits on and a test half it is scored on. A trial reports its policy's point (accuracy and
cost per question at its own knob), the area under its cost-accuracy curve over the knob's sweep
(``route_auc``), and against the full stacking ensemble on the same test half its accuracy
retention, speed-up and the speed-up at >= 97 % retention (threshold chosen on calibration).
Costs are replayed from the recording: ``route_gflops`` is an estimate (2 x parameters x tokens),
``route_s`` the seconds measured while recording; both are marked so in the trial's info.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from paretolab.plugin_api.context import TrialContext
from paretolab.plugin_api.hookspec import hookimpl
from paretolab.plugin_api.metrics import Metric
from paretolab.plugin_api.options import option
from paretolab.plugin_api.subject import Subject
from paretolab.plugins.routing.answers import (
    as_arrays,
    golds,
    load_or_record_answers,
    load_questions,
)
from paretolab.plugins.routing.bed import Bed, Outcome
from paretolab.plugins.routing.policies import Fixed, LazyStack, Policy, Stack
from paretolab.stats import ARTIFACT, mean_with_stderr, per_example_json
from paretolab.tasks.base import Task

RETENTION = 0.97  # LazyStack's claim: speed-up at >= 97 % of the full ensemble's accuracy
AUC_POINTS = 50


@dataclass(frozen=True)
class RoutingOptions:
    datasets: str = "arc_easy,piqa,openbook_qa"  # comma-separated query/choices/gold sets under <data>/mc, or `builtin`
    limit: int = option(200, low=0)  # questions per set (the first ones; 0 = all)
    calib_frac: float = option(0.5, low=0.1, high=0.9)  # share of the questions the policy fits on
    score: str = option("norm", one_of=("norm", "raw"))  # choice scores: log-likelihood per character (acc_norm) or summed
    cost: str = option("gflops", one_of=("gflops", "seconds"))  # what a route costs: estimated FLOPs, or recorded seconds


class MCRouting(Task):
    name = "mc_routing"
    metrics = ("acc", "acc_stderr", "n_examples", "route_gflops", "route_s", "route_tokens", "deferred_frac", "models_per_q",
               "route_auc", "full_acc", "retention", "speedup", "speedup_at_97", "retention_at_97")
    options = RoutingOptions

    def evaluate(self, subject: Subject, options: RoutingOptions, ctx: TrialContext) -> dict[str, float]:
        roles = dict(ctx.models) or {"small": subject}  # no `models:`: the subject, as the stages left it, answers alone
        questions = load_questions([d.strip() for d in options.datasets.split(",") if d.strip()], options.limit)
        data, replayed = {}, {}
        for role, model in roles.items():
            answers, cached = load_or_record_answers(model, questions, shared=bool(ctx.models))
            data[role], replayed[role] = as_arrays(answers, options.score == "norm"), cached
        bed = Bed(list(roles), data, golds(questions), [q.context for q in questions], options.cost)
        policy: Policy = subject.router if subject.router is not None else Fixed(role=bed.small)
        calib, test = bed.split(options.calib_frac, policy.seed)
        policy.fit(calib)
        out = policy.route(test)
        hits = out.hits(test)
        ctx.add_artifact(ARTIFACT, per_example_json("example", {"acc": hits}))
        for j, role in enumerate(test.roles):  # routed costs are read from the recording: replayed
            ran = out.ran[:, j]
            ctx.costs.add(role, calls=int(ran.sum()), tokens=int(test.data[role]["tokens"][ran].sum()),
                          seconds=float(test.data[role]["seconds"][ran].sum()), replayed=True)
        subject.info["route_costs_are"] = "replayed from recorded answers" + ("" if all(replayed.values()) else " (recorded in this trial)")
        subject.info["route_gflops_is"] = "estimated: 2 x parameters x tokens"
        subject.info["route_roles"] = ",".join(test.roles)
        metrics = {**mean_with_stderr("acc", hits), "n_examples": float(len(test)),
                   "route_gflops": out.cost(test, "gflops"), "route_s": out.cost(test, "seconds"), "route_tokens": out.cost(test, "tokens"),
                   "deferred_frac": float(np.mean(out.ran[:, 1:].any(1))), "models_per_q": float(out.ran.sum(1).mean())}
        metrics["route_auc"] = route_auc(policy, test, bed_floor(test))
        metrics.update(against_full(policy, calib, test, out))
        return metrics


def bed_floor(test: Bed) -> tuple[float, float, float]:
    """The cost range of the AUC, from the small model alone to the most expensive single model, and the small model's accuracy."""
    costs = [float(np.mean(test.cost(r))) for r in test.roles]
    return costs[0], max(costs), float(test.correct(test.small).mean())


def route_auc(policy: Policy, test: Bed, floor: tuple[float, float, float]) -> float:
    """Mean over a cost grid (small-only .. the dearest single model) of the best test accuracy the policy's sweep reaches
    at or below that cost (the small model's accuracy where it reaches none): its frontier's area, normalised."""
    low, high, floor_acc = floor
    knob = policy.knob
    points = []
    for value in policy.grid():
        policy.knob = value
        out = policy.route(test)
        points.append((out.cost(test), out.acc(test)))
    policy.knob = knob
    grid = np.linspace(low, high, AUC_POINTS)
    return float(np.mean([max([a for c, a in points if c <= x + 1e-12], default=floor_acc) for x in grid]))


def against_full(policy: Policy, calib: Bed, test: Bed, out: Outcome) -> dict[str, float]:
    """Accuracy retention and speed-up against the full stacking ensemble on the same test half; for a LazyStack
    policy also the speed-up at >= 97 % retention with the (order, threshold) picked on calibration."""
    full = Stack()
    full.fit(calib)
    reference = full.route(test)
    full_acc, full_cost = reference.acc(test), reference.cost(test)
    metrics = {"full_acc": full_acc, "retention": out.acc(test) / full_acc if full_acc else 0.0,
               "speedup": full_cost / max(out.cost(test), 1e-12)}
    if isinstance(policy, LazyStack):
        order, threshold = policy.at_retention(calib, RETENTION, full.route(calib).acc(calib))
        at = policy.cascade(test, order, threshold)
        metrics["speedup_at_97"] = full_cost / max(at.cost(test), 1e-12)
        metrics["retention_at_97"] = at.acc(test) / full_acc if full_acc else 0.0
    return metrics


@hookimpl
def register_tasks(register: Callable[[Task], None]) -> None:
    register(MCRouting())


@hookimpl
def register_metrics(register: Callable[[Metric], None]) -> None:
    est = "estimated (2 x parameters x tokens), replayed from recorded answers"
    for metric in (
        Metric("route_gflops", "GFLOP/question", "minimize", f"compute per test question of the models a route ran: {est}", estimated=True),
        Metric("route_s", "s/question", "minimize", "seconds per test question of the models a route ran, measured while recording: replayed"),
        Metric("route_tokens", "tokens/question", "minimize", "tokens per test question the routed models processed (replayed)"),
        Metric("deferred_frac", "fraction", "minimize", "share of test questions answered by a model other than the small one"),
        Metric("models_per_q", "models", "minimize", "models run per test question"),
        Metric("route_auc", "accuracy", "maximize", "area under the policy's cost-accuracy curve over its knob, cost from small-only to the dearest single model"),
        Metric("full_acc", "fraction", "maximize", "test accuracy of the full stacking ensemble (the reference of retention and speedup)"),
        Metric("retention", "fraction", "maximize", "test accuracy over the full stacking ensemble's"),
        Metric("speedup", "x", "maximize", "the full stacking ensemble's cost over this route's"),
        Metric("speedup_at_97", "x", "maximize", "speed-up over the full ensemble at the cheapest (order, threshold) keeping >= 97 % of its calibration accuracy"),
        Metric("retention_at_97", "fraction", "maximize", "test accuracy retention at that (order, threshold)"),
    ):
        register(metric)
