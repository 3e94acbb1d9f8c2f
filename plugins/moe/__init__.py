"""Mixture-of-experts compression: the ``tiny-moe`` test bed, RFID-MoE, PuzzleMoE and their baselines.

- :mod:`.testbed` — ``tiny-moe`` (a Qwen3-MoE trained here from scratch; ``paretolab models pull tiny-moe``) and ``tiny-moe-random``;
- :mod:`.corpus` — the mixed-domain corpora ``moe-mix-train`` / ``-val`` / ``-calib``;
- :mod:`.experts` — fused expert weights, routing frequency on calibration text, swapping the experts module;
- :mod:`.metrics` — the ``expert_memory`` measure (``expert_bytes``, ``expert_mem_frac``);
- :mod:`.rfid` — ``rfid_moe`` and ``svd_moe``; :mod:`.puzzle` — ``puzzle_moe``, ``expert_drop``, ``expert_average``, ``msmoe``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from paretolab.plugin_api.hookspec import hookimpl


@hookimpl
def register_models(register: Callable[[Any], None]) -> None:
    from paretolab.plugins.moe.testbed import SOURCES

    for source in SOURCES:
        register(source)


@hookimpl
def register_methods(register: Callable[[Any], None]) -> None:
    from paretolab.plugins.moe.puzzle import ExpertAverage, ExpertDrop, MSmoe, PuzzleMoe
    from paretolab.plugins.moe.rfid import RfidMoe, SvdMoe

    for method in (RfidMoe(), SvdMoe(), PuzzleMoe(), ExpertDrop(), ExpertAverage(), MSmoe()):
        register(method)


@hookimpl
def register_measures(register: Callable[[Any], None]) -> None:
    from paretolab.plugins.moe.metrics import ExpertMemory

    register(ExpertMemory())


@hookimpl
def register_metrics(register: Callable[[Any], None]) -> None:
    from paretolab.plugins.moe.metrics import METRICS

    for metric in METRICS:
        register(metric)
