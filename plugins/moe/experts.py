"""Helpers over a transformers-5 MoE: the fused expert weights, routing statistics on calibration text, module swaps.

transformers 5 keeps a sparse block's experts fused (Qwen3-MoE, Mixtral, OLMoE alike):
``block.experts.gate_up_proj`` is ``[E, 2I, H]`` (gate rows first, then up rows: the forward
``linear(x, gate_up_proj[e]).chunk(2, dim=-1)``) and ``block.experts.down_proj`` is ``[E, H, I]``;
``block.gate`` is the router, returning ``(logits, top-k scores, top-k indices)``, and
``block.experts(hidden [T, H], top_k_index [T, k], top_k_weights [T, k])`` returns ``[T, H]``.
A compressed experts module here keeps that forward signature, so the block's forward is untouched.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from paretolab.errors import ConfigError


def moe_blocks(model: nn.Module) -> list[nn.Module]:
    """The sparse MoE blocks of ``model`` in layer order (modules with a router ``gate`` and fused ``experts``)."""
    blocks = [m for m in model.modules() if hasattr(m, "gate") and hasattr(getattr(m, "experts", None), "num_experts")]
    if not blocks:
        raise ConfigError(f"model: {type(model).__name__} has no sparse MoE blocks (a router `gate` and fused `experts`); "
                          "the MoE methods need an MoE model such as tiny-moe")
    return blocks


def expert_weights(experts: nn.Module, e: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(gate [I, H], up [I, H], down [H, I]) of expert ``e``: views into the fused tensors."""
    gate, up = experts.gate_up_proj[e].chunk(2, dim=0)
    return gate, up, experts.down_proj[e]


def dense_expert_bytes(experts: nn.Module) -> int:
    """Bytes of a fused experts module's weights as stored (every expert, its dtype)."""
    return sum(t.numel() * t.element_size() for t in (experts.gate_up_proj, experts.down_proj))


def expert_bytes(model: nn.Module) -> int:
    """Stored bytes of every expert of every block, each in its own format (``stored_bytes()`` where a module has it)."""
    total = 0
    for block in moe_blocks(model):
        experts = block.experts
        total += int(experts.stored_bytes()) if hasattr(experts, "stored_bytes") else dense_expert_bytes(experts)
    return total


def stored(tensor: torch.Tensor) -> torch.Tensor:
    """Mark a buffer as stored weights, so ``size_bytes`` counts it (it counts Parameters and such buffers)."""
    tensor._paretolab_weight = True  # type: ignore[attr-defined]
    return tensor


def run_expert(x: torch.Tensor, gate: torch.Tensor, up: torch.Tensor, down: torch.Tensor, act: Any) -> torch.Tensor:
    """One SwiGLU expert on tokens ``x`` [T, H]: down(act(gate x) * up x)."""
    return nn.functional.linear(act(nn.functional.linear(x, gate)) * nn.functional.linear(x, up), down)


class ExpertsBase(nn.Module):
    """A replacement experts module: the fused forward's signature and routing loop; subclasses give each expert's weights."""

    def __init__(self, num_experts: int, act: Any) -> None:
        super().__init__()
        self.num_experts = num_experts
        self.act_fn = act

    def weights(self, e: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(gate [I, H], up [I, H], down [H, I]) of expert ``e`` as the forward uses them."""
        raise NotImplementedError

    def stored_bytes(self) -> int:
        """Bytes this module stores for its experts, in their real formats."""
        raise NotImplementedError

    def dense_module(self) -> nn.Module:
        """The model's own experts module holding every expert's effective weights (``paretolab export``: a model
        transformers loads, as large as the original; merged experts appear once per index that routes to them)."""
        template = self.__dict__.get("_dense_template")
        if template is None:
            raise TypeError(f"{type(self).__name__} was not installed by replace_experts: no experts module to rebuild")
        device = next(iter([*self.parameters(), *self.buffers()])).device
        dense = copy.deepcopy(template).to_empty(device=device)
        with torch.no_grad():
            for e in range(self.num_experts):
                try:
                    gate, up, down = self.weights(e)
                except RuntimeError:  # a dropped expert: the plain module would route to it, the method's router does not
                    raise TypeError(f"expert {e} was dropped; a plain {type(template).__name__} has no router that skips it") from None
                dense.gate_up_proj[e].copy_(torch.cat([gate, up], dim=0))
                dense.down_proj[e].copy_(down)
        return dense

    def forward(self, hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor) -> torch.Tensor:
        out = torch.zeros_like(hidden_states)
        for e in torch.unique(top_k_index).tolist():
            if e < 0 or e >= self.num_experts:
                continue
            token_idx, slot = torch.where(top_k_index == e)
            y = run_expert(hidden_states[token_idx], *self.weights(e), self.act_fn)
            out.index_add_(0, token_idx, (y * top_k_weights[token_idx, slot, None]).to(out.dtype))
        return out


@dataclass
class RoutingStats:
    """What a calibration pass saw at each MoE block: routed slot counts per expert and the block inputs."""

    counts: list[torch.Tensor] = field(default_factory=list)  # per block: [E] int64, (token, slot) pairs routed to each expert
    inputs: list[torch.Tensor] = field(default_factory=list)  # per block: [T, H] hidden states entering the block
    indices: list[torch.Tensor] = field(default_factory=list)  # per block: [T, k] the experts each token was routed to
    logits: list[torch.Tensor] = field(default_factory=list)  # per block: [T, E] router logits

    def frequency(self, block: int) -> torch.Tensor:
        """Share of the block's routed (token, slot) pairs that went to each expert (sums to 1)."""
        c = self.counts[block].double()
        return (c / c.sum().clamp_min(1)).float()

    def routed_inputs(self, block: int, e: int) -> torch.Tensor:
        """[n, H] the calibration tokens routed to expert ``e`` of ``block``."""
        rows = (self.indices[block] == e).any(dim=-1)
        return self.inputs[block][rows]


@torch.no_grad()
def routing_stats(model: nn.Module, ids: torch.Tensor, *, batch: int = 8, keep_inputs: bool = True) -> RoutingStats:
    """Run ``ids`` [n, T] through ``model`` with a hook on every router: counts per expert (and the routed inputs)."""
    blocks = moe_blocks(model)
    stats = RoutingStats()
    for block in blocks:
        stats.counts.append(torch.zeros(block.experts.num_experts, dtype=torch.long, device="cpu"))
    seen: list[list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]] = [[] for _ in blocks]

    def hook(i: int) -> Any:
        def record(module: nn.Module, args: tuple[Any, ...], output: Any) -> None:
            logits, _, indices = output
            stats.counts[i] += torch.bincount(indices.reshape(-1).cpu(), minlength=stats.counts[i].numel())
            if keep_inputs:
                seen[i].append((args[0].reshape(-1, args[0].shape[-1]).float().cpu(), indices.cpu(), logits.float().cpu()))
        return record

    handles = [block.gate.register_forward_hook(hook(i)) for i, block in enumerate(blocks)]
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    try:
        for start in range(0, ids.shape[0], batch):
            model(input_ids=ids[start : start + batch].to(device))
    finally:
        for handle in handles:
            handle.remove()
        model.train(was_training)
    for i in range(len(blocks)):
        if seen[i]:
            stats.inputs.append(torch.cat([s[0] for s in seen[i]]))
            stats.indices.append(torch.cat([s[1] for s in seen[i]]))
            stats.logits.append(torch.cat([s[2] for s in seen[i]]))
    return stats


def replace_experts(block: nn.Module, experts: nn.Module) -> None:
    """Swap ``block.experts`` for a module with the same forward signature (hidden, top_k_index, top_k_weights)."""
    old = block.experts
    if getattr(experts, "num_experts", None) != old.num_experts:
        raise ValueError(f"replacement experts module has {getattr(experts, 'num_experts', None)} experts; the block routes to {old.num_experts}")
    # the original module's structure, weightless (not a registered child): what dense_module() fills in
    experts.__dict__["_dense_template"] = old.__dict__.get("_dense_template") or copy.deepcopy(old).to("meta")
    block.experts = experts


def effective_rank(matrix: torch.Tensor) -> float:
    """exp(entropy of the normalised squared singular values): 1 for a rank-1 matrix, min(m, n) for a flat spectrum."""
    s2 = torch.linalg.svdvals(matrix.double()) ** 2
    p = s2 / s2.sum().clamp_min(1e-300)
    p = p[p > 0]
    return float(torch.exp(-(p * p.log()).sum()))
