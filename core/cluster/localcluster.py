"""Throwaway services on loopback: a Ray head and worker nodes, PostgreSQL, an MLflow server.

For the tests and benchmarks (and for trying the cluster features on one machine). Each service
lives in a temporary folder, binds 127.0.0.1 and is stopped by the process ids it started.
Secrets (the Ray token, the database password) travel in environment variables, never in
command lines that ``ps`` would show.
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

BIN = Path(sys.executable).parent
SIMULATED_GPUS_ENV = "PARETOLAB_SIMULATED_GPUS"  # set on nodes whose GPUs exist only in Ray's resource table


def _cuda_visible() -> bool:
    import torch

    return torch.cuda.is_available()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.3)
    raise TimeoutError(f"{what} did not come up within {timeout:g} s")


def _http_ok(url: str, token: str | None = None) -> bool:
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(request, timeout=2) as response:
            return response.status == 200
    except Exception:
        return False


@dataclass
class RayCluster:
    """A Ray head (with its job API) plus worker nodes, all on 127.0.0.1, with token auth on."""

    head_cpus: int = 2
    head_gpus: int = 0
    env_extra: dict[str, str] = field(default_factory=dict)
    token: str = field(default_factory=lambda: secrets.token_hex(16))
    temp_dir: str = field(default_factory=lambda: tempfile.mkdtemp(prefix="plray-", dir="/tmp"))
    nodes: dict[str, int] = field(default_factory=dict)  # name -> process group of its daemons
    gcs_port: int = 0
    dashboard_port: int = 0

    @property
    def env(self) -> dict[str, str]:
        """What a client needs (token, mode) plus the cluster's own settings; PATH leads to this Python."""
        return {**os.environ, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": self.token, "RAY_USAGE_STATS_ENABLED": "0",
                "RAY_raylet_start_wait_time_s": "120",  # a busy two-core machine registers nodes slowly
                "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", **self.env_extra}

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.gcs_port}"

    @property
    def jobs_url(self) -> str:
        return f"http://127.0.0.1:{self.dashboard_port}"

    def start(self) -> RayCluster:
        for attempt in (1, 2):  # fresh ports for a second try
            self.gcs_port, self.dashboard_port = free_port(), free_port()
            try:
                self._ray_start("head", ["--head", f"--port={self.gcs_port}", f"--num-cpus={self.head_cpus}", f"--num-gpus={self.head_gpus}",
                                         "--include-dashboard=true", "--dashboard-host=127.0.0.1", f"--dashboard-port={self.dashboard_port}",
                                         f"--temp-dir={self.temp_dir}", f"--ray-client-server-port={free_port()}"])
                break
            except RuntimeError:
                if attempt == 2:
                    raise
        _wait(lambda: _http_ok(f"{self.jobs_url}/api/version", self.token), 120, "the Ray head's job API")
        return self

    def add_node(self, name: str, cpus: int = 2, gpus: int = 0) -> None:
        """Another node joining the head (its own raylet and agents, distinct ports)."""
        self._ray_start(name, [f"--address={self.address}", f"--num-cpus={cpus}", f"--num-gpus={gpus}"])

    def _ray_start(self, name: str, args: list[str]) -> None:
        # GPUs declared on a machine without CUDA are Ray bookkeeping only: trials there run on the CPU, labelled so
        simulated = any(a.startswith("--num-gpus=") and a != "--num-gpus=0" for a in args) and not _cuda_visible()
        # worker ports below the kernel's ephemeral range (32768+ on Linux), where free_port()'s picks for the agents
        # live: a range inside it once collided with a random agent port ("worker_ports ... used by other components")
        base = 10100 + (hash((self.temp_dir, name)) % 220) * 100
        for _ in range(2):  # a loaded machine can miss Ray's 30 s raylet start-up deadline once
            ports = [f"--dashboard-agent-listen-port={free_port()}", f"--metrics-export-port={free_port()}",
                     f"--runtime-env-agent-port={free_port()}", f"--dashboard-agent-grpc-port={free_port()}",
                     f"--node-manager-port={free_port()}", f"--object-manager-port={free_port()}"]
            cmd = [str(BIN / "ray"), "start", "--node-ip-address=127.0.0.1", "--disable-usage-stats", *args, *ports,
                   f"--min-worker-port={base}", f"--max-worker-port={base + 99}"]
            env = {**self.env, SIMULATED_GPUS_ENV: "1"} if simulated else self.env
            proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
            out, _ = proc.communicate(timeout=180)
            if proc.returncode == 0:
                self.nodes[name] = proc.pid  # the daemons it forked keep its process group
                return
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            if "--head" in args:
                break
        if "--head" in args:
            _kill_matching(self.temp_dir)  # what the failed head left; the caller may try again
        else:
            self.stop()
        raise RuntimeError(f"ray start ({name}) failed:\n{out[-3000:]}")

    def kill_node(self, name: str) -> None:
        """SIGKILL one node's daemons (raylet, agents): the node leaves as if its machine died."""
        pgid = self.nodes.pop(name)
        try:
            os.killpg(pgid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    def stop(self) -> None:
        """Stop every node, then any worker process still holding this cluster's session folder."""
        for name in sorted(self.nodes, key=lambda n: n == "head"):
            self.kill_node(name)
        _kill_matching(self.temp_dir)
        shutil.rmtree(self.temp_dir, ignore_errors=True)


def _kill_matching(marker: str) -> None:
    """Processes whose command line names ``marker`` (our temp folder): only ours."""
    import psutil

    me = {os.getpid(), *(p.pid for p in psutil.Process().parents())}
    for proc in psutil.process_iter(["pid", "cmdline"]):
        try:
            if proc.pid not in me and any(marker in part for part in proc.info["cmdline"] or ()):
                proc.kill()
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass


def _pg_bin() -> Path:
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"))
    if found:
        return found[-1].parent
    on_path = shutil.which("initdb")
    if on_path:
        return Path(on_path).parent
    raise RuntimeError("PostgreSQL is not installed: `apt-get install postgresql` (.ci/run does this on a fresh machine)")


@dataclass
class Postgres:
    """A PostgreSQL server in a temp folder on 127.0.0.1 with password auth and a `paretolab` role."""

    user: str = "paretolab"
    password: str = field(default_factory=lambda: "pw-" + secrets.token_hex(12))
    port: int = 0
    data: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="plpg-", dir="/tmp")))

    def url(self, database: str, with_password: bool = True) -> str:
        auth = f"{self.user}:{self.password}" if with_password else self.user
        return f"postgresql+psycopg2://{auth}@127.0.0.1:{self.port}/{database}"

    def _as_owner(self, cmd: list[str]) -> list[str]:
        return ["runuser", "-u", "postgres", "--", *cmd] if os.geteuid() == 0 else cmd

    def start(self, databases: tuple[str, ...] = ("optuna", "mlflow")) -> Postgres:
        pg = _pg_bin()
        self.port = self.port or free_port()
        if os.geteuid() == 0:
            shutil.chown(self.data, "postgres", "postgres")
        pwfile = self.data / "pw"
        pwfile.write_text(self.password)
        if os.geteuid() == 0:
            shutil.chown(pwfile, "postgres", "postgres")
        db = self.data / "db"
        run = lambda cmd: subprocess.run(self._as_owner(cmd), capture_output=True, text=True, timeout=120, check=True)  # noqa: E731
        run([str(pg / "initdb"), "-D", str(db), "-U", self.user, "--pwfile", str(pwfile), "-A", "scram-sha-256", "--no-sync"])
        pwfile.unlink()
        run([str(pg / "pg_ctl"), "-D", str(db), "-l", str(self.data / "log"), "-w", "-t", "60",
             "-o", f"-h 127.0.0.1 -p {self.port} -k {self.data} -c max_connections=200 -c fsync=off", "start"])
        import psycopg2

        conn = psycopg2.connect(host="127.0.0.1", port=self.port, user=self.user, password=self.password, dbname="postgres")
        conn.autocommit = True
        with conn.cursor() as cur:
            for name in databases:
                cur.execute(f'CREATE DATABASE "{name}"')
        conn.close()
        return self

    def stop(self) -> None:
        pg = _pg_bin()
        subprocess.run(self._as_owner([str(pg / "pg_ctl"), "-D", str(self.data / "db"), "-m", "immediate", "stop"]),
                       capture_output=True, timeout=60)
        shutil.rmtree(self.data, ignore_errors=True)


@dataclass
class MlflowServer:
    """``mlflow server`` on 127.0.0.1 over a database, serving artifacts from a folder."""

    backend_uri: str
    artifacts: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="plmlflow-")))
    port: int = 0
    proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> MlflowServer:
        return self.launch().wait()

    def launch(self) -> MlflowServer:
        """Start the server without waiting (it takes a while to import; start other things meanwhile)."""
        self.port = self.port or free_port()
        # the backend URI (with its password) goes in the environment, not on the command line
        # MLflow's job runner (GenAI scorers) would add seven helper processes that a study never uses
        env = {**os.environ, "MLFLOW_BACKEND_STORE_URI": self.backend_uri, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
        cmd = [str(BIN / "mlflow"), "server", "--host", "127.0.0.1", "--port", str(self.port), "--workers", "1",
               "--artifacts-destination", str(self.artifacts)]
        self.proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=open(self.artifacts / "server.log", "w"),
                                     start_new_session=True)
        return self

    def wait(self, timeout: float = 240) -> MlflowServer:
        """Block until the server answers /health."""
        try:
            _wait(lambda: self.proc is not None and self.proc.poll() is None and _http_ok(f"{self.url}/health"), timeout, "the MLflow server")
        except TimeoutError:
            self.stop()
            raise RuntimeError(f"mlflow server did not start:\n{(self.artifacts / 'server.log').read_text()[-3000:]}") from None
        return self

    def stop(self) -> None:
        if self.proc is not None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)  # and any helper process it left in its group
            except ProcessLookupError:
                pass
        shutil.rmtree(self.artifacts, ignore_errors=True)
