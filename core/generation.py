"""A small greedy KV-cached decode loop: the default generation policy of a subject."""

from __future__ import annotations

import torch


@torch.no_grad()
def greedy_decode(model: torch.nn.Module, input_ids: torch.Tensor, max_new_tokens: int, *, eos_token_id: int | None = None) -> torch.Tensor:
    """Greedy continuation of ``input_ids`` (1, T) for up to ``max_new_tokens``; returns the new ids (1, N)."""
    out = model(input_ids=input_ids, use_cache=True)
    past = out.past_key_values
    next_id = out.logits[:, -1:].argmax(-1)  # (1, 1)
    new = [next_id]
    for _ in range(max_new_tokens - 1):
        if eos_token_id is not None and int(next_id) == eos_token_id:
            break
        out = model(input_ids=next_id, past_key_values=past, use_cache=True)
        past = out.past_key_values
        next_id = out.logits[:, -1:].argmax(-1)
        new.append(next_id)
    return torch.cat(new, dim=1)
