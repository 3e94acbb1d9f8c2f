"""Prefill time with compression beside the unmodified model's, paired, on one fixed LAMBADA prompt.

Both sides produce the first token of the same prompt through the default batched loop: the
method's side selects first (scoring included) and prefills the kept tokens, the base prefills the
whole prompt. They alternate under the node's timing lock with torch's threads set to the trial's
``resources.cpus`` (``paretolab.measure.timing``), as the latency measure times; the speedup is the
median of the per-round ratios (base ÷ method), which holds up under load where times do not.
"""

from __future__ import annotations

import statistics
from typing import Any

import torch

from paretolab.data import encode
from paretolab.generation import BatchedGenerator
from paretolab.measure.timing import node_lock, time_paired, torch_threads
from paretolab.plugin_api.context import TrialContext
from paretolab.plugin_api.subject import Subject, synchronize
from paretolab.plugins.omnisift_text.generator import CompressingGenerator
from paretolab.tasks.lambada import split_rows


def timing_prompt(tokenizer: Any, source: str) -> list[int]:
    """The first eval row's context (the same prompt in every trial of a source)."""
    return encode(tokenizer, split_rows(source, "eval")[0]["context"].rstrip())


def paired_prefill(subject: Subject, base: Subject, generator: CompressingGenerator, prompt: list[int], *, rounds: int,
                   cpus: float) -> dict[str, float]:
    """``prefill_speedup``: the unmodified model's time to the first token ÷ the method's (selection included)."""
    loop = BatchedGenerator()

    def method() -> None:
        loop.generate(subject, [generator.compress(subject, prompt)[0]], max_new_tokens=1)

    def unmodified() -> None:
        loop.generate(base, [prompt], max_new_tokens=1)

    device = subject.device
    with node_lock(), torch_threads(int(cpus)), torch.no_grad():
        method()  # warm both paths
        unmodified()
        timed = time_paired(method, unmodified, min_rounds=rounds, max_rounds=3 * rounds, max_s=20.0, target=0.05,
                            sync=lambda: synchronize(device))
    return {"prefill_speedup": statistics.median(timed.ratios)}


def measure_prefill(subject: Subject, ctx: TrialContext, rounds: int, source: str) -> dict[str, float]:
    """The method's ``measure``: nothing without the compressing generator, the unmodified base or rounds to time."""
    generator = subject.generator
    if not isinstance(generator, CompressingGenerator) or ctx.base is None or rounds < 1:
        return {}
    return paired_prefill(subject, ctx.base, generator, timing_prompt(subject.tokenizer, source), rounds=rounds, cpus=ctx.cpus)
