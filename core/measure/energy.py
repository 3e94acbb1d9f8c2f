"""Energy per trial stage: NVML on a GPU, RAPL where readable, else an estimate from CPU time.

A stage's energy is the difference of cumulative counters read at its start and end:
NVML's total-energy counter per GPU (through ``nvidia-ml-py``, NVIDIA's maintained binding)
and the kernel's RAPL counters per CPU package (``/sys/class/powercap/intel-rapl:N/energy_uj``,
wrap-around handled). The windows follow Zeus's ``ZeusMonitor`` (``begin_window`` /
``end_window``, named and overlapping). Zeus itself was the first choice and was tried: its
hard dependency ``amdsmi`` makes Ray fail to start on a machine without ROCm's
``libamd_smi.so`` (Ray imports ``amdsmi`` when it is installed; seen here as ``ray start``
dying with ``KeyError: 'libamd_smi.so'``), so it cannot be a dependency of a Ray tool.
CodeCarbon samples power on a timer for emissions reports and writes its own files, where a
stage needs a counter read at its edges. Without a GPU and without readable RAPL (containers,
most VMs, this development machine), the energy is estimated: the process's CPU seconds times
``PARETOLAB_WATTS_PER_CORE`` (default below). Every trial records which it was as
``energy_source``: ``nvml`` (the trial's GPUs), ``rapl`` (the CPU packages: everything running
on them, not only this trial) or ``estimate``.
"""

from __future__ import annotations

import glob
import os
import time
from collections.abc import Callable
from functools import lru_cache
from pathlib import Path
from typing import Any, NamedTuple

from paretolab.errors import ConfigError

WATTS_ENV = "PARETOLAB_WATTS_PER_CORE"
# Intel Xeon Platinum 8380: 270 W TDP over 40 cores (Intel ARK), a busy server core at full load.
# A rough figure: it leaves out DRAM, idle and uncore power, and a laptop core draws less.
DEFAULT_WATTS_PER_CORE = 6.75
SOURCES = ("nvml", "rapl", "estimate")


def is_energy_metric(name: str) -> bool:
    """A metric in joules, to be marked where the energy was estimated: energy_j, stage_energy_j.*, *_energy_j, *_j_per_token."""
    return name == "energy_j" or name.startswith("stage_energy_j.") or name.endswith(("_energy_j", "_j_per_token"))


def watts_per_core() -> float:
    """The estimate's watts per busy core: ``$PARETOLAB_WATTS_PER_CORE`` or the default."""
    raw = os.environ.get(WATTS_ENV, "")
    if not raw:
        return DEFAULT_WATTS_PER_CORE
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise ConfigError(f"{WATTS_ENV}: expected watts per busy core > 0, got {raw!r}; unset it for the default {DEFAULT_WATTS_PER_CORE}")
    return value


def choose_source(monitor: Any, *, gpu: bool) -> str:
    """``nvml`` when the trial uses a GPU the monitor reads, else ``rapl`` when it reads CPU packages, else ``estimate``."""
    if monitor is None:
        return "estimate"
    if gpu and list(getattr(monitor, "gpu_indices", [])):
        return "nvml"
    if list(getattr(monitor, "cpu_indices", [])):
        return "rapl"
    return "estimate"


class Measurement(NamedTuple):
    """Joules of one window, per GPU and per CPU package (Zeus's ``Measurement`` fields)."""

    gpu_energy: dict[int, float]
    cpu_energy: dict[int, float] | None
    dram_energy: dict[int, float] | None = None


class CounterMonitor:
    """Named, overlapping windows over cumulative energy counters (in joules), GPUs' and CPU packages'.

    ``gpus`` and ``cpus`` map an index to a function returning the counter now; ``wrap`` gives a
    counter's range where it wraps around (RAPL's ``max_energy_range_uj``).
    """

    def __init__(self, gpus: dict[int, Callable[[], float]], cpus: dict[int, Callable[[], float]], wrap: dict[int, float] | None = None) -> None:
        self.gpus, self.cpus, self.wrap = gpus, cpus, wrap or {}
        self.gpu_indices, self.cpu_indices = list(gpus), list(cpus)
        self._start: dict[str, tuple[dict[int, float], dict[int, float]]] = {}

    def _read(self) -> tuple[dict[int, float], dict[int, float]]:
        return {i: f() for i, f in self.gpus.items()}, {i: f() for i, f in self.cpus.items()}

    def begin_window(self, key: str) -> None:
        self._start[key] = self._read()

    def end_window(self, key: str) -> Measurement:
        (g0, c0), (g1, c1) = self._start.pop(key), self._read()
        cpu = {i: (c1[i] - c0[i]) % self.wrap[i] if i in self.wrap else c1[i] - c0[i] for i in c1}
        return Measurement({i: g1[i] - g0[i] for i in g1}, cpu or None)


@lru_cache(maxsize=1)
def counter_monitor() -> CounterMonitor:
    """The counters this worker process can read: NVML for its visible GPUs, RAPL for the CPU packages."""
    gpus = _nvml_counters()
    cpus, wrap = _rapl_counters()
    return CounterMonitor(gpus, cpus, wrap)


def _nvml_counters() -> dict[int, Callable[[], float]]:
    """NVML's energy counter (mJ since the driver loaded, Volta and later) for each GPU CUDA lets this process see."""
    try:
        import pynvml

        pynvml.nvmlInit()
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        names = [v.strip() for v in visible.split(",") if v.strip()] if visible is not None else [str(i) for i in range(pynvml.nvmlDeviceGetCount())]
        handles = [pynvml.nvmlDeviceGetHandleByIndex(int(n)) if n.isdigit() else pynvml.nvmlDeviceGetHandleByUUID(n) for n in names]
        for h in handles:
            pynvml.nvmlDeviceGetTotalEnergyConsumption(h)  # raises where the GPU has no counter
    except Exception:  # no driver, no GPU, an old GPU: no NVML reading
        return {}
    return {i: (lambda h=h: pynvml.nvmlDeviceGetTotalEnergyConsumption(h) / 1000.0) for i, h in enumerate(handles)}


def _rapl_counters(root: str = "/sys/class/powercap") -> tuple[dict[int, Callable[[], float]], dict[int, float]]:
    """RAPL's package counters (µJ in sysfs) that this process may read, and where each wraps."""
    counters: dict[int, Callable[[], float]] = {}
    wrap: dict[int, float] = {}
    for path in sorted(glob.glob(f"{root}/intel-rapl:*/energy_uj")):
        zone = Path(path).parent
        if zone.name.count(":") != 1 or not os.access(path, os.R_OK):
            continue  # sub-zones (core, dram) are inside their package's count
        try:
            index = int(zone.name.split(":")[1])
            wrap[index] = int((zone / "max_energy_range_uj").read_text()) / 1e6
            counters[index] = lambda p=Path(path): int(p.read_text()) / 1e6
            counters[index]()
        except (OSError, ValueError):
            counters.pop(index, None)
            wrap.pop(index, None)
    return counters, wrap


class EnergyMeter:
    """Joules of named windows (a trial and its stages) from the source ``choose_source`` picks."""

    def __init__(self, monitor: Any = None, *, gpu: bool = False) -> None:
        self.monitor = monitor
        self.source = choose_source(monitor, gpu=gpu)
        self.watts = watts_per_core() if self.source == "estimate" else 0.0
        self.joules: dict[str, float] = {}
        self._open: dict[str, float] = {}
        self._prefix = f"paretolab-{id(self)}-"  # the monitor is shared by the process's meters

    @classmethod
    def for_this_process(cls) -> EnergyMeter:
        """The meter a trial uses: NVML or RAPL counters where they can be read, the estimate otherwise."""
        import torch

        return cls(counter_monitor(), gpu=torch.cuda.is_available())

    def begin(self, name: str) -> None:
        if self.source == "estimate":
            self._open[name] = time.process_time()
        else:
            self.monitor.begin_window(self._prefix + name)
            self._open[name] = 0.0

    def end(self, name: str) -> float:
        """Close window ``name``; returns (and keeps in ``joules``) its energy."""
        if name not in self._open:
            return 0.0
        started = self._open.pop(name)
        if self.source == "estimate":
            joules = (time.process_time() - started) * self.watts
        else:
            m = self.monitor.end_window(self._prefix + name)
            parts = m.gpu_energy if self.source == "nvml" else {**(m.cpu_energy or {}), **{f"dram{k}": v for k, v in (m.dram_energy or {}).items()}}
            joules = float(sum(parts.values()))
        self.joules[name] = joules
        return joules

    def close(self) -> None:
        """End windows left open by a stage that raised (their energy is dropped)."""
        for name in list(self._open):
            self.end(name)
            self.joules.pop(name, None)

