"""PuzzleMoE and the expert-count baselines: drop the least-routed experts, frequency-weighted averaging, M-SMoE merging.

Zhao, Wang, Zhang, "PuzzleMoE: Efficient Compression of Large Mixture-of-Experts Models via
Fine-Grained Expert Merging and Bit-packed Inference" (ICML 2026, PMLR 306; code not fetchable
here). Read here: the abstract and a summary; the method section could not be read, so details
marked *guessed* are ours.

The paper's: training-free merging of experts in pairs, element by element: a similarity mask
marks entries where the two experts' magnitudes agree (Δ = ||W_a| − |W_b|| / (|W_a| + |W_b|) ≤ τ,
τ = 0.4) and share one magnitude; elsewhere a per-expert saliency |W|·‖X‖ (‖X‖: the norm of the
input feature over calibration tokens routed to the expert) picks the expert-specific entries; one
merged magnitude matrix per pair plus each expert's sign and mask bits, packed into spare exponent
bits so 50% expert memory is real.

Ours / guessed: pairs are formed greedily within each block by the cosine similarity of the
experts' router logits on calibration text (M-SMoE's signal; the same pairs for every merging
method here, so they differ only in how a pair is merged); shared entries take the mean magnitude;
outside the similarity mask the more salient expert owns the entry (its magnitude, its mask bit
set) and the other's mask bit is 0; ‖X‖ of the down projection is over the expert's own
intermediate activations; above 50% memory (60%, 75%) only the least-routed pairs are merged (fewest summed routing frequency first) and the rest stay dense; fp32 words, not bf16
(:mod:`paretolab.plugins.moe.packing`).

Baselines (each a method; all keep the router and map each merged expert's index to the merged
weights): ``expert_drop`` removes the least-routed experts (globally, at most E − top_k per block)
and masks them out of the router; ``expert_average`` replaces each pair by its frequency-weighted
average; ``msmoe`` (Li et al., "Merge, Then Compress", ICLR 2024) first permutes the second
expert's intermediate neurons to match the first (Hungarian assignment on the concatenated gate,
up and down weights of each neuron), then averages weighted by frequency (without M-SMoE's
later low-rank compression and fine-tuning).
"""

from __future__ import annotations

import math
from typing import Any

import torch
from optuna.distributions import FloatDistribution
from torch import nn

from paretolab import Method, Paper, TrialContext
from paretolab.errors import ConfigError
from paretolab.plugin_api.subject import Subject
from paretolab.plugins._layerwise import calibration_ids
from paretolab.plugins.moe import packing
from paretolab.plugins.moe.experts import (
    ExpertsBase,
    RoutingStats,
    expert_weights,
    moe_blocks,
    replace_experts,
    routing_stats,
    stored,
)
from paretolab.plugins.moe.rfid import CALIB


class SlotExperts(ExpertsBase):
    """Dense fp32 experts in slots, with a map from each routed expert index to its slot (-1: dropped, never routed to)."""

    def __init__(self, gate_up: torch.Tensor, down: torch.Tensor, slot_of: list[int], act: Any) -> None:
        super().__init__(len(slot_of), act)
        self.gate_up_proj = nn.Parameter(gate_up.contiguous(), requires_grad=False)  # [S, 2I, H]
        self.down_proj = nn.Parameter(down.contiguous(), requires_grad=False)  # [S, H, I]
        self.slot_of = list(slot_of)

    def weights(self, e: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        s = self.slot_of[e]
        if s < 0:
            raise RuntimeError(f"expert {e} was dropped but the router sent tokens to it")
        gate, up = self.gate_up_proj[s].chunk(2, dim=0)
        return gate, up, self.down_proj[s]

    def stored_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.gate_up_proj, self.down_proj))


class PackedPairExperts(ExpertsBase):
    """Unmerged experts dense, merged pairs as packed words decoded on every forward (what is stored is what runs)."""

    def __init__(self, dense: dict[int, tuple[torch.Tensor, torch.Tensor]], pairs: list[tuple[int, int, dict[str, torch.Tensor]]],
                 num_experts: int, act: Any) -> None:
        super().__init__(num_experts, act)
        self.dense_ids = sorted(dense)
        self.pairs = [(a, b) for a, b, _ in pairs]
        if self.dense_ids:
            self.gate_up_proj = nn.Parameter(torch.stack([dense[e][0] for e in self.dense_ids]), requires_grad=False)
            self.down_proj = nn.Parameter(torch.stack([dense[e][1] for e in self.dense_ids]), requires_grad=False)
        for p, (_, _, packed) in enumerate(pairs):
            for key, tensor in packed.items():
                self.register_buffer(f"pair{p}_{key}", stored(tensor))
        self.where = {e: ("dense", i) for i, e in enumerate(self.dense_ids)}
        for p, (a, b) in enumerate(self.pairs):
            self.where[a], self.where[b] = ("pair", p, 0), ("pair", p, 1)

    def weights(self, e: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        place = self.where[e]
        if place[0] == "dense":
            gate, up = self.gate_up_proj[place[1]].chunk(2, dim=0)
            return gate, up, self.down_proj[place[1]]
        p, which = place[1], place[2]
        gate_up = packing.decode(getattr(self, f"pair{p}_gate_up"), getattr(self, f"pair{p}_gate_up_top"))[which]
        down = packing.decode(getattr(self, f"pair{p}_down"), getattr(self, f"pair{p}_down_top"))[which]
        gate, up = gate_up.chunk(2, dim=0)
        return gate, up, down

    def stored_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in [*self.parameters(), *self.buffers()])


class MaskedRouter(nn.Module):
    """A top-k softmax router (Qwen3-MoE's) that never picks the dropped experts: their logits are -inf before the top-k."""

    def __init__(self, router: nn.Module, dropped: list[int]) -> None:
        super().__init__()
        self.weight = router.weight
        self.top_k, self.num_experts = router.top_k, router.num_experts
        self.norm_topk_prob = getattr(router, "norm_topk_prob", True)
        keep = torch.ones(router.num_experts, dtype=torch.bool, device=router.weight.device)
        keep[dropped] = False
        self.register_buffer("keep", stored(keep))  # 1 byte per expert: what the router must know

    def forward(self, hidden_states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        hidden_states = hidden_states.reshape(-1, self.weight.shape[1])
        logits = nn.functional.linear(hidden_states, self.weight).masked_fill(~self.keep, float("-inf"))
        probs = torch.softmax(logits, dim=-1, dtype=torch.float)
        top, indices = torch.topk(probs, self.top_k, dim=-1)
        if self.norm_topk_prob:
            top = top / top.sum(dim=-1, keepdim=True)
        return logits, top.to(logits.dtype), indices


# --- pairing -------------------------------------------------------------------------------------------------


def pair_experts(logits: torch.Tensor) -> list[tuple[int, int]]:
    """Greedy pairs of one block's experts, most similar first, by the cosine similarity of their router-logit columns [T, E]."""
    cols = logits - logits.mean(dim=0, keepdim=True)
    cols = cols / cols.norm(dim=0, keepdim=True).clamp_min(1e-12)
    sim = cols.T @ cols
    n = sim.shape[0]
    free = set(range(n))
    pairs = []
    candidates = sorted(((float(sim[a, b]), a, b) for a in range(n) for b in range(a + 1, n)), reverse=True)
    for _, a, b in candidates:
        if a in free and b in free:
            pairs.append((a, b))
            free -= {a, b}
    return pairs


def merge_plan(stats: RoutingStats, blocks: list[nn.Module], memory: float) -> list[list[tuple[int, int]]]:
    """Per block, the pairs to merge: enough pairs overall that expert memory ≤ ``memory``, the least-routed pairs first."""
    total = sum(b.experts.num_experts for b in blocks)
    wanted = math.ceil(round((1 - memory) * total, 6))  # each merged pair frees one expert's bytes
    options = []
    for i, block in enumerate(blocks):
        freq = stats.frequency(i)
        for a, b in pair_experts(stats.logits[i]):
            options.append((float(freq[a] + freq[b]), i, a, b))
    if wanted > len(options):
        raise ConfigError(f"memory: {memory} needs {wanted} merged pairs but the model has {len(options)}; the pairwise methods reach 0.5 at most")
    chosen: list[list[tuple[int, int]]] = [[] for _ in blocks]
    for _, i, a, b in sorted(options)[:wanted]:
        chosen[i].append((a, b))
    return chosen


# --- merging rules -------------------------------------------------------------------------------------------


def input_norms(stats: RoutingStats, block_index: int, experts: nn.Module, e: int) -> tuple[torch.Tensor, torch.Tensor]:
    """‖X‖ per input feature of expert ``e``'s gate/up ([H]) and down ([I]) over its routed calibration tokens (ones if none)."""
    x = stats.routed_inputs(block_index, e).to(experts.gate_up_proj.device)
    gate, up, _ = expert_weights(experts, e)
    if x.shape[0] == 0:
        return torch.ones(gate.shape[1], device=x.device), torch.ones(gate.shape[0], device=x.device)
    hidden = experts.act_fn(x @ gate.T) * (x @ up.T)
    return x.norm(dim=0), hidden.norm(dim=0)


def puzzle_merge(w_a: torch.Tensor, w_b: torch.Tensor, sal_a: torch.Tensor, sal_b: torch.Tensor, tau: float) -> dict[str, torch.Tensor]:
    """Packed words (and top exponent) of one matrix of a pair: shared magnitude where similar, the salient expert's elsewhere."""
    mag_a, mag_b = w_a.abs(), w_b.abs()
    delta = (mag_a - mag_b).abs() / (mag_a + mag_b).clamp_min(1e-30)
    shared = delta <= tau
    a_owns = sal_a >= sal_b
    magnitude = torch.where(shared, (mag_a + mag_b) / 2, torch.where(a_owns, mag_a, mag_b))
    words, top = packing.encode(magnitude, w_a < 0, w_b < 0, shared | a_owns, shared | ~a_owns)
    return {"words": words, "top": top}


def align_neurons(gate_up_a: torch.Tensor, down_a: torch.Tensor, gate_up_b: torch.Tensor, down_b: torch.Tensor) -> torch.Tensor:
    """M-SMoE's alignment: the permutation of b's intermediate neurons that best matches a's (Hungarian, on weight dot products)."""
    from scipy.optimize import linear_sum_assignment

    def features(gate_up: torch.Tensor, down: torch.Tensor) -> torch.Tensor:
        gate, up = gate_up.chunk(2, dim=0)
        return torch.cat([gate, up, down.T], dim=1)  # one row per intermediate neuron

    score = features(gate_up_a, down_a) @ features(gate_up_b, down_b).T
    _, cols = linear_sum_assignment(score.double().cpu().numpy(), maximize=True)
    return torch.as_tensor(cols, device=gate_up_a.device)


def average_pair(experts: nn.Module, a: int, b: int, f_a: float, f_b: float, *, align: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(gate_up, down) of the frequency-weighted average of experts a and b (b's neurons permuted onto a's first if ``align``)."""
    gu_a, gu_b = experts.gate_up_proj[a], experts.gate_up_proj[b]
    dn_a, dn_b = experts.down_proj[a], experts.down_proj[b]
    if align:
        perm = align_neurons(gu_a, dn_a, gu_b, dn_b)
        inner = dn_b.shape[1]
        gu_b = torch.cat([gu_b[:inner][perm], gu_b[inner:][perm]])
        dn_b = dn_b[:, perm]
    wa, wb = (f_a, f_b) if f_a + f_b > 0 else (0.5, 0.5)
    s = wa + wb
    return (wa * gu_a + wb * gu_b) / s, (wa * dn_a + wb * dn_b) / s


# --- methods -------------------------------------------------------------------------------------------------


class _ExpertCountMethod(Method):
    """Shared parts: parameters, calibration, the expert_memory metrics."""

    kind = "weights"
    cost_is = "real"
    # expert_bytes and expert_mem_frac come from the expert_memory measure, for every trial (the baseline's too)

    def defaults(self) -> dict[str, Any]:
        return {"memory": 0.5, **CALIB}

    def search_space(self) -> dict[str, Any]:
        return {"memory": FloatDistribution(0.5, 0.95)}

    def transform(self, subject: Subject, params: dict[str, Any], ctx: TrialContext) -> Subject:
        p = {**self.defaults(), **params}
        memory = float(p["memory"])
        if not 0 < memory < 1:
            raise ConfigError(f"{self.name}.memory: {memory} must be in (0, 1) (the share of expert memory to keep)")
        blocks = moe_blocks(subject.model)
        stats = routing_stats(subject.model, calibration_ids(subject, ctx, p, method=self.name))
        with torch.no_grad():
            self.apply(blocks, stats, memory, p)
        return subject

    def apply(self, blocks: list[nn.Module], stats: RoutingStats, memory: float, p: dict[str, Any]) -> None:
        raise NotImplementedError


class PuzzleMoe(_ExpertCountMethod):
    """PuzzleMoE (see the module docstring): element-wise pairwise merging, sign and mask bits packed in the magnitude's word."""

    name = "puzzle_moe"
    paper = Paper("PuzzleMoE: Efficient Compression of Large Mixture-of-Experts Models via Fine-Grained Expert Merging and Bit-packed Inference",
                  "ICML 2026", "https://raw.githubusercontent.com/mlresearch/v306/main/assets/zhao26ay/zhao26ay.pdf")

    def defaults(self) -> dict[str, Any]:
        return {**super().defaults(), "tau": 0.4}

    def search_space(self) -> dict[str, Any]:
        return {**super().search_space(), "tau": FloatDistribution(0.0, 1.0)}

    def apply(self, blocks: list[nn.Module], stats: RoutingStats, memory: float, p: dict[str, Any]) -> None:
        tau = float(p["tau"])
        for i, (block, pairs) in enumerate(zip(blocks, merge_plan(stats, blocks, memory))):
            experts = block.experts
            merged = {e for pair in pairs for e in pair}
            dense = {e: (experts.gate_up_proj[e].detach().clone(), experts.down_proj[e].detach().clone())
                     for e in range(experts.num_experts) if e not in merged}
            packed_pairs = []
            for a, b in pairs:
                x_a, h_a = input_norms(stats, i, experts, a)
                x_b, h_b = input_norms(stats, i, experts, b)
                gu_a, gu_b = experts.gate_up_proj[a], experts.gate_up_proj[b]
                dn_a, dn_b = experts.down_proj[a], experts.down_proj[b]
                gu = puzzle_merge(gu_a, gu_b, gu_a.abs() * x_a, gu_b.abs() * x_b, tau)
                dn = puzzle_merge(dn_a, dn_b, dn_a.abs() * h_a, dn_b.abs() * h_b, tau)
                packed_pairs.append((a, b, {"gate_up": gu["words"], "gate_up_top": gu["top"], "down": dn["words"], "down_top": dn["top"]}))
            replace_experts(block, PackedPairExperts(dense, packed_pairs, experts.num_experts, experts.act_fn))


class _MergeAverage(_ExpertCountMethod):
    align = False

    def apply(self, blocks: list[nn.Module], stats: RoutingStats, memory: float, p: dict[str, Any]) -> None:
        for i, (block, pairs) in enumerate(zip(blocks, merge_plan(stats, blocks, memory))):
            experts, freq = block.experts, stats.frequency(i)
            merged = {e for pair in pairs for e in pair}
            slot_of = [-1] * experts.num_experts
            gate_up, down = [], []
            for e in range(experts.num_experts):
                if e not in merged:
                    slot_of[e] = len(gate_up)
                    gate_up.append(experts.gate_up_proj[e])
                    down.append(experts.down_proj[e])
            for a, b in pairs:
                gu, dn = average_pair(experts, a, b, float(freq[a]), float(freq[b]), align=self.align)
                slot_of[a] = slot_of[b] = len(gate_up)
                gate_up.append(gu)
                down.append(dn)
            replace_experts(block, SlotExperts(torch.stack(gate_up), torch.stack(down), slot_of, experts.act_fn))


class ExpertAverage(_MergeAverage):
    """Baseline: each pair replaced by the routing-frequency-weighted average of its two experts (both indices route to it)."""

    name = "expert_average"
    paper = Paper("Frequency-weighted expert averaging (baseline of PuzzleMoE)")


class MSmoe(_MergeAverage):
    """Baseline: M-SMoE-style merging, neurons aligned by permutation before the frequency-weighted average."""

    name = "msmoe"
    paper = Paper("Merge, Then Compress: Demystify Efficient SMoE with Hints from Its Routing Policy (M-SMoE merging step)",
                  "ICLR 2024", "https://arxiv.org/abs/2310.01334")
    align = True


class ExpertDrop(_ExpertCountMethod):
    """Baseline: remove the least-routed experts (globally, at most E − top_k per block) and mask them out of the router."""

    name = "expert_drop"
    paper = Paper("Expert dropping by routing frequency (baseline of PuzzleMoE)")

    def apply(self, blocks: list[nn.Module], stats: RoutingStats, memory: float, p: dict[str, Any]) -> None:
        total = sum(b.experts.num_experts for b in blocks)
        wanted = math.ceil(round((1 - memory) * total, 6))
        order = sorted((float(stats.frequency(i)[e]), i, e) for i, b in enumerate(blocks) for e in range(b.experts.num_experts))
        dropped: list[list[int]] = [[] for _ in blocks]
        for _, i, e in order:
            if sum(map(len, dropped)) == wanted:
                break
            if len(dropped[i]) < blocks[i].experts.num_experts - blocks[i].gate.top_k:
                dropped[i].append(e)
        if sum(map(len, dropped)) < wanted:
            raise ConfigError(f"expert_drop.memory: {memory} would leave fewer than top_k experts in a block; raise memory")
        for block, gone in zip(blocks, dropped):
            experts = block.experts
            kept = [e for e in range(experts.num_experts) if e not in gone]
            slot_of = [kept.index(e) if e in kept else -1 for e in range(experts.num_experts)]
            replace_experts(block, SlotExperts(experts.gate_up_proj[kept].clone(), experts.down_proj[kept].clone(), slot_of, experts.act_fn))
            block.gate = MaskedRouter(block.gate, gone)
