"""Cross-modal retrieval from ridge projectors fitted on a few pairs: the subject, the generated paired data, the scores.

The analog of multi-modal dataset distillation (MDD, :mod:`paretolab.plugins.apm`): no image-text set
ships with this machine, so the pairs are generated, seeded (data seed 0, one fixed split) and said so
in every report. A latent ``z`` (``latent`` dims) is drawn from a mixture of ``classes`` Gaussians; view
A ("image", ``dim_a`` dims) and view B ("text", ``dim_b`` dims) are ``tanh(z R1) R2 + noise`` through two
fixed random nonlinear maps. A method stage puts a learner on the subject; its ``fit_pairs(data, seed,
device)`` returns the pairs the student is fitted on (distilled, sampled, or all of train) and its costs.

The student is ours, standing in for the paper's modal projectors: two closed-form ridge projectors,
``W_AB = (XᵀX/n + ridge I)⁻¹ XᵀY/n`` and the reverse, fitted on the method's pairs. Retrieval on the test
split by cosine in the target view's space: ``tr_at_1`` an A query finds its own B (A projected by W_AB),
``ir_at_1`` a B query finds its own A (B projected by W_BA), ``r_at_1`` their mean; per-query hits stored.
"""

from __future__ import annotations

import time
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
from paretolab.stats import ARTIFACT, per_example_json
from paretolab.tasks.base import Task
from paretolab.tasks.tabular import SPLIT_SEED, TabularSlot

NAME = "paired_retrieval"


@dataclass(frozen=True)
class PairedOptions:
    train: int = option(8000, low=10)  # real train pairs
    test: int = option(1000, low=10)  # test pairs (the retrieval gallery)
    latent: int = option(16, low=1, high=512)  # dims of the shared latent z
    classes: int = option(10, low=1, high=1000)  # mixture components of z
    dim_a: int = option(64, low=1, high=4096)  # view A ("image") dims
    dim_b: int = option(48, low=1, high=4096)  # view B ("text") dims
    noise: float = option(0.5, low=0.0, high=10.0)  # view noise (standard deviation, per dim)
    ridge: float = option(0.1, low=1e-6, high=1e3)  # the projectors' ridge, on the Gram normalised by the pair count


@dataclass
class PairedData:
    """Views of the two splits, standardised per dim on train; ``ridge`` is the student's regulariser."""

    a: dict[str, np.ndarray]
    b: dict[str, np.ndarray]
    ridge: float


@dataclass
class Pairs:
    """What a learner returns: the pairs the student is fitted on (on the subject's device) and its costs."""

    a: torch.Tensor
    b: torch.Tensor
    extra: dict[str, float] = field(default_factory=dict)


def _view(z: np.ndarray, dim: int, rng: np.random.Generator, noise: float) -> np.ndarray:
    hidden = 2 * z.shape[1]
    r1 = rng.standard_normal((z.shape[1], hidden)) / np.sqrt(z.shape[1])
    r2 = rng.standard_normal((hidden, dim)) / np.sqrt(hidden)
    return np.tanh(z @ r1) @ r2 + noise * rng.standard_normal((len(z), dim))


def generate(options: PairedOptions) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Views A (n, dim_a), B (n, dim_b) and the class of each pair, n = train + test; data seed 0."""
    rng = np.random.default_rng(0)
    n = options.train + options.test
    centres = 1.5 * rng.standard_normal((options.classes, options.latent))
    label = rng.integers(0, options.classes, size=n)
    z = centres[label] + rng.standard_normal((n, options.latent))
    a = _view(z, options.dim_a, rng, options.noise)
    b = _view(z, options.dim_b, rng, options.noise)
    return a.astype(np.float32), b.astype(np.float32), label


def load_paired(options: PairedOptions) -> PairedData:
    """The generated pairs, split (fixed seed) and standardised per dim on the train split."""
    a, b, _ = generate(options)
    order = np.random.default_rng(SPLIT_SEED).permutation(len(a))
    parts = {"test": order[: options.test], "train": order[options.test :]}
    out = {}
    for name, view in (("a", a), ("b", b)):
        mean, std = view[parts["train"]].mean(0), view[parts["train"]].std(0) + 1e-8
        out[name] = {k: ((view[i] - mean) / std).astype(np.float32) for k, i in parts.items()}
    return PairedData(out["a"], out["b"], options.ridge)


def moments(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The two matrices a ridge projector x -> y needs: the Gram XᵀX/n and the cross-covariance XᵀY/n."""
    return x.T @ x / len(x), x.T @ y / len(x)


def ridge_from_moments(gram: torch.Tensor, cross: torch.Tensor, ridge: float) -> torch.Tensor:
    """The closed-form projector (gram + ridge I)⁻¹ cross; differentiable in both matrices."""
    eye = torch.eye(len(gram), dtype=gram.dtype, device=gram.device)
    return torch.linalg.solve(gram + ridge * eye, cross)


def projectors(a: torch.Tensor, b: torch.Tensor, ridge: float) -> tuple[torch.Tensor, torch.Tensor]:
    """W_AB and W_BA fitted on the pairs (a, b)."""
    return ridge_from_moments(*moments(a, b), ridge), ridge_from_moments(*moments(b, a), ridge)


def hits_at_1(query: torch.Tensor, gallery: torch.Tensor) -> torch.Tensor:
    """1.0 where query i's nearest gallery row by cosine is row i (ties count against it unless i is first)."""
    q = torch.nn.functional.normalize(query, dim=1)
    g = torch.nn.functional.normalize(gallery, dim=1)
    return (torch.argmax(q @ g.T, dim=1) == torch.arange(len(q), device=q.device)).to(torch.float64)


def retrieval_scores(w_ab: torch.Tensor, w_ba: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> dict[str, torch.Tensor]:
    """Per-query hits: tr (A query -> its B, in B's space) and ir (B query -> its A, in A's space), and their mean r."""
    tr, ir = hits_at_1(a @ w_ab, b), hits_at_1(b @ w_ba, a)
    return {"tr_at_1": tr, "ir_at_1": ir, "r_at_1": (tr + ir) / 2}


class PairedRetrievalTask(Task):
    """Fit ridge projectors on the pairs the subject's learner gives and score cross-modal retrieval on the test split."""

    name = NAME
    options = PairedOptions
    metrics = ("ir_at_1", "tr_at_1", "r_at_1", "fit_s")

    def evaluate(self, subject: Subject, options: PairedOptions, ctx: TrialContext) -> dict[str, float]:
        learner = subject.info.get("learner")
        if learner is None or not hasattr(learner, "fit_pairs"):
            raise ConfigError(f"task {NAME}: no pair learner; add a {NAME} stage (method apm, mtt, random_pairs or full_data)")
        data = load_paired(options)
        wall0 = time.perf_counter()
        got = learner.fit_pairs(data, seed=ctx.seed, device=subject.device)
        fit_s = time.perf_counter() - wall0
        dev = subject.device
        w_ab, w_ba = projectors(got.a.double(), got.b.double(), data.ridge)
        a, b = (torch.as_tensor(view["test"], device=dev).double() for view in (data.a, data.b))
        hits = {k: v.cpu().numpy() for k, v in retrieval_scores(w_ab, w_ba, a, b).items()}
        ctx.add_artifact(ARTIFACT, per_example_json("query", {k: v.tolist() for k, v in hits.items()}))
        return {"fit_s": fit_s, **{k: float(v.mean()) for k, v in hits.items()}, **got.extra}


class PairedSource(ModelSource):
    """``paired_retrieval``: a subject with no tokenizer and no weights; a pair method puts a learner on it."""

    name = NAME
    description = "no language model: a slot for a pair learner (apm, mtt, random_pairs, full_data) and the paired_retrieval task"
    weights = "none (the projectors are fitted in the task)"

    def load(self) -> Subject:
        return Subject(model=TabularSlot(NAME), tokenizer=None, model_name=self.name)


METRICS = (
    Metric("ir_at_1", "fraction", "maximize", "paired_retrieval: recall@1 of a view-B (text) query finding its own view A among the test split"),
    Metric("tr_at_1", "fraction", "maximize", "paired_retrieval: recall@1 of a view-A (image) query finding its own view B among the test split"),
    Metric("r_at_1", "fraction", "maximize", "paired_retrieval: mean of ir_at_1 and tr_at_1"),
)


@hookimpl
def register_tasks(register: Callable[[Task], None]) -> None:
    register(PairedRetrievalTask())


@hookimpl
def register_models(register: Callable[[ModelSource], None]) -> None:
    register(PairedSource())


@hookimpl
def register_metrics(register: Callable[[Metric], None]) -> None:
    for metric in METRICS:
        register(metric)

