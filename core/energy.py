"""Energy per trial stage: NVML on a GPU, RAPL where readable, else an estimate from CPU time.

The meter is Zeus's ``ZeusMonitor`` (https://ml.energy/zeus): it reads NVML's energy counters
for the visible GPUs and the RAPL counters under ``/sys/class/powercap`` for the CPU packages,
and measures named, overlapping windows, which is the shape of a trial's stages. CodeCarbon
was the alternative; it samples power on a timer for emissions reports and writes its own
files, where a stage needs a counter read at its start and end. Without a GPU and without
readable RAPL (containers, most VMs, this development machine), the energy is estimated:
the process's CPU seconds times ``PARETOLAB_WATTS_PER_CORE`` (default below). Every trial
records which it was as ``energy_source``: ``nvml`` (the trial's GPUs only), ``rapl`` (the
CPU packages: everything running on them, not only this trial) or ``estimate``.
"""

from __future__ import annotations

import os
import time
from functools import lru_cache
from typing import Any

from paretolab.errors import ConfigError

WATTS_ENV = "PARETOLAB_WATTS_PER_CORE"
# Intel Xeon Platinum 8380: 270 W TDP over 40 cores (Intel ARK), a busy server core at full load.
# A rough figure: it leaves out DRAM, idle and uncore power, and a laptop core draws less.
DEFAULT_WATTS_PER_CORE = 6.75
SOURCES = ("nvml", "rapl", "estimate")


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


@lru_cache(maxsize=1)
def zeus_monitor() -> Any:
    """One ZeusMonitor per worker process (None when Zeus is not installed)."""
    try:
        from zeus.monitor import ZeusMonitor
    except ImportError:
        return None
    # approx_instant_energy: a window shorter than NVML's counter update reads power x time instead of 0
    return ZeusMonitor(approx_instant_energy=True)


class EnergyMeter:
    """Joules of named windows (a trial and its stages) from the source ``choose_source`` picks."""

    def __init__(self, monitor: Any = None, *, gpu: bool = False) -> None:
        self.monitor = monitor
        self.source = choose_source(monitor, gpu=gpu)
        self.watts = watts_per_core() if self.source == "estimate" else 0.0
        self.joules: dict[str, float] = {}
        self._open: dict[str, float] = {}
        self._prefix = f"paretolab-{id(self)}-"  # Zeus windows are global to the monitor

    @classmethod
    def for_this_process(cls) -> EnergyMeter:
        """The meter a trial uses: Zeus's monitor where NVML or RAPL can be read, the estimate otherwise."""
        import torch

        gpu = torch.cuda.is_available()
        return cls(zeus_monitor() if gpu or _rapl_present() else None, gpu=gpu)

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


def _rapl_present() -> bool:
    """Whether a RAPL counter is readable (Zeus is imported only where it can read something)."""
    import glob

    return any(os.access(p, os.R_OK) for p in glob.glob("/sys/class/powercap/intel-rapl:*/energy_uj"))
