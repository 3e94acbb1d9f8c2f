"""TabPack and its baselines as ``tabular`` methods: each puts a learner on the tabular subject; the tabular task fits it.

``tabpack`` (the method: a pack of MLPs with sampled hyperparameters in one run, per-member early
stopping, greedy ensemble built online; see :mod:`.pack`), ``tuned_mlp`` (Optuna TPE over the same
MLP space, one model per trial, post-hoc greedy ensemble), ``hgb`` (scikit-learn
HistGradientBoosting) and ``tabm`` (TabM from the ``tabm`` package).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from optuna.distributions import FloatDistribution, IntDistribution

from paretolab import Method, Paper, TrialContext, hookimpl
from paretolab.plugin_api.metrics import Metric
from paretolab.plugin_api.subject import Subject
from paretolab.plugins.tabpack.learners import (
    HGBLearner,
    TabMLearner,
    TabPackLearner,
    TunedMLPLearner,
)


class _Tabular(Method):
    """A method that chooses the tabular subject's learner."""

    kind = "tabular"
    cost_is = "real"

    def learner(self, params: dict[str, Any]) -> Any:
        raise NotImplementedError

    def search_space(self) -> dict[str, Any]:
        # seed: the learner's seed (trials of two learners pair on it); max_s: wall-clock cap on the fit
        return {"seed": IntDistribution(0, 1000), "max_s": FloatDistribution(10.0, 3600.0)}

    def transform(self, subject: Subject, params: dict[str, Any], ctx: TrialContext) -> Subject:
        subject.info["learner"] = self.learner({"seed": None, "max_s": 420.0, **self.defaults(), **params})
        subject.info["learner_name"] = self.name
        return subject


class TabPack(_Tabular):
    """TabPack: ``members`` sampled MLPs trained as one pack; members stop on their own; greedy ensemble online."""

    name = "tabpack"
    metrics = ("epochs_run", "time_capped")
    paper = Paper("TabPack: packing many tabular models into one run (yandex-research/tabpack)", "ICML 2026", "https://github.com/yandex-research/tabpack")

    def search_space(self) -> dict[str, Any]:
        return {**super().search_space(), "members": IntDistribution(2, 64), "patience": IntDistribution(1, 16), "epochs": IntDistribution(1, 200)}

    def defaults(self) -> dict[str, Any]:
        return {"members": 16, "patience": 4, "epochs": 20}

    def learner(self, params: dict[str, Any]) -> Any:
        return TabPackLearner(seed=params["seed"], max_s=float(params["max_s"]), members=int(params["members"]), epochs=int(params["epochs"]), patience=int(params["patience"]))


class TunedMLP(_Tabular):
    """An MLP tuned by Optuna TPE (``trials`` models, each early-stopped) with a post-hoc greedy ensemble over the trials."""

    name = "tuned_mlp"
    metrics = ("time_capped",)
    paper = Paper("Ensemble selection from libraries of models (Caruana et al.) over an Optuna-tuned MLP", "ICML 2004 / KDD 2019")

    def search_space(self) -> dict[str, Any]:
        return {**super().search_space(), "trials": IntDistribution(1, 128), "patience": IntDistribution(1, 16), "epochs": IntDistribution(1, 200)}

    def defaults(self) -> dict[str, Any]:
        return {"trials": 32, "patience": 4, "epochs": 20}

    def learner(self, params: dict[str, Any]) -> Any:
        return TunedMLPLearner(seed=params["seed"], max_s=float(params["max_s"]), trials=int(params["trials"]), epochs=int(params["epochs"]), patience=int(params["patience"]))


class HGB(_Tabular):
    """scikit-learn HistGradientBoosting, early-stopped on the validation split."""

    name = "hgb"
    metrics = ("hgb_iters",)
    paper = Paper("scikit-learn HistGradientBoosting (LightGBM-style histogram GBDT)")

    def search_space(self) -> dict[str, Any]:
        return {**super().search_space(), "max_iter": IntDistribution(10, 2000, log=True)}

    def defaults(self) -> dict[str, Any]:
        return {"max_iter": 500}

    def learner(self, params: dict[str, Any]) -> Any:
        return HGBLearner(seed=params["seed"], max_iter=int(params["max_iter"]))


class TabM(_Tabular):
    """TabM (``tabm`` 0.0.3): one MLP with ``k`` weight-sharing heads (BatchEnsemble), early-stopped on validation."""

    name = "tabm"
    metrics = ("time_capped",)
    paper = Paper("TabM: Advancing Tabular Deep Learning with Parameter-Efficient Ensembling", "ICLR 2025", "https://arxiv.org/abs/2410.24210")
    requires = ("tabm",)

    def search_space(self) -> dict[str, Any]:
        return {**super().search_space(), "k": IntDistribution(2, 64), "patience": IntDistribution(1, 16), "epochs": IntDistribution(1, 200)}

    def defaults(self) -> dict[str, Any]:
        return {"k": 16, "patience": 4, "epochs": 20}

    def learner(self, params: dict[str, Any]) -> Any:
        return TabMLearner(seed=params["seed"], max_s=float(params["max_s"]), k=int(params["k"]), epochs=int(params["epochs"]), patience=int(params["patience"]))


METRICS = (
    Metric("epochs_run", "epochs", "minimize", "tabpack: epochs until every member had stopped (or the epoch cap)"),
    Metric("time_capped", "flag", "minimize", "tabular: 1 when the fit's wall-clock cap (max_s) ended training early (compute then counts what ran)"),
    Metric("hgb_iters", "trees", "minimize", "hgb: boosting iterations kept by early stopping"),
)


@hookimpl
def register_metrics(register: Callable[[Metric], None]) -> None:
    for metric in METRICS:
        register(metric)


@hookimpl
def register_methods(register: Callable[[Method], None]) -> None:
    for method in (TabPack(), TunedMLP(), HGB(), TabM()):
        register(method)
