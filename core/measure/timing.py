"""Timing that survives a busy machine: one timing at a time per node, fixed threads, paired repeats.

Two trials that time themselves at once on the same cores slow each other down by whatever the
other happens to run, so a latency can differ many-fold between identical models. Here:

- ``node_lock`` serialises timings on a node (an ``fcntl`` lock on a file in the node's temporary
  directory, which every Ray worker on that node shares; held only while timing);
- ``torch_threads`` fixes torch's intra-op threads to the trial's ``resources.cpus``;
- ``time_paired`` alternates the method's run with the unmodified model's run (order flipped each
  round) until the spread is small or a time cap is hit. Load that comes and goes hits both runs
  of a round alike, so their ratio (the speedup) survives it better than either time.
"""

from __future__ import annotations

import os
import platform
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import torch

from paretolab.data.files import file_lock

LOCK_ENV = "PARETOLAB_TIMING_LOCK"
LOCK_NAME = "paretolab-timing.lock"
MIN_CAPPED_ROUNDS = 3


def lock_path() -> Path:
    """The node-local lock file: ``$PARETOLAB_TIMING_LOCK`` or ``paretolab-timing.lock`` in the temp dir."""
    return Path(os.environ.get(LOCK_ENV) or Path(tempfile.gettempdir()) / LOCK_NAME)


def node_lock(path: Path | None = None) -> AbstractContextManager[float]:
    """Hold the node's timing lock while the block runs; yields the seconds spent waiting for it."""
    return file_lock(path or lock_path())


def cpu_name() -> str:
    """The CPU a timing ran on, for a benchmark's JSON: Linux's model name with its family/model numbers, else platform's."""
    try:
        fields: dict[str, str] = {}
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            fields.setdefault(key.strip(), value.strip())
            if not line.strip() and fields:
                break  # the first processor's block is enough
        name = fields.get("model name") or platform.processor() or "unknown"
        if "cpu family" in fields and "model" in fields:
            name += f" (family {fields['cpu family']}, model {fields['model']})"
        return name
    except OSError:
        return platform.processor() or platform.machine() or "unknown"


def machine_load() -> float:
    """The machine's 1-minute load average (``info.load_1m``: the larger of the trial's start and end), 0 where unknown.

    A timed trial beside other work measures the contention as much as the method: the documents print it.
    """
    try:
        return os.getloadavg()[0]
    except OSError:
        return 0.0


def settle_allocator() -> None:
    """Let glibc finish sorting what earlier code freed (a dropped tokenizer, say) before a clock starts.

    Dropping a tokenizer (HF's or tiktoken's vocabulary maps, an encode's strings) frees hundreds of
    thousands of chunks; glibc sorts them on later allocations, at most 10,000 per ``malloc`` call,
    so the next few mid-size allocations each cost ~2.5 ms of CPU, whoever makes them: that was the
    fixed 5-10 ms on every first-seen call (ours, HF's and tiktoken's) that made 20 kB look 10x
    dearer per byte than 2 MB (measured with _fast.c's IBPE_PROFILE phase timers: the ids buffer
    and the result list's allocations). Allocations of varied sizes until three in a row are quick.
    """
    quick = 0
    for k in range(5000):
        start = time.perf_counter()
        bytearray(40_000 + (k * 7919) % 60_000)
        quick = quick + 1 if time.perf_counter() - start < 30e-6 else 0
        if quick == 3:
            return


@contextmanager
def torch_threads(n: int) -> Iterator[None]:
    """Run the block with ``n`` torch intra-op threads (``n`` < 1 leaves the setting alone)."""
    before = torch.get_num_threads()
    if n >= 1:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def spread(values: list[float]) -> float:
    """Interquartile range of ``values`` (0 for fewer than two)."""
    if len(values) < 2:
        return 0.0
    q1, _, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return q3 - q1


def relative_spread(values: list[float]) -> float:
    """IQR / median: the spread a ranking has to beat."""
    middle = statistics.median(values) if values else 0.0
    return spread(values) / middle if middle else float("inf")


@dataclass
class Paired:
    """Wall seconds per run of the method and, when timed, of the unmodified model, in rounds; and the
    process's CPU seconds over the same runs (on a CPU, time spent waiting for a core is not in them)."""

    method: list[float] = field(default_factory=list)
    base: list[float] = field(default_factory=list)
    method_cpu: list[float] = field(default_factory=list)
    base_cpu: list[float] = field(default_factory=list)

    @property
    def ratios(self) -> list[float]:
        """Per round, base time / method time (> 1: the method is faster)."""
        return [b / m for b, m in zip(self.base, self.method) if m > 0]

    @property
    def cpu_ratios(self) -> list[float]:
        """Per round, base CPU seconds / method CPU seconds."""
        return [b / m for b, m in zip(self.base_cpu, self.method_cpu) if m > 0]

    def settled(self, target: float) -> bool:
        """Whether the method's times and, with a base, the paired ratios spread at most ``target``."""
        return relative_spread(self.method) <= target and (not self.base or relative_spread(self.ratios) <= target)


def time_paired(
    method: Callable[[], None],
    base: Callable[[], None] | None,
    *,
    min_rounds: int,
    max_rounds: int,
    max_s: float,
    target: float,
    sync: Callable[[], None] = lambda: None,
) -> Paired:
    """Time ``method`` (and ``base``, alternating, order flipped each round) until settled or capped.

    Runs at least ``min_rounds`` rounds, then stops once ``Paired.settled(target)`` or after
    ``max_rounds`` rounds; past ``max_s`` seconds it stops as soon as it has three rounds.
    """
    out = Paired()
    start = time.perf_counter()
    for round_ in range(max(1, max_rounds)):
        order = [(method, out.method, out.method_cpu)] + ([(base, out.base, out.base_cpu)] if base is not None else [])
        for fn, times, cpu in order if round_ % 2 == 0 else reversed(order):
            sync()
            t0, c0 = time.perf_counter(), time.process_time()
            fn()
            sync()
            times.append(time.perf_counter() - t0)
            cpu.append(time.process_time() - c0)
        done = round_ + 1
        if done >= min_rounds and out.settled(target):
            break
        if done >= min(MIN_CAPPED_ROUNDS, min_rounds) and time.perf_counter() - start >= max_s:
            break  # a slow model under the cap still gets a median of three
    return out
