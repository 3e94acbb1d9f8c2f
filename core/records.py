"""The plain records that travel between the driver, the workers and the hooks.

This module imports nothing of paretolab's, so the hook specifications, the trial runner and the
plugin manager can all use these types without importing one another.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class TrialInfo:
    """What the driver knows of a trial when it starts (passed to the trial hooks)."""

    study: str
    number: int
    plan: list[Any]  # paretolab.search.StagePlan, one per stage
    params: dict[str, Any]


@dataclass
class TrialResult:
    """What a worker sends back: metrics or the failure, timings, artifacts (as bytes)."""

    metrics: dict[str, float] = field(default_factory=dict)
    stage_s: dict[str, float] = field(default_factory=dict)
    stage_energy_j: dict[str, float] = field(default_factory=dict)
    info: dict[str, Any] = field(default_factory=dict)
    simulated_by: list[str] = field(default_factory=list)
    artifacts: dict[str, bytes] = field(default_factory=dict)
    history: dict[str, list[tuple[int, float]]] = field(default_factory=dict)  # metric -> [(step, value)], e.g. curve.val_loss by tokens
    error: str | None = None  # one line: the reason
    traceback: str | None = None
    worker: str = ""
    pruned_at: int | None = None  # the step at which the study's pruner stopped the trial (None: it ran to the end)

    @property
    def failed(self) -> bool:
        return self.error is not None

    @property
    def pruned(self) -> bool:
        return self.pruned_at is not None and self.error is None


@dataclass
class TrialSettings:
    """Everything a worker needs besides the base subject (plain data, travels to Ray workers)."""

    study: str
    task: str
    task_options: dict[str, Any]
    measures: dict[str, dict[str, Any]] | None
    seed: int
    cpus: float = 0.0  # resources.cpus: the threads a timing may use (0: leave torch's setting)
    timeout_s: float = 0.0  # search.trial_timeout_s (0: none): a training stage stops in time for the trial to finish
    models: dict[str, str] = field(default_factory=dict)  # the pipeline's `models:`, role -> model name (loaded once per worker)
    prices: dict[str, float] = field(default_factory=dict)  # role -> price per token (simulated cost)
    split: dict[str, Any] | None = None  # the pipeline's confirm split and the part scored: {share, seed, part} (None: all examples)


@dataclass(frozen=True)
class StagePlan:
    """One stage of one trial: which method runs, with which parameters (unprefixed)."""

    stage: str
    method: str
    params: dict[str, Any]
    # A per-layer stage: layer group -> its own values over ``params`` (None: the group is left as it is, ``keep``);
    # empty for a stage with one setting for the whole model. See paretolab.plugin_api.layers for the group names.
    layers: dict[str, dict[str, Any] | None] = field(default_factory=dict)
