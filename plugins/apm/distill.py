"""The learners of the APM analog: APM's parameter matching, and the pairs it is compared with.

The paper's (APM, ICML 2026, from its abstract; no code here): the modal projectors' parameters in
closed form replace the inner loop of dual-trajectory matching, and the synthetic pairs are optimised
so that the analytic projector parameters of the student match the teacher's; the teacher's side is
two cached matrices, computed in one forward pass. Ours: the projectors are the paired_retrieval
task's ridge maps between the two views (:mod:`paretolab.tasks.paired_retrieval`); the teacher's two
matrices per direction are the Gram XᵀX/n and the cross-covariance XᵀY/n of all real train pairs (the
B -> A direction reuses the cross-covariance transposed, so three distinct matrices are kept); M
synthetic pairs, initialised from M random real pairs, take ``steps`` Adam steps on the relative
Frobenius distance between their closed-form projectors and the teacher's, both directions.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from paretolab.measure.timing import torch_threads
from paretolab.tasks.paired_retrieval import PairedData, Pairs, moments, ridge_from_moments


def _train(data: PairedData, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.as_tensor(data.a["train"], device=device), torch.as_tensor(data.b["train"], device=device)


def _draw(n: int, m: int, seed: int) -> torch.Tensor:
    """m distinct real pair indices out of n, from a seeded CPU generator (never the global RNG)."""
    return torch.randperm(n, generator=torch.Generator(device="cpu").manual_seed(seed), device="cpu")[:m]


def matching_loss(a: torch.Tensor, b: torch.Tensor, teacher: tuple[torch.Tensor, torch.Tensor], ridge: float) -> torch.Tensor:
    """Relative squared Frobenius distance of the pairs' closed-form projectors to the teacher's, summed over both directions."""
    loss = a.new_zeros(())
    for (x, y), target in zip(((a, b), (b, a)), teacher):
        w = ridge_from_moments(*moments(x, y), ridge)
        loss = loss + ((w - target) ** 2).sum() / (target**2).sum()
    return loss


def teacher_projectors(a: torch.Tensor, b: torch.Tensor, ridge: float) -> tuple[tuple[torch.Tensor, torch.Tensor], int]:
    """The teacher's W_AB, W_BA from its cached matrices (Gram of A, Gram of B, cross-covariance) and their float count."""
    gram_a, cross = moments(a, b)
    gram_b = b.T @ b / len(b)
    kept = gram_a.numel() + gram_b.numel() + cross.numel()
    return (ridge_from_moments(gram_a, cross, ridge), ridge_from_moments(gram_b, cross.T, ridge)), kept


@dataclass(frozen=True)
class RandomPairs:
    """``pairs`` real train pairs drawn at random (seeded): the coreset baseline at the same budget."""

    pairs: int = 100
    seed: int | None = None  # None: the trial's seed

    def pairs_for(self, n: int, seed: int) -> torch.Tensor:
        return _draw(n, min(self.pairs, n), seed if self.seed is None else self.seed)

    def pairs_of(self, data: PairedData, *, seed: int, device: torch.device) -> Pairs:
        a, b = _train(data, device)
        idx = self.pairs_for(len(a), seed).to(device)
        return Pairs(a[idx], b[idx], {"pairs_kept": float(len(idx)), "pairs_storage_floats": float(idx.numel() * (a.shape[1] + b.shape[1]))})

    def fit_pairs(self, data: PairedData, *, seed: int, device: torch.device) -> Pairs:  # the task's entry point
        got = self.pairs_of(data, seed=seed, device=device)
        a, b = _train(data, device)
        teacher, _ = teacher_projectors(a.double(), b.double(), data.ridge)
        got.extra["match_loss"] = float(matching_loss(got.a.double(), got.b.double(), teacher, data.ridge))  # what apm starts from
        return got


@dataclass(frozen=True)
class FullData:
    """All real train pairs: the upper bound every distilled set is measured against."""

    def fit_pairs(self, data: PairedData, *, seed: int, device: torch.device) -> Pairs:
        a, b = _train(data, device)
        return Pairs(a, b, {"pairs_kept": float(len(a)), "pairs_storage_floats": float(a.numel() + b.numel())})


@dataclass(frozen=True)
class APM(RandomPairs):
    """M synthetic pairs whose closed-form projectors match the teacher's (analytic parameter matching)."""

    steps: int = 300
    lr: float = 0.02
    traj_epochs: int = 50  # the stated model of a trajectory method's storage: epochs x both projectors' parameters
    threads: int = 1  # torch threads while distilling: the matrices are small, and two threads on a busy machine ran ~100x slower

    def fit_pairs(self, data: PairedData, *, seed: int, device: torch.device) -> Pairs:
        with torch_threads(self.threads):
            return self._distil(data, seed=seed, device=device)

    def _distil(self, data: PairedData, *, seed: int, device: torch.device) -> Pairs:
        start = time.perf_counter()
        a_real, b_real = _train(data, device)
        teacher, kept = teacher_projectors(a_real.double(), b_real.double(), data.ridge)  # the single pass over real data
        init = self.pairs_of(data, seed=seed, device=device)
        a = init.a.double().clone().requires_grad_(True)
        b = init.b.double().clone().requires_grad_(True)
        opt = torch.optim.Adam([a, b], lr=self.lr)
        with torch.no_grad():
            first = float(matching_loss(a, b, teacher, data.ridge))
        for _ in range(self.steps):
            opt.zero_grad(set_to_none=True)
            loss = matching_loss(a, b, teacher, data.ridge)
            loss.backward()
            opt.step()
        with torch.no_grad():
            last = float(matching_loss(a, b, teacher, data.ridge))
        params = 2 * a_real.shape[1] * b_real.shape[1]
        extra = {**init.extra, "distill_s": time.perf_counter() - start, "distill_storage_floats": float(kept),
                 "match_loss_init": first, "match_loss": last, "traj_storage_floats_model": float(self.traj_epochs * params)}
        return Pairs(a.detach().float(), b.detach().float(), extra)
