"""Whether a model computes causally: the logits at a prefix do not change when tokens are appended after it."""

from __future__ import annotations

import torch


def causal_gap(model: torch.nn.Module, ids: torch.Tensor, split: int) -> float:
    """Largest change of the logits at positions ``< split`` when ``ids[:, split:]`` is appended, relative to their scale.

    0 for a causal model (up to the arithmetic of a longer batch); a model whose output at a position reads later
    tokens (a bidirectional mask, a pooled statistic over the sequence) shows a gap of the order of its logits.
    """
    with torch.no_grad():
        prefix = model(input_ids=ids[:, :split]).logits.float()
        full = model(input_ids=ids).logits.float()[:, :split]
    return float((full - prefix).abs().max() / prefix.abs().max().clamp_min(1e-12))
