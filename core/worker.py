"""The Ray actor that runs trials: it loads the base model once and copies it for each trial."""

from __future__ import annotations

import os
import socket
from typing import Any

from paretolab.search import StagePlan
from paretolab.trial import TrialResult, TrialSettings, run_trial


class TrialWorker:
    """Holds one base subject; ``run`` executes a trial plan on a private copy of it."""

    def __init__(self, model: str, settings: TrialSettings) -> None:
        from paretolab.models import load_subject

        self.settings = settings
        self.base = load_subject(model)
        self.name = f"{socket.gethostname()}:{os.getpid()}"
        self.placement = _placement()

    def ready(self) -> str:
        return self.name

    def run(self, plan: list[StagePlan], number: int) -> TrialResult:
        result = run_trial(self.base, plan, self.settings, number)
        result.worker = self.name
        result.info.update(self.placement)
        return result


def _placement() -> dict[str, str]:
    """The Ray node and GPUs this worker runs on (logged with each trial as ``info.ray_node``, ``info.gpu_ids``)."""
    try:
        import ray

        context = ray.get_runtime_context()
        return {"ray_node": context.get_node_id(), "gpu_ids": ",".join(str(g) for g in ray.get_gpu_ids())}
    except Exception:  # run outside Ray (tests call the class directly)
        return {}


def remote_worker_class(cpus: float, gpus: float, memory_gb: float | None) -> Any:
    """TrialWorker as a Ray actor class with the pipeline's per-trial resources."""
    import ray

    options: dict[str, Any] = {"num_cpus": cpus, "num_gpus": gpus, "max_restarts": 0, "max_concurrency": 1}
    if memory_gb:
        options["memory"] = int(memory_gb * 2**30)
    return ray.remote(**options)(TrialWorker)
