"""Time-series learning: a subject without a tokenizer, seeded dynamical-system data sets, and a learner fit per trial.

The counterpart of :mod:`paretolab.tasks.tabular` for sequences (continuous-depth networks such as
LTC and their CoDA replacement, :mod:`paretolab.plugins.coda`): a ``sequence`` method stage puts a
learner on the subject; this task generates the data, fits the learner and scores the test split
the same way (accuracy and log-loss for classification, RMSE for regression, 95 % bootstrap
intervals over test sequences, the per-sequence losses stored for the claims).

The data are generated here (no time-series set ships with this machine), seeded (data seed 0, one
fixed split), integrated with RK4 at four sub-steps per observation; both are stand-ins for the LTC
papers' real-world series, said so in every report:

- ``regimes`` (classification, like activity or gesture recognition): the noisy position and velocity of a
  Van der Pol oscillator ``x'' - mu (1 - x^2) w x' + w^2 x = 0``; the class is ``mu`` in {0.5, 1, 1.5, 2}, the
  frequency ``w`` ~ U(0.8, 1.2) and the start ~ U(-2, 2)^2 are nuisances; two features per step.
- ``duffing`` (regression, like kinematics forecasting): a forced Duffing oscillator
  ``x'' + d x' - x + x^3 = g cos(1.2 t)`` with ``d`` ~ U(0.1, 0.3), ``g`` ~ U(0.2, 0.5); inputs the noisy
  position and the forcing, target the clean position ``horizon`` steps past the last input.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from paretolab.errors import ConfigError
from paretolab.models import ModelSource
from paretolab.plugin_api.hookspec import hookimpl
from paretolab.plugin_api.metrics import Metric
from paretolab.plugin_api.options import option
from paretolab.plugin_api.subject import Subject
from paretolab.tasks.base import Task
from paretolab.tasks.tabular import SPLIT_SEED, LearnerTask, TabularData, TabularSlot

DATASETS = ("regimes", "duffing")
DT = 0.15  # time between observations
SUBSTEPS = 4  # RK4 steps per observation
REGIME_MU = (0.5, 1.0, 1.5, 2.0)


@dataclass(frozen=True)
class SequenceOptions:
    dataset: str = option("regimes", one_of=DATASETS)  # regimes: 4-class Van der Pol; duffing: forecast `horizon` steps ahead
    sequences: int = option(2400, low=50)  # sequences generated (split into train/val/test)
    length: int = option(48, low=4, high=4096)  # observations per sequence
    noise: float = option(0.2, low=0.0, high=2.0)  # observation noise (standard deviation, in the state's units)
    horizon: int = option(5, low=1, high=100)  # duffing: steps past the last input that the target lies
    val_frac: float = option(0.16, low=0.05, high=0.4)
    test_frac: float = option(0.2, low=0.05, high=0.4)


def _rk4(f: Callable[[np.ndarray, float], np.ndarray], state: np.ndarray, steps: int) -> np.ndarray:
    """States after each of ``steps`` observations (RK4 at SUBSTEPS per observation), shape (steps, *state.shape)."""
    out, h, t = np.empty((steps, *state.shape)), DT / SUBSTEPS, 0.0
    for i in range(steps):
        for _ in range(SUBSTEPS):
            k1 = f(state, t)
            k2 = f(state + h / 2 * k1, t + h / 2)
            k3 = f(state + h / 2 * k2, t + h / 2)
            k4 = f(state + h * k3, t + h)
            state, t = state + h / 6 * (k1 + 2 * k2 + 2 * k3 + k4), t + h
        out[i] = state
    return out


def generate(options: SequenceOptions) -> tuple[np.ndarray, np.ndarray, int]:
    """Inputs (sequences, length, features), targets (class ids or values) and the number of classes (0: regression)."""
    rng = np.random.default_rng(0)
    n = options.sequences
    start = rng.uniform(-2.0, 2.0, size=(2, n))
    if options.dataset == "regimes":
        label = rng.integers(0, len(REGIME_MU), size=n)
        mu, w = np.asarray(REGIME_MU)[label], rng.uniform(0.8, 1.2, size=n)
        states = _rk4(lambda s, t: np.stack([s[1], mu * (1 - s[0] ** 2) * w * s[1] - w**2 * s[0]]), start, options.length)
        x = states.transpose(2, 0, 1) + options.noise * rng.standard_normal((n, options.length, 2))
        return x.astype(np.float32), label.astype(np.int64), len(REGIME_MU)
    if options.dataset == "duffing":
        damp, force = rng.uniform(0.1, 0.3, size=n), rng.uniform(0.2, 0.5, size=n)
        states = _rk4(lambda s, t: np.stack([s[1], -damp * s[1] + s[0] - s[0] ** 3 + force * np.cos(1.2 * t)]), start,
                      options.length + options.horizon)
        seen = states[: options.length, 0].T + options.noise * rng.standard_normal((n, options.length))
        drive = np.broadcast_to(np.cos(1.2 * DT * np.arange(1, options.length + 1)), (n, options.length))
        return np.stack([seen, drive], axis=-1).astype(np.float32), states[-1, 0].astype(np.float32), 0
    raise ConfigError(f"task.dataset: expected one of {', '.join(DATASETS)}, got {options.dataset!r}")


def load_sequences(options: SequenceOptions) -> TabularData:
    """The generated set, split (fixed seed) and standardised per feature on the train split (targets too, for regression)."""
    x, y, classes = generate(options)
    order = np.random.default_rng(SPLIT_SEED).permutation(len(x))
    n_test, n_val = int(len(x) * options.test_frac), int(len(x) * options.val_frac)
    parts = {"test": order[:n_test], "val": order[n_test : n_test + n_val], "train": order[n_test + n_val :]}
    if min(len(p) for p in parts.values()) < 1:
        raise ConfigError(f"task.sequences: {options.sequences} sequences leave a split empty; give at least 50")
    train = x[parts["train"]].reshape(-1, x.shape[-1])
    mean, std = train.mean(0), train.std(0) + 1e-8
    xs = {k: ((x[i] - mean) / std).astype(np.float32) for k, i in parts.items()}
    if classes == 0:
        y_mean, y_scale = float(y[parts["train"]].mean()), float(y[parts["train"]].std() + 1e-8)
        return TabularData(xs, {k: ((y[i] - y_mean) / y_scale).astype(np.float32) for k, i in parts.items()}, 0, y_mean, y_scale)
    return TabularData(xs, {k: y[i] for k, i in parts.items()}, classes)


class SequenceTask(LearnerTask):
    """Fit the subject's sequence learner on a generated time-series set and score its test predictions."""

    name = "sequence"
    metrics = (*LearnerTask.metrics, "train_step_ms", "infer_ms", "train_speedup", "infer_speedup")
    options = SequenceOptions
    learners = "ltc or coda"

    def load(self, options: SequenceOptions) -> TabularData:
        return load_sequences(options)


class SequenceSource(ModelSource):
    """``sequence``: a subject with no tokenizer and no weights; a sequence method puts a learner on it."""

    name = "sequence"
    description = "no language model: a slot for a time-series learner (ltc, coda) and the sequence task"
    weights = "none (the learner trains in the task)"

    def load(self) -> Subject:
        return Subject(model=TabularSlot("sequence"), tokenizer=None, model_name=self.name)


METRICS = (
    Metric("train_step_ms", "ms", "minimize", "sequence: median wall time of one training step (forward + backward + Adam) on one batch, warm"),
    Metric("infer_ms", "ms", "minimize", "sequence: median wall time of a forward over the whole test split, warm"),
    Metric("train_speedup", "x", "maximize", "sequence: an LTC's training step time over this learner's, paired rounds in the same process (LTC: ~1)"),
    Metric("infer_speedup", "x", "maximize", "sequence: an LTC's test-split forward time over this learner's, paired rounds in the same process"),
)


@hookimpl
def register_tasks(register: Callable[[Task], None]) -> None:
    register(SequenceTask())


@hookimpl
def register_models(register: Callable[[ModelSource], None]) -> None:
    register(SequenceSource())


@hookimpl
def register_metrics(register: Callable[[Metric], None]) -> None:
    for metric in METRICS:
        register(metric)
