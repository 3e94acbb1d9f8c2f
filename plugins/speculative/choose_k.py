"""How many tokens to draft: the k that maximises measured acceptance per measured second.

A round of speculative decoding drafts k tokens (k draft steps), verifies them in one (k+1)-token
target forward, and emits tau(k) tokens on average: the accepted length, which the draft's
training run measured on held-out text for k = 1..6 (``meta["heldout_accepted_len"]``). The
rate is tau(k) / (t_verify(k+1) + k * t_draft), with both times measured here, on this machine,
through the same code the generator runs (kernels included): a verify of k+1 tokens after a
prompt in the KV cache, and a draft step, each the median of a few repeats after a warm-up.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

from paretolab.generation import forward_with_cache
from paretolab.kernels.dense_cpu import fast_linears
from paretolab.plugin_api.subject import synchronize
from paretolab.plugins.speculative.generator import Drafter, TargetFeatures, crop_cache

REPEATS = 5


def _median_s(fn: Callable[[], Any], repeats: int = REPEATS) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


@torch.no_grad()
def measure_costs(model: torch.nn.Module, drafter: Drafter, prompt: Sequence[int], k_max: int) -> dict[str, Any]:
    """Seconds of a (T)-token verify for T = 1..k_max+1 and of one draft step, after ``prompt`` is in the cache."""
    device = next(model.parameters()).device
    modules = (model, *getattr(drafter, "modules", ()))
    with fast_linears(*modules), TargetFeatures(model, drafter.feature_layers) as watch:
        logits, cache = forward_with_cache(model, torch.tensor([list(prompt)], device=device), last_only=True)
        features = watch.last()
        length = cache.get_seq_length()
        ids = [*prompt, int(logits[0, -1].argmax())]
        verify = {}
        for t in range(1, k_max + 2):
            block = torch.tensor([ids[-1:] * t], device=device)

            def step(block: torch.Tensor = block) -> None:
                forward_with_cache(model, block, cache)
                crop_cache(cache, length)
                synchronize(device)

            verify[t] = _median_s(step)

        def drafts(k: int) -> None:
            drafter.start(model)
            drafter.propose(ids, features, k)
            synchronize(device)

        first = _median_s(lambda: drafts(1))  # the first draft also reads the prompt's features
        chain = _median_s(lambda: drafts(k_max))
    return {"verify_s": verify, "draft_step_s": max(chain - first, 0.0) / max(k_max - 1, 1), "draft_first_s": first}


def choose_k(accepted_len: Sequence[float], costs: dict[str, Any]) -> tuple[int, dict[int, float]]:
    """(best k, predicted tokens/s for each k) from tau(k) = accepted_len[k-1] and the measured costs."""
    verify, step, first = costs["verify_s"], costs["draft_step_s"], costs["draft_first_s"]
    rates = {}
    for k, tau in enumerate(accepted_len, start=1):
        if k + 1 not in verify:
            break
        rates[k] = tau / (verify[k + 1] + first + (k - 1) * step)
    return max(rates, key=rates.__getitem__), rates
