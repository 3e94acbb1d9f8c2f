"""Timing under load: the node lock, fixed threads, paired rounds and the speedup against the unmodified model."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from transformers.modeling_outputs import CausalLMOutputWithPast

from paretolab.measure.measures import Latency, LatencyOptions
from paretolab.measure.timing import cpu_name, node_lock, relative_spread, time_paired
from paretolab.plugin_api.subject import Subject

FAST = dict(prompt_tokens=8, new_tokens=3, repeats=3, max_repeats=6, max_s=5.0, warmup=1)


class Clock:
    """The timer the timing module reads, advanced only by the stand-in models: deterministic on a loaded machine."""

    now = 0.0

    @classmethod
    def perf_counter(cls) -> float:
        return cls.now


class SlowModel(torch.nn.Module):
    """A stand-in model whose every forward pass takes ``ms`` milliseconds (of ``Clock``); records torch's thread count."""

    def __init__(self, ms: float) -> None:
        super().__init__()
        self.ms = ms
        self.weight = torch.nn.Parameter(torch.zeros(1))
        self.config = SimpleNamespace(vocab_size=16)
        self.threads_seen: set[int] = set()

    def forward(self, input_ids: torch.Tensor, use_cache: bool = False, past_key_values: object = None, **_: object) -> CausalLMOutputWithPast:
        self.threads_seen.add(torch.get_num_threads())
        Clock.now += self.ms / 1000
        return CausalLMOutputWithPast(logits=torch.zeros(*input_ids.shape, 16), past_key_values=past_key_values or ())


def slow(ms: float) -> Subject:
    return Subject(model=SlowModel(ms), tokenizer=None, model_name=f"slow{ms}")


@pytest.fixture
def lock(tmp_path, monkeypatch):
    """A private lock file, and the stand-in clock in place of the timing module's wall clock."""
    import paretolab.measure.timing

    monkeypatch.setenv("PARETOLAB_TIMING_LOCK", str(tmp_path / "timing.lock"))
    monkeypatch.setattr(paretolab.measure.timing, "time", SimpleNamespace(perf_counter=Clock.perf_counter, process_time=time.process_time))


def test_speedup_is_base_time_over_method_time(ctx, lock):
    ctx.base = slow(20)
    out = Latency().measure(slow(10), LatencyOptions(**FAST), ctx)
    assert out["prefill_speedup"] == pytest.approx(2) and out["decode_speedup"] == pytest.approx(2)
    assert out["prefill_ms"] == pytest.approx(10) and out["base_prefill_ms"] == pytest.approx(20)
    assert out["decode_tok_s"] == pytest.approx(100) and out["base_decode_tok_s"] == pytest.approx(50)
    assert out["prefill_ms_iqr"] == pytest.approx(0) and out["prefill_speedup_iqr"] == pytest.approx(0)


def test_cpu_speedup_counts_compute_not_waiting(ctx, lock):
    ctx.base = slow(20)
    out = Latency().measure(slow(10), LatencyOptions(**FAST), ctx)
    # the stand-in takes time without computing: the CPU ratio does not see its 2x
    assert out["prefill_speedup"] == pytest.approx(2) and abs(out["prefill_cpu_speedup"] - 2) > 0.3


def test_a_slower_method_reads_below_one(ctx, lock):
    ctx.base = slow(5)
    out = Latency().measure(slow(15), LatencyOptions(**FAST), ctx)
    assert out["prefill_speedup"] == pytest.approx(1 / 3) and out["decode_speedup"] == pytest.approx(1 / 3)


def test_without_a_base_there_is_no_speedup(ctx, lock):
    out = Latency().measure(slow(2), LatencyOptions(**FAST), ctx)
    assert "prefill_speedup" not in out and out["prefill_ms"] == pytest.approx(2)


def test_threads_fixed_to_the_trials_cpus_while_timing(ctx, lock):
    before = torch.get_num_threads()
    ctx.cpus, ctx.base = 3, slow(1)
    subject = slow(1)
    Latency().measure(subject, LatencyOptions(**FAST), ctx)
    assert subject.model.threads_seen == {3} and ctx.base.model.threads_seen == {3}
    assert torch.get_num_threads() == before


def test_timings_on_one_node_take_turns(tmp_path):
    path = tmp_path / "timing.lock"
    held: list[tuple[float, float]] = []

    def timing() -> None:
        with node_lock(path):
            start = time.perf_counter()
            time.sleep(0.2)
            held.append((start, time.perf_counter()))

    threads = [threading.Thread(target=timing) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    held.sort()
    assert all(a_end <= b_start for (_, a_end), (b_start, _) in zip(held, held[1:]))


def test_rounds_stop_when_settled_or_capped():
    steady = time_paired(lambda: time.sleep(0.005), lambda: time.sleep(0.01), min_rounds=3, max_rounds=50, max_s=30, target=10.0)
    assert len(steady.method) == 3 and len(steady.base) == 3  # settled at the minimum
    noisy = iter([0.001, 0.02] * 100)
    capped = time_paired(lambda: time.sleep(next(noisy)), None, min_rounds=5, max_rounds=50, max_s=0.2, target=0.01)
    assert 3 <= len(capped.method) < 50 and relative_spread(capped.method) > 0.01


def test_cpu_name_says_which_cpu_timed_a_benchmark(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\ncpu family\t: 23\nmodel\t\t: 1\nmodel name\t: AMD EPYC 7551\n\nprocessor\t: 1\nmodel name\t: other\n")
    real = Path

    monkeypatch.setattr("paretolab.measure.timing.Path", lambda p: info if p == "/proc/cpuinfo" else real(p))
    assert cpu_name() == "AMD EPYC 7551 (family 23, model 1)"
    monkeypatch.setattr("paretolab.measure.timing.Path", lambda p: tmp_path / "missing")
    assert cpu_name()  # no /proc/cpuinfo: platform's name, never an error
