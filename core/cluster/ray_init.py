"""Connecting the driver to Ray: a private local instance by default, a cluster by address (with its token).

Workers get the environment they need (cache, data dir, plugin settings) through the job's
runtime_env, never the store URLs: only the driver writes the stores, and Ray keeps a
runtime_env in clear.
"""

from __future__ import annotations

import os
from typing import Any

from paretolab.cluster.ray_auth import (
    is_auth_error,
    quiet_local_token_notice,
    token_help,
    use_token_if_present,
)
from paretolab.errors import ParetolabError, first_line
from paretolab.stores.locations import OPTUNA_ENV, TRACKING_ENV, redact


def ray_auth_env(address: str | None) -> None:
    """Present the cluster's token when one is on this machine (Ray reads this before import)."""
    if address:
        use_token_if_present()


def init_ray(address: str | None) -> None:
    import ray

    if ray.is_initialized():
        return
    env = {k: v for k, v in os.environ.items() if forwarded(k, v)}
    kwargs: dict[str, Any] = {
        "ignore_reinit_error": True,
        "logging_level": "WARNING",
        "log_to_driver": os.environ.get("PARETOLAB_WORKER_LOGS", "") == "1",
        "runtime_env": {"env_vars": env} if env else None,
    }
    if address:
        kwargs["address"] = address
    else:
        # A private local instance: never attach silently to another cluster that `ray start`
        # left on this machine (plain ray.init() would, via /tmp/ray/ray_current_cluster).
        kwargs["address"] = "local"
        kwargs["include_dashboard"] = False
        quiet_local_token_notice()
        # Ray starts workers at niceness 15; here the trials are the work, and a niced worker
        # loses every core to whatever else runs on the machine (its latencies with it).
        os.environ.setdefault("RAY_worker_niceness", "0")
    try:
        ray.init(**kwargs)
    except Exception as exc:
        if is_auth_error(exc):
            raise ParetolabError(token_help(repr(address))) from exc
        if not isinstance(exc, (ConnectionError, RuntimeError)):
            raise
        raise ParetolabError(f"could not connect to the Ray cluster at {address!r}: {first_line(exc)}") from exc


def forwarded(key: str, value: str) -> bool:
    """Environment the workers need (cache, data, plugins); never the stores: only the driver writes them,
    and Ray keeps a job's runtime_env in clear, so a password in a store URL must not travel there."""
    if key in (OPTUNA_ENV, TRACKING_ENV) or redact(value) != value:
        return False
    return key.startswith("PARETOLAB_") or key in ("PYTHONPATH", "HF_HUB_OFFLINE")
