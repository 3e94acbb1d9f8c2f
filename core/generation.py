"""A small greedy KV-cached decode loop: the default generation policy of a subject."""

from __future__ import annotations

import inspect
from functools import lru_cache
from typing import Any

import torch


@lru_cache(maxsize=32)
def _cache_argument(forward: Any) -> str:
    # transformers 5.2x renamed `past_key_values` to `cache`; accept both releases.
    return "cache" if "cache" in inspect.signature(forward).parameters else "past_key_values"


def forward_with_cache(model: torch.nn.Module, input_ids: torch.Tensor, cache: Any = None) -> tuple[torch.Tensor, Any]:
    """One cached forward step: (logits, new cache)."""
    name = _cache_argument(type(model).forward)
    kwargs = {name: cache} if cache is not None else {}
    out = model(input_ids=input_ids, use_cache=True, **kwargs)
    new_cache = out.get("cache") if "cache" in out else out.get("past_key_values")
    return out.logits, new_cache


@torch.no_grad()
def greedy_decode(model: torch.nn.Module, input_ids: torch.Tensor, max_new_tokens: int, *, eos_token_id: int | None = None) -> torch.Tensor:
    """Greedy continuation of ``input_ids`` (1, T) for up to ``max_new_tokens``; returns the new ids (1, N)."""
    logits, cache = forward_with_cache(model, input_ids)
    next_id = logits[:, -1:].argmax(-1)  # (1, 1)
    new = [next_id]
    for _ in range(max_new_tokens - 1):
        if eos_token_id is not None and int(next_id) == eos_token_id:
            break
        logits, cache = forward_with_cache(model, next_id, cache)
        next_id = logits[:, -1:].argmax(-1)
        new.append(next_id)
    return torch.cat(new, dim=1)
