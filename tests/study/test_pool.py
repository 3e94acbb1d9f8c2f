"""The trial workers' pool: a worker the driver lost is killed, whatever Ray says of it."""
from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import ray

from paretolab.study.pool import WorkerPool


class _Worker:
    def __init__(self, name: str) -> None:
        self.name = name
        self.ready = SimpleNamespace(remote=lambda: f"{name}.ready")


def _pool(workers: int) -> WorkerPool:
    pool = object.__new__(WorkerPool)  # no actor class: the pool's bookkeeping only
    pool.resources = SimpleNamespace(workers=workers, cpus=1.0, gpus=0.0, memory_gb=None)
    pool.idle, pool.busy, pool.starting, pool.everyone = [], 0, {}, []
    made = iter(range(100))
    pool._new = lambda: _Worker(f"replacement-{next(made)}")  # type: ignore[method-assign]
    return pool


def test_a_worker_ray_called_dead_is_killed_before_its_replacement_starts(monkeypatch: Any) -> None:
    # A worker whose process was stopped past Ray's keepalive is reported dead, then comes back holding its CPUs:
    # unless it is killed, the replacement waits for them forever and the study hangs with no message.
    killed: list[str] = []
    monkeypatch.setattr(ray, "kill", lambda worker, no_restart=True: killed.append(worker.name))
    pool = _pool(workers=1)
    first = _Worker("first")
    pool.idle.append(first)
    pool.lost(pool.take())
    assert killed == ["first"]
    assert list(pool.starting.values())[0].name == "replacement-0"


def test_a_worker_already_gone_is_replaced_all_the_same(monkeypatch: Any) -> None:
    def gone(worker: Any, no_restart: bool = True) -> None:
        raise ValueError("actor handle of a dead actor")

    monkeypatch.setattr(ray, "kill", gone)
    pool = _pool(workers=1)
    pool.idle.append(_Worker("first"))
    pool.lost(pool.take())
    assert pool.busy == 0 and len(pool.starting) == 1
