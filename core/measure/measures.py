"""Cost measures: parameters, stored size, prefill latency and decode throughput.

``Measure`` and ``NoOptions`` live in :mod:`paretolab.plugin_api.measure` (re-exported here and by ``paretolab``).
"""

from __future__ import annotations

import inspect
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from paretolab.generation import greedy_decode
from paretolab.plugin_api.context import TrialContext
from paretolab.plugin_api.hookspec import hookimpl
from paretolab.plugin_api.measure import Measure, NoOptions
from paretolab.plugin_api.options import option
from paretolab.plugin_api.storage import unique_parameters
from paretolab.plugin_api.subject import Subject


class ParamCount(Measure):
    name = "params"
    metrics = ("param_count", "nonzero_params")
    options = NoOptions
    default = True

    def measure(self, subject: Subject, options: Any, ctx: TrialContext) -> dict[str, float]:
        params = unique_parameters(subject.model)
        return {
            "param_count": float(sum(t.numel() for _, t in params)),
            "nonzero_params": float(sum(int(torch.count_nonzero(t)) for _, t in params)),
        }


class Size(Measure):
    """Bytes of the weights as each method says they are stored (dense dtype by default)."""

    name = "size"
    metrics = ("size_bytes",)
    options = NoOptions
    default = True

    def measure(self, subject: Subject, options: Any, ctx: TrialContext) -> dict[str, float]:
        total = sum(subject.storage_of(name).nbytes(t) for name, t in unique_parameters(subject.model))
        # Formats that keep their own buffers (not Parameters) report them under their module name.
        # A record whose tensor or module a later stage replaced no longer counts (current_storage).
        total += sum(s.stored_bytes or 0 for name, s in subject.current_storage().items() if name.startswith("format:"))
        return {"size_bytes": float(total)}


@dataclass(frozen=True)
class LatencyOptions:
    prompt_tokens: int = option(128, low=1)  # length of the fixed prompt for prefill
    new_tokens: int = option(32, low=1)  # tokens decoded per decode run
    repeats: int = option(5, low=1)  # paired rounds at least, for prefill and for decode
    max_repeats: int = option(30, low=1)  # paired rounds at most
    max_s: float = option(20.0, low=0.0)  # time cap per phase (prefill, decode); past it three rounds suffice
    target_spread: float = option(0.05, low=0.0)  # stop once IQR / median of the times and of the speedups is at most this
    warmup: int = option(1, low=0)
    baseline: bool = True  # also time the unmodified model, alternating, for prefill_speedup / decode_speedup


class Latency(Measure):
    """Prefill time of a fixed prompt and greedy decode tokens/s at batch 1, beside the unmodified model.

    One timing at a time per node (``paretolab.timing.node_lock``), with torch's threads set to
    the trial's ``resources.cpus``; the method's model and the unmodified one run alternately
    until the spread is small or ``max_s`` is spent. Reports medians, IQRs and the paired
    speedups (unmodified time / method time), which hold up under load where times do not.
    """

    name = "latency"
    metrics = (
        "prefill_ms", "prefill_ms_iqr", "decode_tok_s", "decode_tok_s_iqr",
        "prefill_speedup", "prefill_speedup_iqr", "decode_speedup", "decode_speedup_iqr",
        "prefill_cpu_speedup", "decode_cpu_speedup", "base_prefill_ms", "base_decode_tok_s", "timing_wait_s",
    )
    options = LatencyOptions
    default = True

    def measure(self, subject: Subject, options: LatencyOptions, ctx: TrialContext) -> dict[str, float]:
        from paretolab.measure.timing import (
            node_lock,
            spread,
            time_paired,
            torch_threads,
        )

        model = subject.model
        base = ctx.base.model if options.baseline and ctx.base is not None else None
        vocab = min(int(getattr(m.config, "vocab_size", 256)) for m in (model, base) if m is not None)
        gen = torch.Generator().manual_seed(1234)  # the same prompt for every trial
        prompt = torch.randint(0, vocab, (1, options.prompt_tokens), generator=gen, device="cpu")
        ids = prompt.to(subject.device)
        base_ids = prompt.to(next(base.parameters()).device) if base is not None else None
        cuda = ids.is_cuda or (base_ids is not None and base_ids.is_cuda)
        sync = torch.cuda.synchronize if cuda else (lambda: None)
        rounds = {"min_rounds": options.repeats, "max_rounds": options.max_repeats, "max_s": options.max_s,
                  "target": options.target_spread, "sync": sync}
        with node_lock() as waited, torch_threads(int(ctx.cpus)), torch.no_grad():
            models = [(model, ids)] + ([(base, base_ids)] if base is not None else [])
            for m, x in models:
                for _ in range(options.warmup):
                    m(input_ids=x)
                greedy_decode(m, x[:, :16], 4)  # warm the decode path
            keep, base_keep = _last_logits(model), _last_logits(base) if base is not None else {}
            prefill = time_paired(lambda: model(input_ids=ids, **keep), (lambda: base(input_ids=base_ids, **base_keep)) if base is not None else None, **rounds)
            n = options.new_tokens
            decode = time_paired(lambda: greedy_decode(model, ids[:, :16], n), (lambda: greedy_decode(base, base_ids[:, :16], n)) if base is not None else None, **rounds)
        rates = [n / t for t in decode.method]
        out = {
            "prefill_ms": statistics.median(prefill.method) * 1000,
            "prefill_ms_iqr": spread(prefill.method) * 1000,
            "decode_tok_s": statistics.median(rates),
            "decode_tok_s_iqr": spread(rates),
            "timing_wait_s": waited,
        }
        if base is not None:
            out.update({
                "prefill_speedup": statistics.median(prefill.ratios),
                "prefill_speedup_iqr": spread(prefill.ratios),
                "decode_speedup": statistics.median(decode.ratios),
                "decode_speedup_iqr": spread(decode.ratios),
                "base_prefill_ms": statistics.median(prefill.base) * 1000,
                "base_decode_tok_s": statistics.median([n / t for t in decode.base]),
            })
            if not cuda:  # a GPU's work is not the process's CPU time
                out["prefill_cpu_speedup"] = statistics.median(prefill.cpu_ratios)
                out["decode_cpu_speedup"] = statistics.median(decode.cpu_ratios)
        return out


def _last_logits(model: torch.nn.Module) -> dict[str, int]:
    """Prefill needs the last position's logits only; ask for just those where the model can (transformers' ``logits_to_keep``)."""
    return {"logits_to_keep": 1} if "logits_to_keep" in inspect.signature(type(model).forward).parameters else {}


@hookimpl
def register_measures(register: Callable[[Measure], None]) -> None:
    register(ParamCount())
    register(Size())
    register(Latency())
