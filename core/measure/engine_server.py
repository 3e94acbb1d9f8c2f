"""An engine's server as a bounded child: started on 127.0.0.1 and a free port, watched, always stopped.

:func:`serve` is a context manager. It starts the command in a process group of its own (its log in
a file), waits until ``GET /v1/models`` answers 200 (at most ``ready_s`` seconds), samples the
process tree's resident memory and CPU time on a thread while the block runs, and on every way out
(the block's end, an exception in it, a failed start) stops the whole group: SIGTERM, then SIGKILL
after ``grace_s``, then reaps it. A start that fails (the process exits, or never answers) raises
:class:`EngineStartError` with one line: what happened and the tail of the server's log.
"""

from __future__ import annotations

import contextlib
import http.client
import os
import re
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from paretolab.errors import ParetolabError


class EngineStartError(ParetolabError, RuntimeError):
    """An engine's server that exited before it answered, or did not answer in time; ``reason``: the engine's own words."""

    def __init__(self, message: str, reason: str = "") -> None:
        super().__init__(message)
        self.reason = reason or message


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def log_tail(path: Path, lines: int = 3, chars: int = 400) -> str:
    """The last non-empty lines of a log, joined on one line (for an error message)."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    keep = [line.strip() for line in text.splitlines() if line.strip()][-lines:]
    tail = " | ".join(keep)
    return tail[-chars:]


# A log line's prefix (vLLM: "(Worker pid=12) ERROR 12-06 04:35:34 [file.py:953] "), and an exception line after it
_PREFIX = re.compile(r"^(\(\S+ pid=\d+\) )?(?:[A-Z]+ \d\d-\d\d \d\d:\d\d:\d\d \[[^]]*\] )?")
_ERROR = re.compile(r"^(?:[\w.]+\.)?\w*(?:Error|Exception): \S")
_WRAPPERS = ("initialization failed", "see root cause above", "see stack trace", "check the stack trace above")


def engine_message(path: Path, chars: int = 500) -> str:
    """The engine's own reason for a failed start: the first exception of its log that is not a wrapper pointing back
    at another (with the lines that continue it), else the log's tail."""
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    for i, line in enumerate(lines):
        m = _PREFIX.match(line)
        body = line[m.end():]
        if not _ERROR.match(body) or any(w in body.lower() for w in _WRAPPERS):
            continue
        parts = [body.strip()]
        for more in lines[i + 1 :]:  # "Reasons:" and the like, on the lines after it, from the same process
            n = _PREFIX.match(more)
            rest = more[n.end():]
            if n.group(1) != m.group(1) or not rest.strip() or _ERROR.match(rest) or rest.startswith("Traceback") \
                    or rest.lstrip().startswith(('File "', "^", "~")) or rest.startswith("    "):
                break
            parts.append(rest.strip())
        return " ".join(" ".join(parts).split())[:chars]
    return log_tail(path, chars=chars)


def ended(code: int) -> str:
    """How a process ended, from its return code: "exited with code 1", "was killed by SIGSEGV"."""
    if code >= 0:
        return f"exited with code {code}"
    try:
        return f"was killed by {signal.Signals(-code).name}"
    except ValueError:
        return f"was killed by signal {-code}"


@dataclass
class Server:
    """A running server: its process, address, log, and what the sampler saw."""

    proc: subprocess.Popen
    port: int
    log: Path
    peak_rss_bytes: int = 0
    cpu_s: float = 0.0  # user + system seconds of the tree at the last sample (children that exited count too)
    _stop: threading.Event = field(default_factory=threading.Event)
    _cpu_base: float = 0.0

    @property
    def pid(self) -> int:
        return self.proc.pid

    def died(self) -> str | None:
        """None while the server runs; else how it ended and the engine's own last words (its log)."""
        code = self.proc.poll()
        return None if code is None else f"{ended(code)}: {engine_message(self.log)}"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def sample(self) -> None:
        """Add one sample of the tree's RSS (peak kept) and CPU seconds."""
        try:
            root = psutil.Process(self.proc.pid)
            procs = [root, *root.children(recursive=True)]
        except psutil.Error:
            return
        rss, cpu = 0, 0.0
        for p in procs:
            try:
                rss += p.memory_info().rss
                t = p.cpu_times()
                cpu += t.user + t.system + getattr(t, "children_user", 0.0) + getattr(t, "children_system", 0.0)
            except psutil.Error:
                continue
        self.peak_rss_bytes = max(self.peak_rss_bytes, rss)
        self.cpu_s = max(self.cpu_s, cpu)

    def mark_cpu(self) -> None:
        """Start counting CPU seconds from now (load only, not the model's loading)."""
        self.sample()
        self._cpu_base = self.cpu_s

    @property
    def cpu_s_since_mark(self) -> float:
        self.sample()
        return self.cpu_s - self._cpu_base


def _answers(port: int, path: str, timeout: float = 2.0) -> bool:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("GET", path)
        return conn.getresponse().status == 200
    except (OSError, http.client.HTTPException):
        return False
    finally:
        conn.close()


def stop_group(proc: subprocess.Popen, grace_s: float = 10.0) -> None:
    """SIGTERM the process's group, SIGKILL it after ``grace_s``, reap the leader. Safe to call twice."""
    pgid = proc.pid  # start_new_session: the leader's pid is the group's id
    try:  # descendants that left the group (setsid) are stopped by pid as well
        strays = psutil.Process(pgid).children(recursive=True)
    except psutil.Error:
        strays = []
    for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            break  # nothing left in the group
        end = time.monotonic() + wait
        while time.monotonic() < end:
            proc.poll()
            if not group_alive(pgid):
                break
            time.sleep(0.05)
        else:
            continue
        break
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=5.0)
    for p in strays:
        with contextlib.suppress(psutil.Error):
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                p.kill()


def group_alive(pgid: int) -> bool:
    """Whether any live (not zombie) process is in group ``pgid``."""
    for p in psutil.process_iter(["pid"]):
        try:
            if os.getpgid(p.pid) == pgid and p.status() != psutil.STATUS_ZOMBIE:
                return True
        except (ProcessLookupError, psutil.Error, OSError):
            continue
    return False


@contextlib.contextmanager
def serve(command: Sequence[str], *, port: int, log: Path, ready_path: str = "/v1/models", ready_s: float = 300.0,
          grace_s: float = 10.0, env: dict[str, str] | None = None, name: str = "engine",
          sample_every_s: float = 0.2) -> Iterator[Server]:
    """Run ``command`` (which must listen on 127.0.0.1:``port``) for the block's duration; see the module doc."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as out:
        proc = subprocess.Popen(list(command), stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True, env=env)
    server = Server(proc=proc, port=port, log=log)
    sampler: threading.Thread | None = None
    try:
        end = time.monotonic() + ready_s
        while True:
            if proc.poll() is not None:
                reason = engine_message(log)
                raise EngineStartError(f"{name} server {ended(proc.returncode)} before answering on port {port}: {reason}", reason)
            server.sample()
            if _answers(port, ready_path):
                break
            if time.monotonic() > end:
                reason = f"no answer within {ready_s:g} s: {log_tail(log)}"
                raise EngineStartError(f"{name} server did not answer {ready_path} on port {port} within {ready_s:g} s: {log_tail(log)}", reason)
            time.sleep(0.25)

        def watch() -> None:
            while not server._stop.wait(sample_every_s):
                server.sample()

        sampler = threading.Thread(target=watch, daemon=True, name=f"{name}-rss")
        sampler.start()
        yield server
    finally:
        server._stop.set()
        if sampler is not None:
            sampler.join(timeout=2.0)
        stop_group(proc, grace_s)
