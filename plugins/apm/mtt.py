"""A small dual-trajectory-matching baseline (``mtt``), the kind of method APM replaces, at the same pair budget.

Ours, a reduced form of trajectory matching (Cazenavette et al., 2022), not any MDD paper's code: the experts are
full-batch gradient-descent trajectories of both ridge projectors on all real train pairs, from zero, step size
``1 / (|Gram|_2 + ridge)``, ``expert_epochs`` steps, every checkpoint kept (that is its storage); each of ``steps``
Adam iterations picks a start checkpoint (seeded CPU generator), unrolls ``unroll`` differentiable steps on the
synthetic pairs from it, and matches the expert's checkpoint ``span`` steps later (squared distance over the
expert's own move, both directions). It reports the same ``match_loss`` as apm (its pairs' closed-form projectors
against the teacher's) so the two distilled sets are compared on one scale.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from paretolab.measure.timing import torch_threads
from paretolab.plugins.apm.distill import RandomPairs, _train, matching_loss, teacher_projectors
from paretolab.tasks.paired_retrieval import PairedData, Pairs, moments


def _step(w: torch.Tensor, gram: torch.Tensor, cross: torch.Tensor, ridge: float, eta: float) -> torch.Tensor:
    """One gradient step on |XW - Y|²/n + ridge |W|² (its gradient, halved: gram W - cross + ridge W)."""
    return w - eta * (gram @ w - cross + ridge * w)


def expert_trajectories(a: torch.Tensor, b: torch.Tensor, ridge: float, epochs: int) -> tuple[list[torch.Tensor], float]:
    """Checkpoints (epochs + 1, each direction's W stacked as a pair) of gradient descent from zero, and the step size."""
    dirs = [moments(a, b), moments(b, a)]
    eta = 1.0 / (max(float(torch.linalg.matrix_norm(g, ord=2)) for g, _ in dirs) + ridge)
    ws = [torch.zeros_like(c) for _, c in dirs]
    path = [torch.cat([w.reshape(-1) for w in ws])]
    for _ in range(epochs):
        ws = [_step(w, g, c, ridge, eta) for w, (g, c) in zip(ws, dirs)]
        path.append(torch.cat([w.reshape(-1) for w in ws]))
    return path, eta


@dataclass(frozen=True)
class MTT(RandomPairs):
    """M synthetic pairs whose unrolled gradient steps follow the experts' trajectories."""

    steps: int = 300
    lr: float = 0.02
    expert_epochs: int = 50
    unroll: int = 10
    span: int = 2
    threads: int = 1

    def fit_pairs(self, data: PairedData, *, seed: int, device: torch.device) -> Pairs:
        with torch_threads(self.threads):
            return self._distil(data, seed=seed, device=device)

    def _distil(self, data: PairedData, *, seed: int, device: torch.device) -> Pairs:
        start = time.perf_counter()
        a_real, b_real = (v.double() for v in _train(data, device))
        path, eta = expert_trajectories(a_real, b_real, data.ridge, self.expert_epochs)
        init = self.pairs_of(data, seed=seed, device=device)
        a = init.a.double().clone().requires_grad_(True)
        b = init.b.double().clone().requires_grad_(True)
        opt = torch.optim.Adam([a, b], lr=self.lr)
        g = torch.Generator(device="cpu").manual_seed(seed + 1)
        span = min(self.span, self.expert_epochs)
        da, db = a_real.shape[1], b_real.shape[1]
        for _ in range(self.steps):
            s = int(torch.randint(0, self.expert_epochs - span + 1, (1,), generator=g, device="cpu"))
            w0, target = path[s], path[s + span]
            ws = [w0[: da * db].reshape(da, db), w0[da * db :].reshape(db, da)]
            dirs = [moments(a, b), moments(b, a)]
            for _ in range(self.unroll):
                ws = [_step(w, gm, c, data.ridge, eta) for w, (gm, c) in zip(ws, dirs)]
            end = torch.cat([w.reshape(-1) for w in ws])
            loss = ((end - target) ** 2).sum() / ((w0 - target) ** 2).sum().clamp_min(1e-12)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        teacher, _ = teacher_projectors(a_real, b_real, data.ridge)
        with torch.no_grad():
            match = float(matching_loss(a, b, teacher, data.ridge))
        extra = {**init.extra, "distill_s": time.perf_counter() - start, "match_loss": match,
                 "distill_storage_floats": float(len(path) * path[0].numel())}
        return Pairs(a.detach().float(), b.detach().float(), extra)
