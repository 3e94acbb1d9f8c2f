"""The Ray actor that runs trials: it loads the base model once, on the trial's device, and copies it for each trial."""

from __future__ import annotations

import os
import socket
from typing import Any

import torch

from paretolab.errors import ConfigError
from paretolab.measure.timing import machine_load
from paretolab.records import StagePlan, TrialResult, TrialSettings
from paretolab.study.trial import run_trial


class TrialWorker:
    """Holds one base subject; ``run`` executes a trial plan on a private copy of it.

    The pipeline's ``models:`` (``settings.models``, by role) are loaded here once, beside the base
    (a role naming the base model shares the base itself), and handed to every trial read-only as
    ``ctx.models``: no trial reloads or copies them.

    With ``gpus > 0`` the base model sits on the GPU Ray assigned (its only visible one), so every
    trial's copy, inputs, kernels and measures run there.
    """

    def __init__(self, model: str, settings: TrialSettings, gpus: float = 0.0) -> None:
        from paretolab.models import load_subject

        self.settings = settings
        self.base = load_subject(model).to(trial_device(gpus))
        self.roles = load_roles(settings.models, model, self.base)
        self.name = f"{socket.gethostname()}:{os.getpid()}"
        self.placement = {**_placement(), **machine(self.base.device), "device": str(self.base.device)}

    def ready(self) -> str:
        return self.name

    def run(self, plan: list[StagePlan], number: int, board: Any = None) -> TrialResult:
        """Run one trial; with ``board`` (the study's PruneBoard actor) its reports go to the pruner, which may stop it."""
        report = None
        if board is not None:
            import ray

            def report(step: int, values: dict[str, float]) -> bool:
                return bool(ray.get(board.report.remote(number, step, values)))

        load_before = machine_load()
        result = run_trial(self.base, plan, self.settings, number, roles=self.roles, report=report)
        result.worker = self.name
        result.info.update(self.placement)
        result.info["load_1m"] = f"{max(load_before, machine_load()):.2f}"  # the larger end: contention any time in between
        return result


def load_roles(models: dict[str, str], base_name: str, base: Any) -> dict[str, Any]:
    """Each role's Subject, loaded once on the base's device; a model named twice (or the base's) is loaded once."""
    from paretolab.models import load_subject

    loaded: dict[str, Any] = {base_name: base}
    for name in models.values():
        if name not in loaded:
            loaded[name] = load_subject(name).to(base.device)
            loaded[name].model.eval()
    return {role: loaded[name] for role, name in models.items()}


def _placement() -> dict[str, str]:
    """The Ray node and GPUs this worker runs on (logged with each trial as ``info.ray_node``, ``info.gpu_ids``)."""
    try:
        import ray

        if not ray.is_initialized():  # outside Ray (tests call the class directly): asking would start a whole local Ray
            return {}
        context = ray.get_runtime_context()
        return {"ray_node": context.get_node_id(), "gpu_ids": ",".join(str(g) for g in ray.get_gpu_ids())}
    except Exception:  # run outside Ray (tests call the class directly)
        return {}


def machine(device: torch.device) -> dict[str, str]:
    """What the trial ran on, for the provenance of results (``info.cpu``, ``info.cores``, ``info.gpu``)."""
    from paretolab.measure.timing import cpu_name

    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 0
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else "none"
    return {"cpu": cpu_name(), "cores": str(cores), "gpu": gpu}


def trial_device(gpus: float) -> torch.device:
    """Where a trial with ``gpus`` GPUs runs: the first visible CUDA device (Ray sets CUDA_VISIBLE_DEVICES), else the CPU."""
    if gpus <= 0:
        return torch.device("cpu")
    if not torch.cuda.is_available():
        if os.environ.get("PARETOLAB_SIMULATED_GPUS"):  # a local test cluster's declared GPUs (see localcluster)
            return torch.device("cpu")
        why = "this torch is a CPU build" if torch.version.cuda is None else "no CUDA device is visible to it"
        raise ConfigError(f"resources.gpus: a trial asks for {gpus:g} GPU(s) but torch on {socket.gethostname()} cannot use one "
                          f"({why}); install a CUDA torch there or set resources.gpus: 0")
    return torch.device("cuda", 0)


def remote_worker_class(cpus: float, gpus: float, memory_gb: float | None) -> Any:
    """TrialWorker as a Ray actor class with the pipeline's per-trial resources."""
    import ray

    options: dict[str, Any] = {"num_cpus": cpus, "num_gpus": gpus, "max_restarts": 0, "max_concurrency": 1}
    if memory_gb:
        options["memory"] = int(memory_gb * 2**30)
    return ray.remote(**options)(TrialWorker)
