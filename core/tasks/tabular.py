"""Tabular learning: a subject without a tokenizer, data sets that ship with scikit-learn or are generated, and metrics.

The learner comes from a ``tabular`` method stage (``subject.info["learner"]``: TabPack, a tuned MLP,
HistGradientBoosting, TabM): ``fit_predict(data, seed, device)`` trains on the train split, chooses
whatever it chooses on the validation split, and returns test predictions and its compute
(:class:`Fit`). The task scores the test split: accuracy and log-loss for classification, RMSE
(in the target's units) for regression, and reports the compute every learner counts the same way.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from paretolab.errors import ConfigError
from paretolab.models import ModelSource
from paretolab.plugin_api.context import TrialContext
from paretolab.plugin_api.hookspec import hookimpl
from paretolab.plugin_api.metrics import Metric
from paretolab.plugin_api.options import option
from paretolab.plugin_api.subject import Subject
from paretolab.stats import ARTIFACT, Samples, bootstrap_interval, per_example_json
from paretolab.tasks.base import Task

# name: (kind, loader). Synthetic sets are seeded (data seed 0) and take the task's ``rows``.
DATASETS = ("synth-class", "synth-reg", "breast-cancer", "digits", "wine", "diabetes")
SPLIT_SEED = 0  # one fixed split for every trial: learners differ, the data does not


@dataclass(frozen=True)
class TabularOptions:
    dataset: str = option("synth-class", one_of=DATASETS)  # synth-class/-reg: generated (rows); the rest ship with scikit-learn
    rows: int = option(50000, low=100)  # rows of a synthetic set (bundled sets keep their size)
    val_frac: float = option(0.16, low=0.05, high=0.4)  # share of rows for validation (early stopping, ensemble selection)
    test_frac: float = option(0.2, low=0.05, high=0.4)  # share of rows held out for the reported metrics


@dataclass
class TabularData:
    """Standardised features and targets of the three splits; regression targets standardised (``y_scale`` undoes it)."""

    x: dict[str, np.ndarray]
    y: dict[str, np.ndarray]
    n_classes: int  # 0 for regression
    y_mean: float = 0.0
    y_scale: float = 1.0

    @property
    def regression(self) -> bool:
        return self.n_classes == 0


@dataclass
class Fit:
    """What a learner returns: test predictions (class probabilities, or standardised regression values) and its compute."""

    test_pred: np.ndarray
    fit_flops: float | None  # None where FLOPs mean nothing (tree boosting): the row then has train_cpu_s only
    models_trained: int
    ensemble_size: int
    extra: dict[str, float] = field(default_factory=dict)


def load_tabular(options: TabularOptions) -> TabularData:
    """The data set, split (fixed seed) and standardised on the train split."""
    from sklearn import datasets

    name = options.dataset
    if name == "synth-class":
        x, y = datasets.make_classification(n_samples=options.rows, n_features=20, n_informative=10, n_redundant=4, n_classes=3,
                                            n_clusters_per_class=2, class_sep=0.8, flip_y=0.02, random_state=0)
    elif name == "synth-reg":
        x, y = datasets.make_friedman1(n_samples=options.rows, n_features=10, noise=1.0, random_state=0)
    elif name in ("breast-cancer", "digits", "wine", "diabetes"):
        loader = {"breast-cancer": datasets.load_breast_cancer, "digits": datasets.load_digits, "wine": datasets.load_wine, "diabetes": datasets.load_diabetes}[name]
        x, y = loader(return_X_y=True)
    else:
        raise ConfigError(f"task.dataset: expected one of {', '.join(DATASETS)}, got {name!r}")
    regression = name in ("synth-reg", "diabetes")
    order = np.random.default_rng(SPLIT_SEED).permutation(len(x))
    n_test, n_val = int(len(x) * options.test_frac), int(len(x) * options.val_frac)
    parts = {"test": order[:n_test], "val": order[n_test : n_test + n_val], "train": order[n_test + n_val :]}
    mean, std = x[parts["train"]].mean(0), x[parts["train"]].std(0) + 1e-8
    xs = {k: ((x[i] - mean) / std).astype(np.float32) for k, i in parts.items()}
    if regression:
        y_mean, y_scale = float(y[parts["train"]].mean()), float(y[parts["train"]].std() + 1e-8)
        ys = {k: ((y[i] - y_mean) / y_scale).astype(np.float32) for k, i in parts.items()}
        return TabularData(xs, ys, 0, y_mean, y_scale)
    return TabularData(xs, {k: y[i].astype(np.int64) for k, i in parts.items()}, int(y.max()) + 1)


class LearnerTask(Task):
    """Fit the subject's learner (put there by a method stage) on a data set and score its test predictions."""

    metrics = ("acc", "log_loss", "log_loss_ci_low", "log_loss_ci_high", "rmse", "rmse_ci_low", "rmse_ci_high",
               "fit_flops", "train_cpu_s", "fit_s", "models_trained", "ensemble_size")
    learners = ""  # the methods that put a learner on the subject, for the error message

    def load(self, options: Any) -> TabularData:
        raise NotImplementedError

    def evaluate(self, subject: Subject, options: Any, ctx: TrialContext) -> dict[str, float]:
        import time

        learner = subject.info.get("learner")
        if learner is None:
            raise ConfigError(f"task {self.name}: no learner; add a {self.name} stage (method {self.learners})")
        data = self.load(options)
        cpu0, wall0 = time.process_time(), time.perf_counter()
        fit = learner.fit_predict(data, seed=ctx.seed, device=subject.device)
        metrics = {"train_cpu_s": time.process_time() - cpu0, "fit_s": time.perf_counter() - wall0,
                   "models_trained": float(fit.models_trained), "ensemble_size": float(fit.ensemble_size), **fit.extra}
        if fit.fit_flops is not None:
            metrics["fit_flops"] = float(fit.fit_flops)
        return {**metrics, **score_fit(data, fit, ctx)}


class Tabular(LearnerTask):
    """Fit the subject's learner on a tabular data set and score its test predictions."""

    name = "tabular"
    options = TabularOptions
    learners = "tabpack, tuned_mlp, hgb or tabm"

    def load(self, options: TabularOptions) -> TabularData:
        return load_tabular(options)


def score_fit(data: TabularData, fit: Fit, ctx: TrialContext) -> dict[str, float]:
    """Test scores of a learner's predictions, with 95 % bootstrap intervals over the test rows (or sequences):
    RMSE in the target's units for regression, accuracy and log-loss for classification; the per-row losses as the artifact."""
    metrics: dict[str, float] = {}
    y = data.y["test"]
    if data.regression:
        err = ((fit.test_pred.reshape(-1) - y) * data.y_scale) ** 2
        metrics["rmse"] = float(np.sqrt(err.mean()))
        low, high = bootstrap_interval(Samples(err, np.ones_like(err), False, "row", root=True))
        metrics["rmse_ci_low"], metrics["rmse_ci_high"] = low, high
        ctx.add_artifact(ARTIFACT, per_example_json("row", {"sq_err": err.tolist()}))
        return metrics
    prob = np.clip(fit.test_pred, 1e-12, 1.0)
    nll = -np.log(prob[np.arange(len(y)), y])
    metrics["acc"] = float((prob.argmax(1) == y).mean())
    metrics["log_loss"] = float(nll.mean())
    low, high = bootstrap_interval(Samples(nll, np.ones_like(nll), False, "row"))
    metrics["log_loss_ci_low"], metrics["log_loss_ci_high"] = float(low), float(high)
    ctx.add_artifact(ARTIFACT, per_example_json("row", {"log_loss": nll.tolist(), "acc": (prob.argmax(1) == y).astype(float).tolist()}))
    return metrics


class TabularSlot(torch.nn.Module):
    """The model of a learner subject (tabular, sequence) before a learner fits: nothing yet (one empty parameter gives it a device)."""

    def __init__(self, task: str = "tabular") -> None:
        super().__init__()
        self.task = task
        self.anchor = torch.nn.Parameter(torch.zeros(0, device="cpu"), requires_grad=False)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(f"a {self.task} subject has no language model; use the {self.task} task")


class TabularSource(ModelSource):
    """``tabular``: a subject with no tokenizer and no weights; a tabular method puts a learner on it."""

    name = "tabular"
    description = "no language model: a slot for a tabular learner (tabpack, tuned_mlp, hgb, tabm) and the tabular task"
    weights = "none (the learner trains in the task)"

    def load(self) -> Subject:
        return Subject(model=TabularSlot(), tokenizer=None, model_name=self.name)


METRICS = (
    Metric("log_loss", "nats", "minimize", "tabular classification: mean test log-loss of the predicted class probabilities"),
    Metric("log_loss_ci_low", "nats", "minimize", "lower end of the 95% bootstrap interval of log_loss over test rows"),
    Metric("log_loss_ci_high", "nats", "minimize", "upper end of the 95% bootstrap interval of log_loss over test rows"),
    Metric("rmse", "target units", "minimize", "tabular regression: test root mean squared error"),
    Metric("rmse_ci_low", "target units", "minimize", "lower end of the 95% bootstrap interval of rmse over test rows"),
    Metric("rmse_ci_high", "target units", "minimize", "upper end of the 95% bootstrap interval of rmse over test rows"),
    Metric("fit_flops", "FLOPs", "minimize", "tabular: training + evaluation FLOPs of every model trained (tuning trials included), as run (padded pack widths counted)"),
    Metric("train_cpu_s", "CPU s", "minimize", "tabular: process CPU seconds (all threads) to fit, tuning and ensembling included"),
    Metric("fit_s", "s", "minimize", "tabular: wall time to fit, tuning and ensembling included"),
    Metric("models_trained", "models", "minimize", "tabular: models trained to get the predictions (pack members, tuning trials, TabM heads count as one)"),
    Metric("ensemble_size", "models", "minimize", "tabular: distinct models in the final (greedy) ensemble"),
)


@hookimpl
def register_tasks(register: Callable[[Task], None]) -> None:
    register(Tabular())


@hookimpl
def register_models(register: Callable[[ModelSource], None]) -> None:
    register(TabularSource())


@hookimpl
def register_metrics(register: Callable[[Metric], None]) -> None:
    for metric in METRICS:
        register(metric)
