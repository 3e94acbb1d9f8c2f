"""Generation: the interface decoding methods implement, and the default greedy policy.

A subject's ``generator`` decides how text is produced; ``None`` means plain greedy decoding.
Generation tasks call :func:`generate`, which dispatches to the subject's generator, so a
decoding method (speculative drafting, early-stopped branches, ...) changes how tokens are
produced without touching the task that scores them.
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import TYPE_CHECKING, Any, Protocol

import torch

if TYPE_CHECKING:
    from paretolab.context import TrialContext
    from paretolab.subject import Subject


@dataclass
class Generation:
    """What a generator returns for a batch of prompts.

    ``sequences[i]`` holds the new token ids for prompt ``i`` (a stop token, when hit, is the
    last id). ``tokens_total`` counts every token the target model emitted across sequences;
    ``tokens_sequential`` counts sequential target decode steps (what latency follows: a batch
    of N branches decoded together for L steps is N*L total but L sequential). ``stats`` carries
    method-specific numbers (e.g. ``mean_accepted_len``) reported as metrics.
    """

    sequences: list[list[int]]
    tokens_total: int
    tokens_sequential: int
    prefill_s: float
    decode_s: float
    stats: dict[str, float] = field(default_factory=dict)


class Generator(Protocol):
    """What ``Subject.generator`` must provide."""

    def generate(
        self,
        subject: Subject,
        prompts: Sequence[Sequence[int]],
        *,
        max_new_tokens: int,
        stop_ids: Sequence[int] = (),
        ctx: TrialContext | None = None,
    ) -> Generation: ...


def generate(
    subject: Subject,
    prompts: Sequence[Sequence[int]],
    *,
    max_new_tokens: int,
    stop_ids: Sequence[int] = (),
    ctx: TrialContext | None = None,
) -> Generation:
    """Generate with the subject's generator, or greedily when it has none."""
    generator = subject.generator if subject.generator is not None else GreedyGenerator()
    return generator.generate(subject, prompts, max_new_tokens=max_new_tokens, stop_ids=stop_ids, ctx=ctx)


class GreedyGenerator:
    """Plain greedy decoding, one prompt at a time, with a KV cache."""

    def generate(
        self,
        subject: Subject,
        prompts: Sequence[Sequence[int]],
        *,
        max_new_tokens: int,
        stop_ids: Sequence[int] = (),
        ctx: TrialContext | None = None,
    ) -> Generation:
        sequences: list[list[int]] = []
        prefill_s = decode_s = 0.0
        steps = 0
        for prompt in prompts:
            ids = torch.tensor([list(prompt)], dtype=torch.long, device=subject.device)
            new, seconds = _greedy(subject.model, ids, max_new_tokens, set(stop_ids))
            prefill_s += seconds[0]
            decode_s += seconds[1]
            steps += len(new)
            sequences.append(new)
        return Generation(sequences, sum(map(len, sequences)), steps, prefill_s, decode_s)


@lru_cache(maxsize=32)
def _cache_argument(forward: Any) -> str:
    # transformers 5.2x renamed `past_key_values` to `cache`; accept both releases.
    return "cache" if "cache" in inspect.signature(forward).parameters else "past_key_values"


def forward_with_cache(model: torch.nn.Module, input_ids: torch.Tensor, cache: Any = None, **kwargs: Any) -> tuple[torch.Tensor, Any]:
    """One cached forward step: (logits, new cache)."""
    name = _cache_argument(type(model).forward)
    if cache is not None:
        kwargs[name] = cache
    out = model(input_ids=input_ids, use_cache=True, **kwargs)
    new_cache = out.get("cache") if "cache" in out else out.get("past_key_values")
    return out.logits, new_cache


@torch.no_grad()
def _greedy(model: torch.nn.Module, input_ids: torch.Tensor, max_new_tokens: int, stop: set[int]) -> tuple[list[int], tuple[float, float]]:
    start = time.perf_counter()
    logits, cache = forward_with_cache(model, input_ids)
    next_id = logits[:, -1:].argmax(-1)  # (1, 1)
    prefilled = time.perf_counter()
    new = [int(next_id)]
    while len(new) < max_new_tokens and new[-1] not in stop:
        logits, cache = forward_with_cache(model, next_id, cache)
        next_id = logits[:, -1:].argmax(-1)
        new.append(int(next_id))
    return new, (prefilled - start, time.perf_counter() - prefilled)


@torch.no_grad()
def greedy_decode(model: torch.nn.Module, input_ids: torch.Tensor, max_new_tokens: int, *, eos_token_id: int | None = None) -> torch.Tensor:
    """Greedy continuation of ``input_ids`` (1, T) for up to ``max_new_tokens``; returns the new ids (1, N)."""
    stop = {eos_token_id} if eos_token_id is not None else set()
    new, _ = _greedy(model, input_ids, max_new_tokens, stop)
    return torch.tensor([new], dtype=torch.long, device=input_ids.device)
