"""The ``expert_memory`` measure: ``expert_bytes`` (stored bytes of every expert, real formats) and ``expert_mem_frac``."""

from __future__ import annotations

from typing import Any

from torch import nn

from paretolab.measure.measures import Measure, NoOptions
from paretolab.plugin_api.context import TrialContext
from paretolab.plugin_api.metrics import Metric
from paretolab.plugin_api.subject import Subject
from paretolab.plugins.moe.experts import expert_bytes, moe_blocks


def dense_bytes_of(model: nn.Module) -> int:
    """What the experts take uncompressed: E × 3 × I × H values per block, in the model's own dtype (from its config)."""
    c = model.config
    element = next(model.parameters()).element_size()  # fp32 here; the embedding's dtype is the model's
    return len(moe_blocks(model)) * c.num_experts * 3 * c.moe_intermediate_size * c.hidden_size * element


def expert_memory(model: nn.Module) -> dict[str, float]:
    """``expert_bytes`` and ``expert_mem_frac`` (the share of the uncompressed experts' bytes kept) of an MoE model."""
    stored = expert_bytes(model)
    return {"expert_bytes": float(stored), "expert_mem_frac": stored / dense_bytes_of(model)}


class ExpertMemory(Measure):
    """Stored bytes of every expert in its real format (dense fused tensors, low-rank factors, packed words) and the share kept."""

    name = "expert_memory"
    metrics = ("expert_bytes", "expert_mem_frac")
    options = NoOptions

    def measure(self, subject: Subject, options: Any, ctx: TrialContext) -> dict[str, float]:
        return expert_memory(subject.model)


METRICS = (
    Metric("expert_bytes", "bytes", "minimize", "expert_memory measure: stored bytes of all MoE experts in their real formats "
           "(dense fp32, low-rank factors + sparse residual, packed merged words)"),
    Metric("expert_mem_frac", "ratio", "minimize", "expert_memory measure: expert_bytes / the uncompressed experts' bytes (1.0 = nothing removed)"),
)
