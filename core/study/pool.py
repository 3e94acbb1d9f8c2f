"""The trial workers of one study: as many as the cluster's nodes can hold, replaced when one dies.

Ray places each worker (an actor with the pipeline's per-trial ``resources``), so a GPU trial only
starts on a node with a free GPU. The pool counts what fits node by node (two nodes with 1.5 GPUs
each hold two one-GPU trials, not three) and never hands a trial to a replacement worker before
it has loaded the model: after a node leaves, the trials go to the workers that are left.
"""

from __future__ import annotations

import math
from typing import Any

from paretolab.errors import ConfigError, ParetolabError, first_line
from paretolab.records import TrialSettings
from paretolab.study.spec import Resources


def node_slots(resources: Resources, nodes: list[dict[str, Any]]) -> int:
    """How many trials with ``resources`` fit at once on the alive ``nodes`` (``ray.nodes()`` rows)."""
    total = 0
    for node in nodes:
        if not node.get("Alive"):
            continue
        have = node.get("Resources") or {}
        fits = [_times(have.get("CPU", 0.0), resources.cpus)]
        if resources.gpus:
            fits.append(_times(have.get("GPU", 0.0), resources.gpus))
        if resources.memory_gb:
            fits.append(_times(have.get("memory", 0.0) / 2**30, resources.memory_gb))
        total += min(fits)
    return total


def _times(have: float, need: float) -> int:
    return math.floor(have / need + 1e-9) if need > 0 else 10**6


class WorkerPool:
    """Idle, busy and starting trial workers; the driver takes idle ones and gives them back."""

    def __init__(self, model: str, settings: TrialSettings, resources: Resources) -> None:
        from paretolab.study.worker import remote_worker_class

        self.model = model
        self.settings = settings
        self.resources = resources
        self.cls = remote_worker_class(resources.cpus, resources.gpus, resources.memory_gb)
        self.idle: list[Any] = []
        self.busy = 0
        self.starting: dict[Any, Any] = {}  # ready() ref -> worker still loading the model
        self.everyone: list[Any] = []

    def size_for(self, remaining: int) -> int:
        """Concurrent trials: ``resources.workers`` or what the cluster's nodes hold, at most ``remaining``."""
        import ray

        r = self.resources
        if r.workers:
            return max(1, min(r.workers, remaining))
        slots = node_slots(r, ray.nodes())
        if slots == 0:
            gpus = ray.cluster_resources().get("GPU", 0.0)
            if r.gpus and gpus < r.gpus:
                raise ConfigError(f"resources.gpus: each trial needs {r.gpus:g} GPU(s) but the Ray cluster has {gpus:g}")
            raise ConfigError(
                f"resources: no node of the Ray cluster has cpus={r.cpus:g}, gpus={r.gpus:g}, memory_gb={r.memory_gb} free "
                "for one trial; lower them or add a bigger node"
            )
        return max(1, min(slots, remaining))

    def start(self, n: int) -> list[str]:
        """Start ``n`` workers and wait until each has loaded the model; returns their names."""
        import ray

        workers = [self._new() for _ in range(n)]
        try:
            names = ray.get([w.ready.remote() for w in workers])
        except ray.exceptions.RayActorError as exc:
            cause = exc.__cause__ or exc
            raise ParetolabError(f"a trial worker could not load the model: {first_line(cause)}") from exc
        self.idle.extend(workers)
        return list(names)

    def take(self) -> Any:
        self.busy += 1
        return self.idle.pop()

    def give_back(self, worker: Any) -> None:
        self.busy -= 1
        self.idle.append(worker)

    def lost(self, worker: Any) -> None:
        """A busy worker died, stopped answering or timed out: kill it, and start a replacement if the cluster has room.

        Killed even when Ray already calls it dead: an actor that missed its keepalive (its process stopped a while)
        may come back and hold its CPUs, and the replacement would then wait for them forever, the study hanging.
        """
        import ray

        self.busy -= 1
        try:
            ray.kill(worker, no_restart=True)
        except Exception:  # noqa: BLE001 - already gone: nothing to free
            pass
        alive = self.busy + len(self.idle) + len(self.starting)
        if alive == 0 or self._room():
            replacement = self._new()
            self.starting[replacement.ready.remote()] = replacement

    def _room(self) -> bool:
        import ray

        if self.resources.workers:
            return True
        return node_slots(self.resources, ray.nodes()) > self.busy + len(self.idle) + len(self.starting)

    def poll(self) -> list[str]:
        """Move replacements that finished loading into the idle list; returns problems seen."""
        import ray

        problems = []
        if self.starting:
            ready, _ = ray.wait(list(self.starting), num_returns=len(self.starting), timeout=0)
            for ref in ready:
                worker = self.starting.pop(ref)
                try:
                    ray.get(ref)
                    self.idle.append(worker)
                except ray.exceptions.RayError as exc:
                    problems.append(f"a replacement worker failed to start: {first_line(exc)}")
                    if not (self.idle or self.busy or self.starting):
                        again = self._new()
                        self.starting[again.ready.remote()] = again
        return problems

    def can_run(self) -> bool:
        """Whether any worker is idle, busy or on its way."""
        return bool(self.idle or self.busy or self.starting)

    def shutdown(self) -> None:
        import ray

        for worker in self.everyone:
            try:
                ray.kill(worker, no_restart=True)
            except Exception:
                pass

    def _new(self) -> Any:
        worker = self.cls.remote(self.model, self.settings, self.resources.gpus)
        self.everyone.append(worker)
        return worker
