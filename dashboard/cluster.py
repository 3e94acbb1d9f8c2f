"""The Cluster page's data: Ray nodes, resources and jobs, when the dashboard was given a Ray address."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

ADDRESS_ENV = "PARETOLAB_RAY_ADDRESS"


@dataclass
class ClusterInfo:
    """A snapshot of a Ray cluster (read-only)."""

    address: str
    nodes: list[dict[str, Any]] = field(default_factory=list)
    total: dict[str, float] = field(default_factory=dict)
    available: dict[str, float] = field(default_factory=dict)
    jobs: list[dict[str, Any]] = field(default_factory=list)
    jobs_error: str = ""


def cluster_info(address: str) -> ClusterInfo:
    """Connect to the Ray cluster at ``address`` as a client (no tasks run) and read its state."""
    from paretolab.cluster.ray_auth import use_token_if_present

    use_token_if_present()  # a cluster with token auth (Ray's default) refuses a client without it
    import ray

    if not ray.is_initialized():
        ray.init(address=address, logging_level="ERROR", log_to_driver=False, ignore_reinit_error=True)
    info = ClusterInfo(address=address)
    for node in ray.nodes():
        info.nodes.append({
            "node": node.get("NodeManagerAddress", ""),
            "alive": bool(node.get("Alive")),
            "head": "node:__internal_head__" in (node.get("Resources") or {}),
            **{k: v for k, v in sorted((node.get("Resources") or {}).items()) if not k.startswith("node:")},
        })
    info.total = {k: v for k, v in ray.cluster_resources().items() if not k.startswith("node:")}
    info.available = {k: v for k, v in ray.available_resources().items() if not k.startswith("node:")}
    try:
        from ray.util.state import list_jobs

        for job in list_jobs(raise_on_missing_output=False):
            data = job if isinstance(job, dict) else vars(job)
            info.jobs.append({k: data.get(k) for k in ("job_id", "submission_id", "status", "entrypoint", "start_time", "end_time")})
    except Exception as exc:  # the state API needs the head's dashboard agent; nodes and resources do not
        info.jobs_error = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"
    return info
