"""Fail fast on an address nothing answers at, instead of waiting out Ray's own connect timeouts."""

from __future__ import annotations

import socket
from urllib.parse import urlsplit

from paretolab.errors import ConfigError

CONNECT_TIMEOUT_S = 5.0


def require_reachable(flag: str, address: str) -> None:
    """Raise a one-line ConfigError when ``address`` (host:port, ray://, http://) refuses or ignores a TCP connect."""
    if address in ("auto", "local") or "://" not in address and ":" not in address:
        return  # Ray finds these itself (and says so quickly when there is nothing)
    parts = urlsplit(address if "://" in address else f"tcp://{address}")
    try:
        host, port = parts.hostname, parts.port
    except ValueError:
        raise ConfigError(f"{flag} {address!r}: not a HOST:PORT or URL with a port") from None
    if not host or not port:
        return
    why = _tcp_problem(host, port)
    if why is None and "://" not in address:
        why = _gcs_problem(f"{host}:{port}")
    if why:
        raise ConfigError(f"{flag} {address}: no Ray cluster answers at {host}:{port} ({why}); is the Ray head running there? "
                          "(`ray start --head` prints its address)")


def _tcp_problem(host: str, port: int) -> str | None:
    try:
        socket.create_connection((host, port), timeout=CONNECT_TIMEOUT_S).close()
    except TimeoutError:
        return f"no answer in {CONNECT_TIMEOUT_S:g} s"
    except OSError as exc:
        return exc.strerror or type(exc).__name__
    return None


def _gcs_problem(target: str) -> str | None:
    """Ask the GCS for its cluster id: a port that accepts connections but is no Ray head (a proxy, another
    service) would otherwise keep `ray.init` retrying for a minute."""
    try:
        import grpc
        from ray.core.generated import gcs_service_pb2, gcs_service_pb2_grpc
    except ImportError:
        return None
    with grpc.insecure_channel(target) as channel:
        try:
            gcs_service_pb2_grpc.NodeInfoGcsServiceStub(channel).GetClusterId(gcs_service_pb2.GetClusterIdRequest(), timeout=CONNECT_TIMEOUT_S)
        except grpc.RpcError as exc:
            code = exc.code() if hasattr(exc, "code") else None
            if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.UNIMPLEMENTED):
                return f"not a Ray GCS: {code.name.lower()}"
    return None  # it answered (an authentication refusal included: Ray then says what is wrong)
