"""A key mask inside every attention layer, so that a masked forward is the forward of the compressed prompt.

While :func:`patched` is active every decoder layer's attention runs :func:`masked_attention_forward`
(registered with transformers' ``AttentionInterface``; each layer gets its own config copy naming
it, restored on exit): causal softmax attention, then the probabilities of key ``j`` multiplied by
``keep[j]`` and each row renormalised. With a 0/1 ``keep`` and ``position_ids = cumsum(keep) - 1``
the kept positions compute exactly what the model computes on the kept tokens alone (a dropped
token is no key anywhere, so nothing of it reaches a kept one); with the soft mask of training
(:mod:`.train`) the loss is differentiable in ``keep``: key ``j``'s multiplier weighs how much
token ``j`` is let in, at every layer. Gradients flow back through kept queries' outputs only: a dropped query's output reaches
no kept position, and a dropped query with no kept key yet would divide by a zero sum. The same
function records, for the attention baseline, the probabilities the last ``window`` queries give
each key, averaged over heads, one row per layer. No KV cache: prefill-sized forwards only.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch

from paretolab.plugins._layerwise import decoder_layers

ATTENTION_NAME = "paretolab_omnisift_text"


@dataclass
class MaskState:
    """What the patched layers read (``keep``: (B, T) key multipliers, None for all ones) and write (``recorded``)."""

    keep: torch.Tensor | None = None
    kept_queries: torch.Tensor | None = None  # (B, T) bool: where gradients may flow back through a query's output
    window: int = 0  # record the mean attention of the last `window` queries (0: record nothing)
    recorded: list[torch.Tensor] = field(default_factory=list)  # per layer: (B, T)


def masked_attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """Causal attention with key multipliers (``module.omnisift_state``); transformers' own mask is not used."""
    state: MaskState = module.omnisift_state  # type: ignore[assignment]
    length = query.shape[2]
    if key.shape[2] != length:
        raise RuntimeError("omnisift_text's masked attention runs full-prompt forwards only (no KV cache)")
    groups = query.shape[1] // key.shape[1]
    key = key.repeat_interleave(groups, dim=1)  # grouped-query attention: each KV head serves `groups` query heads
    value = value.repeat_interleave(groups, dim=1)
    scale = query.shape[-1] ** -0.5 if scaling is None else scaling
    scores = torch.matmul(query, key.transpose(2, 3)) * scale
    causal = torch.ones(length, length, dtype=torch.bool, device=query.device).tril()
    probs = torch.softmax(scores.masked_fill(~causal, float("-inf")).float(), dim=-1)
    if state.keep is not None:
        probs = probs * state.keep[:, None, None, :].float()
        total = probs.sum(-1, keepdim=True)
        probs = probs / torch.where(total > 0, total, torch.ones_like(total))  # a query with no kept key so far: zeros
    if state.window:
        state.recorded.append(probs[:, :, -state.window :, :].mean(dim=(1, 2)).detach())
    out = torch.matmul(probs.to(value.dtype), value)
    if state.kept_queries is not None:  # a dropped position's output reaches nothing kept: no gradient through it
        out = torch.where(state.kept_queries[:, None, :, None], out, out.detach())
    return out.transpose(1, 2).contiguous(), None


def register_attention() -> None:
    """Make the function known to transformers (idempotent)."""
    from transformers import AttentionInterface

    AttentionInterface.register(ATTENTION_NAME, masked_attention_forward)


@contextmanager
def patched(model: torch.nn.Module, state: MaskState) -> Iterator[MaskState]:
    """Every decoder layer's attention reads ``state`` while the block runs; the layers are as before afterwards."""
    register_attention()
    saved = []
    for layer in decoder_layers(model):
        attn = layer.self_attn
        saved.append((attn, attn.config))
        attn.config = copy.copy(attn.config)
        attn.config._attn_implementation = ATTENTION_NAME
        attn.omnisift_state = state
    try:
        yield state
    finally:
        for attn, config in saved:
            attn.config = config
            del attn.omnisift_state


def kept_positions(keep_hard: torch.Tensor) -> torch.Tensor:
    """Position ids of the compressed prompt: kept tokens 0, 1, 2, ... in order (a dropped one shares its predecessor's)."""
    return (torch.cumsum(keep_hard.long(), dim=-1) - 1).clamp_min(0)


def masked_hidden(model: torch.nn.Module, ids: torch.Tensor, keep: torch.Tensor, keep_hard: torch.Tensor) -> torch.Tensor:
    """Last hidden states (B, T, d) of the masked forward: ``keep`` in every layer, positions from ``keep_hard``."""
    with patched(model, MaskState(keep=keep, kept_queries=keep_hard > 0)):
        return model.model(input_ids=ids, position_ids=kept_positions(keep_hard), use_cache=False).last_hidden_state
