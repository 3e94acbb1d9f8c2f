"""RFID-MoE: SVD ranks for each expert by an importance fusing routing frequency with effective rank, under one byte budget.

Mi, Chen, Zhao, Yu, Wang, Wang, Huang, "Effective MoE-based LLM Compression by Exploiting
Heterogeneous Inter-Group Experts Routing Frequency and Information Density" (arXiv 2602.09316,
2026; no code published). Read here: the abstract and a summary of the method; the method
section itself could not be read, so the details below marked *guessed* are ours.

The paper's: expert importance = a fused metric of activation (routing) frequency on calibration
text and effective rank (information density); SVD ranks allocated to experts by importance under
a fixed budget, more to important ones; the SVD residual not discarded but rebuilt through a
parameter-efficient sparse projection (about 3% extra parameters).

Ours / guessed:
- importance_e = α·f_e + (1 − α)·ρ_e within each MoE block, f = share of the block's routed
  (token, slot) pairs, ρ = effective rank (exp of the entropy of the normalised σ², mean over the
  expert's gate, up and down matrices) normalised to sum 1 over the block; α = 0.5 (guessed).
- one global budget in bytes (``memory`` × the dense experts' bytes); each expert gets one rank
  for its three matrices (rank r costs r·(m + n) values per matrix), proportional to importance,
  capped where the factors would cost as much as the dense matrix, water-filled and rounded so
  the ranks' bytes plus the residual's bytes equal the budget exactly (to the 8-byte entry).
- plain truncated SVD of each weight (no activation whitening).
- the residual W − U_r V_r is rebuilt as R̂ = P z: P the sparse 0/1 selection of the residual's
  largest-magnitude entries over all experts (stored as int32 positions), z their fp32 values;
  the residual gets ``residual`` × the budget plus the rounding slack.
Baselines (same code, other params): ``svd_moe`` (uniform ranks, no residual: uniform-rank SVD
at equal bytes), ``rfid_moe[alloc=frequency]`` and ``rfid_moe[alloc=erank]`` (one signal only).
"""

from __future__ import annotations

from typing import Any

import torch
from optuna.distributions import CategoricalDistribution, FloatDistribution
from torch import nn

from paretolab import Method, Paper, TrialContext
from paretolab.errors import ConfigError
from paretolab.plugin_api.subject import Subject
from paretolab.plugins._layerwise import calibration_ids
from paretolab.plugins.moe.experts import (
    ExpertsBase,
    dense_expert_bytes,
    effective_rank,
    expert_weights,
    moe_blocks,
    replace_experts,
    routing_stats,
    stored,
)

ALLOCATIONS = ("fused", "uniform", "frequency", "erank")
ENTRY_BYTES = 8  # one residual entry: an fp32 value and an int32 position
CALIB = {"calib_corpus": "moe-mix-calib", "calib_samples": 16, "calib_seq_len": 128, "calib_seed": -1}  # calib_seed -1: the trial's seed


class LowRankExperts(ExpertsBase):
    """Each expert's gate, up and down as U [m, r] · V [r, n] (ranks differ by expert), plus sparse residual entries."""

    def __init__(self, factors: list[list[tuple[torch.Tensor, torch.Tensor]]], residual: list[list[tuple[torch.Tensor, torch.Tensor]]],
                 shapes: tuple[tuple[int, int], ...], act: Any) -> None:
        super().__init__(len(factors), act)
        self.shapes = shapes  # (m, n) of gate, up, down
        self.us = nn.ParameterList([nn.Parameter(u, requires_grad=False) for per in factors for u, _ in per])
        self.vs = nn.ParameterList([nn.Parameter(v, requires_grad=False) for per in factors for _, v in per])
        self.ranks = [u.shape[1] for per in factors for u, _ in per]
        for k, (pos, val) in enumerate(entry for per in residual for entry in per):
            self.register_buffer(f"pos{k}", stored(pos))
            self.register_buffer(f"val{k}", stored(val))

    def _matrix(self, k: int) -> torch.Tensor:
        m, n = self.shapes[k % 3]
        u, v = self.us[k], self.vs[k]
        w = u @ v if u.shape[1] else torch.zeros(m, n, dtype=u.dtype, device=u.device)
        pos, val = getattr(self, f"pos{k}"), getattr(self, f"val{k}")
        if pos.numel():
            w = w.reshape(-1).index_put((pos.long(),), val, accumulate=True).reshape(m, n)
        return w

    def weights(self, e: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return self._matrix(3 * e), self._matrix(3 * e + 1), self._matrix(3 * e + 2)

    def stored_bytes(self) -> int:
        tensors = [*self.us, *self.vs, *self.buffers()]
        return sum(t.numel() * t.element_size() for t in tensors)


def allocate_ranks(importance: torch.Tensor, *, units: int, cap: int) -> list[int]:
    """Integer ranks, one per expert, in proportion to ``importance``, each ≤ ``cap``, summing to exactly ``units``.

    Water-filling: r_e = min(cap, c·importance_e) with c found by bisection, then floors, then the
    units still missing go to the largest remainders (an expert at its cap takes none).
    """
    n = importance.numel()
    if units > n * cap:
        raise ConfigError(f"rfid_moe: a budget of {units} rank units is more than every expert at full rank ({n} × {cap}); lower memory")
    if units <= 0:
        return [0] * n
    imp = importance.double().clamp_min(0)
    if float(imp.sum()) <= 0:
        imp = torch.ones_like(imp)
    lo, hi = 0.0, float(units) / float(imp[imp > 0].min())
    for _ in range(200):  # the continuous fill is monotone in c
        mid = (lo + hi) / 2
        if float((imp * mid).clamp(max=cap).sum()) < units:
            lo = mid
        else:
            hi = mid
    ideal = (imp * hi).clamp(max=cap)
    ranks = ideal.floor().long()
    missing = units - int(ranks.sum())
    order = sorted(range(n), key=lambda e: (-(float(ideal[e]) - int(ranks[e])), -float(imp[e]), e))
    while missing > 0:  # at most n per pass; a pass over the room left always makes progress since units ≤ n·cap
        for e in order:
            if missing and int(ranks[e]) < cap:
                ranks[e] += 1
                missing -= 1
    return [int(r) for r in ranks]


def importance_scores(freq: torch.Tensor, erank: torch.Tensor, *, alloc: str, alpha: float) -> torch.Tensor:
    """One block's expert importance: fused α·f + (1 − α)·ρ̂, frequency alone, effective rank alone, or uniform (each sums to 1)."""
    rho = erank / erank.sum().clamp_min(1e-12)
    f = freq / freq.sum().clamp_min(1e-12)
    scores = {"fused": alpha * f + (1 - alpha) * rho, "frequency": f, "erank": rho, "uniform": torch.full_like(f, 1.0 / f.numel())}
    return scores[alloc]


def _svd(w: torch.Tensor, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    u, s, vh = torch.linalg.svd(w.double(), full_matrices=False)
    root = s[:rank].sqrt()
    return (u[:, :rank] * root).to(w.dtype).contiguous(), (root[:, None] * vh[:rank]).to(w.dtype).contiguous()


class RfidMoe(Method):
    """RFID-MoE (see the module docstring): importance-allocated SVD ranks plus a sparse residual, at a given expert memory."""

    name = "rfid_moe"
    kind = "weights"
    paper = Paper("Effective MoE-based LLM Compression by Exploiting Heterogeneous Inter-Group Experts Routing Frequency and Information Density (RFID-MoE)",
                  "arXiv 2026", "https://arxiv.org/abs/2602.09316")
    cost_is = "real"
    # expert_bytes and expert_mem_frac come from the expert_memory measure, for every trial (the baseline's too)
    fixed: dict[str, Any] = {}

    def defaults(self) -> dict[str, Any]:
        return {"memory": 0.5, "alloc": "fused", "alpha": 0.5, "residual": 0.03, **CALIB, **self.fixed}

    def search_space(self) -> dict[str, Any]:
        space: dict[str, Any] = {"memory": FloatDistribution(0.2, 0.9), "alloc": CategoricalDistribution(ALLOCATIONS),
                                 "alpha": FloatDistribution(0.0, 1.0), "residual": FloatDistribution(0.0, 0.2)}
        return {k: v for k, v in space.items() if k not in self.fixed}

    def transform(self, subject: Subject, params: dict[str, Any], ctx: TrialContext) -> Subject:
        p = {**self.defaults(), **params}
        memory, alloc, alpha, residual = float(p["memory"]), str(p["alloc"]), float(p["alpha"]), float(p["residual"])
        if alloc not in ALLOCATIONS:
            raise ConfigError(f"{self.name}.alloc: {alloc!r} is not one of {', '.join(ALLOCATIONS)}")
        if not 0 < memory < 1 or not 0 <= residual < 1 or not 0 <= alpha <= 1:
            raise ConfigError(f"{self.name}: memory must be in (0, 1), residual in [0, 1), alpha in [0, 1]; got {memory}, {residual}, {alpha}")
        model = subject.model
        blocks = moe_blocks(model)
        stats = routing_stats(model, calibration_ids(subject, ctx, p, method=self.name), keep_inputs=False)
        compress(blocks, stats, memory=memory, alloc=alloc, alpha=alpha, residual=residual)
        return subject


class SvdMoe(RfidMoe):
    """Uniform-rank SVD of every expert at the same bytes as rfid_moe (the paper's baseline): no importance, no residual."""

    name = "svd_moe"
    paper = Paper("Uniform-rank SVD of each expert (the baseline of RFID-MoE)", "", "https://arxiv.org/abs/2602.09316")
    fixed = {"alloc": "uniform", "residual": 0.0}
    # alpha weighs routing frequency against information density in the fused allocation, which svd_moe never uses;
    # it stays in the space so that a pipeline pairs its trials with rfid_moe's on the same alpha (pipelines/moe_rfid.yaml)
    inert_params = {"alpha": "only alloc='fused' reads it; svd_moe's allocation is uniform (kept to pair trials with rfid_moe's)"}


@torch.no_grad()
def compress(blocks: list[nn.Module], stats: Any, *, memory: float, alloc: str, alpha: float, residual: float) -> dict[str, Any]:
    """Replace every block's experts by LowRankExperts within ``memory`` × the dense bytes; return the plan (ranks, bytes)."""
    experts0 = blocks[0].experts
    gate, _, down = expert_weights(experts0, 0)
    inner, hidden = gate.shape
    elt = gate.element_size()
    shapes = ((inner, hidden), (inner, hidden), (hidden, inner))
    for block in blocks:
        if tuple(block.experts.gate_up_proj.shape[1:]) != (2 * inner, hidden):
            raise ConfigError("rfid_moe: every MoE block must have experts of one shape (one rank unit for the budget)")
    unit = 3 * (inner + hidden) * elt  # bytes of one rank of one expert (gate, up and down)
    cap = (inner * hidden) // (inner + hidden)  # past this rank the factors cost as much as the dense matrix
    dense = sum(dense_expert_bytes(b.experts) for b in blocks)
    budget = int(memory * dense) // ENTRY_BYTES * ENTRY_BYTES
    importance = []
    for i, block in enumerate(blocks):
        freq = stats.frequency(i)
        erank = torch.tensor([sum(effective_rank(w) for w in expert_weights(block.experts, e)) / 3 for e in range(block.experts.num_experts)],
                             device="cpu")
        importance.append(importance_scores(freq, erank, alloc=alloc, alpha=alpha))
    flat = torch.cat(importance)
    units = min(int(budget * (1 - residual)) // unit, flat.numel() * cap)
    ranks = allocate_ranks(flat, units=units, cap=cap)
    entries = (budget - units * unit) // ENTRY_BYTES if residual > 0 else 0

    factors, residuals = [], []
    k = 0
    for block in blocks:
        per_block = []
        for e in range(block.experts.num_experts):
            per_block.append([(w, *_svd(w, ranks[k])) for w in expert_weights(block.experts, e)])
            k += 1
        factors.append(per_block)
        residuals.append([[(w - u @ v).reshape(-1) for w, u, v in per] for per in per_block])
    # the residual's largest entries over all experts and matrices: the sparse selection P and values z
    all_res = torch.cat([r for block_res in residuals for per in block_res for r in per])
    keep = torch.zeros_like(all_res, dtype=torch.bool)
    if entries > 0:
        keep[torch.topk(all_res.abs(), min(entries, all_res.numel())).indices] = True
    offset = 0
    for block, per_block, block_res in zip(blocks, factors, residuals):
        device = block.experts.gate_up_proj.device
        packed_res = []
        for per in block_res:
            out = []
            for r in per:
                mask = keep[offset : offset + r.numel()]
                pos = mask.nonzero().reshape(-1)
                out.append((pos.to(torch.int32).to(device), r[pos].to(device)))
                offset += r.numel()
            packed_res.append(out)
        new = LowRankExperts([[(u, v) for _, u, v in per] for per in per_block], packed_res, shapes, block.experts.act_fn)
        replace_experts(block, new)
    used = sum(b.experts.stored_bytes() for b in blocks)
    return {"ranks": ranks, "budget": budget, "used": used, "dense": dense, "entries": entries, "unit": unit, "cap": cap}

