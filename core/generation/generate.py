"""Generation: the interface decoding methods implement, and the default batched greedy policy.

A subject's ``generator`` decides how text is produced; ``None`` means batched greedy decoding
(:class:`BatchedGenerator`, on the KV-cached loop in :mod:`paretolab.decoding`). Generation
tasks call :func:`generate`, which dispatches to the subject's generator, so a decoding method
(speculative drafting, early-stopped branches, ...) changes how tokens are produced without
touching the task that scores them.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

import torch

from paretolab.errors import ConfigError
from paretolab.generation.decoding import (
    BatchDecoder,
    Sampling,
    TokenChooser,
    forward_with_cache,
)

if TYPE_CHECKING:
    from paretolab.plugin_api.context import TrialContext
    from paretolab.plugin_api.subject import Subject

__all__ = [
    "BatchedGenerator",
    "Generation",
    "Generator",
    "GreedyGenerator",
    "Sampling",
    "decode_batch",
    "forward_with_cache",
    "generate",
    "greedy_decode",
]


@dataclass
class Generation:
    """What a generator returns for a batch of prompts.

    ``sequences[i]`` holds the new token ids for prompt ``i`` (a stop token, when hit, is the
    last id). ``tokens_total`` counts every token the target model emitted across sequences;
    ``tokens_sequential`` adds, over prompts, the target decode steps each prompt needed one
    after another (what latency follows: N branches of one prompt decoded together for L steps
    are N*L total but L sequential; independent prompts sharing a batch each count their own
    length). ``stats`` carries method-specific numbers (e.g. ``mean_accepted_len``) reported as
    metrics; each key must be a registered metric.
    """

    sequences: list[list[int]]
    tokens_total: int
    tokens_sequential: int
    prefill_s: float
    decode_s: float
    stats: dict[str, float] = field(default_factory=dict)

    @classmethod
    def concat(cls, parts: Sequence[Generation]) -> Generation:
        """The generations of consecutive prompt groups as one: sequences in order, counts, times and stats summed."""
        stats: dict[str, float] = {}
        for part in parts:
            for key, value in part.stats.items():
                stats[key] = stats.get(key, 0.0) + value
        return cls(
            [seq for part in parts for seq in part.sequences],
            sum(part.tokens_total for part in parts),
            sum(part.tokens_sequential for part in parts),
            sum(part.prefill_s for part in parts),
            sum(part.decode_s for part in parts),
            stats,
        )


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
    """Generate with the subject's generator, or with the batched greedy loop when it has none."""
    generator = subject.generator if subject.generator is not None else BatchedGenerator()
    return generator.generate(subject, prompts, max_new_tokens=max_new_tokens, stop_ids=stop_ids, ctx=ctx)


class BatchedGenerator:
    """The default: prompts decoded ``batch_size`` at a time with one KV cache (left padding).

    Greedy unless ``sampling`` says otherwise (seeded temperature / top-p, one random stream per
    prompt, so prompt i gets the same tokens whatever batch it lands in). A row stops at a stop
    id or ``max_new_tokens`` and leaves the batch.
    """

    def __init__(self, *, batch_size: int = 16, sampling: Sampling | None = None) -> None:
        if batch_size < 1:
            raise ConfigError(f"batch_size must be >= 1, got {batch_size}")
        self.batch_size = batch_size
        self.sampling = sampling or Sampling()

    def generate(
        self,
        subject: Subject,
        prompts: Sequence[Sequence[int]],
        *,
        max_new_tokens: int,
        stop_ids: Sequence[int] = (),
        ctx: TrialContext | None = None,
    ) -> Generation:
        chooser = TokenChooser(self.sampling, len(prompts))
        return Generation.concat([
            decode_batch(
                subject.model, prompts[first : first + self.batch_size], max_new_tokens=max_new_tokens,
                stop_ids=stop_ids, chooser=chooser, row_ids=range(first, min(first + self.batch_size, len(prompts))),
            )
            for first in range(0, len(prompts), self.batch_size)
        ])


def decode_batch(
    model: torch.nn.Module,
    prompts: Sequence[Sequence[int]],
    *,
    max_new_tokens: int,
    stop_ids: Sequence[int] = (),
    chooser: TokenChooser | None = None,
    row_ids: Sequence[int] | None = None,
) -> Generation:
    """Decode all ``prompts`` as one batch until each hits a stop id or ``max_new_tokens``.

    ``row_ids[i]`` names prompt i's random stream in ``chooser`` (default: its index). Timers cover
    the whole loop, as every generator's do: ``prefill_s`` up to the first token chosen,
    ``decode_s`` from there to the last (forwards, token choice and batch bookkeeping alike).
    """
    if max_new_tokens < 1:
        raise ConfigError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    live = list(row_ids if row_ids is not None else range(len(prompts)))  # stream id of each batch row
    chooser = chooser or TokenChooser(Sampling(), max(live, default=0) + 1)
    slot = {r: i for i, r in enumerate(live)}
    sequences: list[list[int]] = [[] for _ in prompts]
    stop = set(stop_ids)
    decoder = BatchDecoder(model, single=len(prompts) == 1)  # batch 1 takes the lean forward where the model allows
    start = time.perf_counter()
    logits = decoder.prefill(prompts)
    prefill_s: float | None = None
    while True:
        next_ids = chooser.choose(logits, live)
        tokens = next_ids.tolist()  # waits for the device
        if prefill_s is None:  # the first token is prefill's
            prefill_s = time.perf_counter() - start
        keep = []
        for b, (row, token) in enumerate(zip(live, tokens)):
            sequences[slot[row]].append(token)
            if token not in stop and len(sequences[slot[row]]) < max_new_tokens:
                keep.append(b)
        if not keep:
            break
        if len(keep) < len(live):  # finished rows leave the batch and stop costing compute
            decoder.select(keep)
            next_ids = next_ids[keep]
            live = [live[b] for b in keep]
        logits = decoder.extend(next_ids)
    decode_s = time.perf_counter() - start - (prefill_s or 0.0)
    total = sum(map(len, sequences))  # independent prompts: each one's own steps are sequential
    return Generation(sequences, total, total, prefill_s, decode_s)


class GreedyGenerator:
    """Plain greedy decoding, one prompt at a time, with a KV cache (the reference for batched loops)."""

    def generate(
        self,
        subject: Subject,
        prompts: Sequence[Sequence[int]],
        *,
        max_new_tokens: int,
        stop_ids: Sequence[int] = (),
        ctx: TrialContext | None = None,
    ) -> Generation:
        return Generation.concat([
            _greedy(subject.model, torch.tensor([list(prompt)], dtype=torch.long, device=subject.device), max_new_tokens, set(stop_ids))
            for prompt in prompts
        ])


@torch.no_grad()
def _greedy(model: torch.nn.Module, input_ids: torch.Tensor, max_new_tokens: int, stop: set[int]) -> Generation:
    """One prompt (1, T), greedy, batch 1: every new token is one sequential step."""
    start = time.perf_counter()
    logits, cache = forward_with_cache(model, input_ids, last_only=True)
    next_id = logits[:, -1:].argmax(-1)  # (1, 1)
    new = [int(next_id)]  # waits for the device: the first token is prefill's
    prefilled = time.perf_counter()
    while len(new) < max_new_tokens and new[-1] not in stop:
        logits, cache = forward_with_cache(model, next_id, cache, last_only=True)
        next_id = logits[:, -1:].argmax(-1)
        new.append(int(next_id))
    return Generation([new], len(new), len(new), prefilled - start, time.perf_counter() - prefilled)


def greedy_decode(model: torch.nn.Module, input_ids: torch.Tensor, max_new_tokens: int, *, eos_token_id: int | None = None) -> torch.Tensor:
    """Greedy continuation of ``input_ids`` (1, T) for up to ``max_new_tokens``; returns the new ids (1, N)."""
    stop = {eos_token_id} if eos_token_id is not None else set()
    new = _greedy(model, input_ids, max_new_tokens, stop).sequences[0]
    return torch.tensor([new], dtype=torch.long, device=input_ids.device)
