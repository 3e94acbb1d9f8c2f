"""Cost measures: parameters, stored size, prefill latency and decode throughput."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from paretolab.context import TrialContext
from paretolab.generation import greedy_decode
from paretolab.hookspec import hookimpl
from paretolab.subject import Subject


class Measure:
    """A cost measure. ``default`` measures run in every study unless the pipeline lists others."""

    name: str = ""
    metrics: tuple[str, ...] = ()
    options: type = object
    default: bool = False

    def measure(self, subject: Subject, options: Any, ctx: TrialContext) -> dict[str, float]:
        raise NotImplementedError


@dataclass(frozen=True)
class NoOptions:
    pass


def unique_parameters(model: torch.nn.Module) -> list[tuple[str, torch.Tensor]]:
    """(name, tensor) for each distinct parameter or buffer-free weight (tied weights counted once)."""
    seen: set[int] = set()
    out = []
    for name, tensor in model.state_dict(keep_vars=True).items():
        if not isinstance(tensor, torch.nn.Parameter) and not getattr(tensor, "_paretolab_weight", False):
            continue
        key = tensor.data_ptr()
        if key in seen:
            continue
        seen.add(key)
        out.append((name, tensor.detach()))
    return out


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
        total += sum(s.stored_bytes or 0 for name, s in subject.storage.items() if name.startswith("format:"))
        return {"size_bytes": float(total)}


@dataclass(frozen=True)
class LatencyOptions:
    prompt_tokens: int = 128  # length of the fixed prompt for prefill
    new_tokens: int = 32  # tokens decoded per decode run
    repeats: int = 5  # timed prefill repeats (median reported); decode uses max(2, repeats // 2)
    warmup: int = 1


class Latency(Measure):
    """Median prefill time of a fixed prompt, and greedy decode tokens/s at batch 1."""

    name = "latency"
    metrics = ("prefill_ms", "decode_tok_s")
    options = LatencyOptions
    default = True

    def measure(self, subject: Subject, options: LatencyOptions, ctx: TrialContext) -> dict[str, float]:
        model = subject.model
        vocab = int(getattr(model.config, "vocab_size", 256))
        gen = torch.Generator().manual_seed(1234)  # the same prompt for every trial
        prompt = torch.randint(0, vocab, (1, options.prompt_tokens), generator=gen, device="cpu").to(subject.device)
        sync = torch.cuda.synchronize if prompt.is_cuda else (lambda: None)
        with torch.no_grad():
            for _ in range(options.warmup):
                model(input_ids=prompt)
            prefill = []
            for _ in range(options.repeats):
                sync()
                start = time.perf_counter()
                model(input_ids=prompt)
                sync()
                prefill.append(time.perf_counter() - start)
            greedy_decode(model, prompt[:, :16], 4)  # warm the decode path
            rates = []
            for _ in range(max(2, options.repeats // 2)):
                sync()
                start = time.perf_counter()
                new = greedy_decode(model, prompt[:, :16], options.new_tokens)
                sync()
                rates.append(new.shape[1] / (time.perf_counter() - start))
        return {"prefill_ms": statistics.median(prefill) * 1000, "decode_tok_s": statistics.median(rates)}


@hookimpl
def register_measures(register: Callable[[Measure], None]) -> None:
    register(ParamCount())
    register(Size())
    register(Latency())
