"""Cost measurement: timing that survives a busy machine, energy per stage, peak memory, and the built-in measures.

- :mod:`paretolab.measure.timing` — one timing at a time per node, fixed threads, paired repeats against the base.
- :mod:`paretolab.measure.energy` — NVML, RAPL or a labelled estimate, per named window.
- :mod:`paretolab.measure.memory` — the trial's peak resident memory, sampled.
- :mod:`paretolab.measure.measures` — ``Measure`` and the built-in measures (params, size, latency).
"""

from paretolab.measure.measures import Measure, NoOptions

__all__ = ["Measure", "NoOptions"]
