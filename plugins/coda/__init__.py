"""CoDA and its baseline as ``sequence`` methods: each puts a network on the sequence subject; the sequence task fits it.

``ltc`` is the continuous-depth baseline (a liquid time-constant network, its nonlinear ODE solved by
the fused step ``unfolds`` times per observation); ``coda`` replaces that layer by a GRU, one
``latent``-dimensional linear ODE solved exactly, and a dense readout (:mod:`.cells` says what is the
paper's and what is ours). Both train the same way on the same generated data
(:mod:`paretolab.tasks.sequence`); the task reports accuracy (or RMSE) with its interval and the
speed of a training step and of inference, each beside a reference LTC timed in the same rounds.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from optuna.distributions import FloatDistribution, IntDistribution

from paretolab import Method, Paper, TrialContext, hookimpl
from paretolab.plugin_api.metrics import Metric
from paretolab.plugin_api.subject import Subject
from paretolab.plugins.coda.learners import NetLearner


class _Sequence(Method):
    """A method that chooses the sequence subject's network."""

    kind = "sequence"
    cost_is = "real"
    metrics = ("epochs_run", "time_capped")
    arch = ""

    def search_space(self) -> dict[str, Any]:
        # seed: the network's init and data order (trials of two methods pair on it); max_s: wall-clock cap on training
        return {"seed": IntDistribution(0, 1000), "epochs": IntDistribution(1, 500), "batch": IntDistribution(8, 1024, log=True),
                "lr": FloatDistribution(1e-4, 0.1, log=True), "max_s": FloatDistribution(5.0, 3600.0),
                "timing_s": FloatDistribution(1.0, 120.0)}

    def defaults(self) -> dict[str, Any]:
        return {"epochs": 20, "batch": 64, "lr": 0.01}

    def transform(self, subject: Subject, params: dict[str, Any], ctx: TrialContext) -> Subject:
        p = {"seed": None, "max_s": 420.0, "timing_s": 20.0, **self.defaults(), **params}
        shape = {k: int(p[k]) for k in ("units", "unfolds", "latent") if k in p}
        subject.info["learner"] = NetLearner(arch=self.arch, epochs=int(p["epochs"]), batch=int(p["batch"]), lr=float(p["lr"]),
                                             seed=p["seed"], max_s=float(p["max_s"]), timing_s=float(p["timing_s"]), **shape)
        subject.info["learner_name"] = self.name
        return subject


class LTCMethod(_Sequence):
    """A liquid time-constant network: ``units`` neurons, fully connected synapses, ``unfolds`` fused ODE steps per observation."""

    name = "ltc"
    arch = "ltc"
    paper = Paper("Liquid Time-constant Networks (Hasani et al.)", "AAAI 2021", "https://arxiv.org/abs/2006.04439")

    def search_space(self) -> dict[str, Any]:
        return {**super().search_space(), "units": IntDistribution(4, 256, log=True), "unfolds": IntDistribution(1, 12)}

    def defaults(self) -> dict[str, Any]:
        return {**super().defaults(), "units": 32, "unfolds": 6}


class CoDAMethod(_Sequence):
    """CoDA: a GRU of ``units``, one ``latent``-dimensional linear ODE (exact solve) and a dense readout in place of the LTC layer."""

    name = "coda"
    arch = "coda"
    paper = Paper("Continuous Depth Acceleration (CoDA): continuous-depth layers replaced via Mori-Zwanzig/Koopman theory", "ICML 2026",
                  "https://github.com/ImpactLabASU/CoDA-ICML2026")

    def search_space(self) -> dict[str, Any]:
        return {**super().search_space(), "units": IntDistribution(4, 256, log=True), "latent": IntDistribution(1, 64, log=True)}

    def defaults(self) -> dict[str, Any]:
        return {**super().defaults(), "units": 32, "latent": 8}


@hookimpl
def register_methods(register: Callable[[Method], None]) -> None:
    register(LTCMethod())
    register(CoDAMethod())

