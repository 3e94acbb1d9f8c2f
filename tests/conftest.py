"""Shared fixtures: a tiny model, an installed third-party plugin, a local Ray head on loopback."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

# Triton kernels run in the interpreter on CPU tensors unless a GPU is present; triton reads this
# at import, so it is set before any test module can import it.
if not os.environ.get("CUDA_VISIBLE_DEVICES") and not Path("/dev/nvidia0").exists():
    os.environ.setdefault("TRITON_INTERPRET", "1")

# Under `pytest -n N` (make test) each test process gets one OpenMP/torch thread: N processes of two
# spinning OpenMP threads each on a two-core machine starve one another (a 80 s test took 1,200 s).
# Set before torch is imported; subprocesses the tests start (Ray nodes, `paretolab run`) inherit it.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("OMP_NUM_THREADS", "1")

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def edited(raw: dict, path: str, value: object) -> dict:
    """A deep copy of pipeline ``raw`` with the field at dotted ``path`` set to ``value`` (list items by index; KeyError deletes it)."""
    import copy

    raw = copy.deepcopy(raw)
    *parents, last = path.split(".")
    node: Any = raw
    for key in parents:
        node = node[int(key)] if key.isdigit() else node[key]
    if value is KeyError:
        del node[last]
    else:
        node[int(last) if last.isdigit() else last] = value
    return raw


def needs_data(*relative: str) -> None:
    """Skip, saying why, unless each file is in a data folder paretolab searches (a fresh clone has none)."""
    from paretolab.data import data_dirs

    missing = [r for r in relative if not any((d / r).is_file() for d in data_dirs())]
    if missing:
        pytest.skip(f"evaluation data {', '.join(missing)} not found: set PARETOLAB_DATA_DIR to the shared data folder "
                    "(.ci/run uses ../shared/data)")


def pytest_collection_modifyitems(config, items):
    """`gpu`-marked tests skip, with their reason in the summary, where torch sees no CUDA device."""
    gpu_items = [item for item in items if item.get_closest_marker("gpu")]
    if not gpu_items:
        return
    import torch

    if not torch.cuda.is_available():
        for item in gpu_items:
            item.add_marker(pytest.mark.skip(reason="needs CUDA (run benchmarks/gpu_check.sh on a GPU machine)"))


@pytest.fixture
def tiny():
    """A fresh tiny-llama subject (random weights, byte tokenizer): for mechanics, not claims."""
    from paretolab.models import TinyLlama

    return TinyLlama().load()


@pytest.fixture
def ctx(tmp_path):
    """A trial context with seed 0 and a workdir of its own."""
    from paretolab.plugin_api.context import TrialContext

    return TrialContext(seed=0, workdir=tmp_path / "trial")


@pytest.fixture(scope="session")
def testplugin_path(tmp_path_factory) -> Path:
    """The fixture package really installed (pip --target), as a third party would ship it."""
    target = tmp_path_factory.mktemp("site")
    # Built from a copy: parallel test processes (pytest -n) each build it, never in the same build/ folder.
    source = shutil.copytree(ROOT / "tests" / "fixtures" / "testplugin", tmp_path_factory.mktemp("testplugin_src") / "testplugin",
                             ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--target", str(target), str(source)],
        check=True,
        capture_output=True,
    )
    return target


@pytest.fixture
def with_testplugin(testplugin_path, monkeypatch):
    """The test plugin importable in this process (registries rebuilt) and in subprocesses."""
    from paretolab.plugin_api import manager as plugin_manager

    monkeypatch.syspath_prepend(str(testplugin_path))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(testplugin_path), os.environ.get("PYTHONPATH")])))
    import importlib

    importlib.invalidate_caches()
    plugin_manager.reset()
    yield testplugin_path
    plugin_manager.reset()


@pytest.fixture(scope="session")
def constrained_home(tmp_path_factory) -> Path:
    """Stores with study ``constrained`` (an infeasible trial dominates every other) and ``pruned`` (a pruned training trial)."""
    from tests.dashboard.conftest import build_constrained_stores

    home = tmp_path_factory.mktemp("constrained_store")
    build_constrained_stores(home)
    return home


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def ray_head(tmp_path_factory):
    """A real Ray head on 127.0.0.1 with 2 CPUs, shared by the study tests; stopped at the end."""
    port = _free_port()
    # No token auth on this loopback head, and none for the drivers the tests start: otherwise a
    # ~/.ray/auth_token that any local `ray.init()` on the machine leaves behind switches the
    # drivers (not the head) to token mode, and every study here fails to connect.
    previous = os.environ.get("RAY_AUTH_MODE")
    os.environ["RAY_AUTH_MODE"] = "disabled"
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
    cmd = [str(BIN / "ray"), "start", "--head", "--node-ip-address=127.0.0.1", f"--port={port}", "--num-cpus=2",
           "--include-dashboard=false", "--disable-usage-stats", "--block"]
    # --block keeps `ray start` in the foreground as the parent of this cluster's processes, so the
    # teardown stops exactly this cluster (`ray stop` would kill every Ray on the machine).
    head = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    _wait_for_line(head, "Ray runtime started", timeout=180)
    yield f"127.0.0.1:{port}"
    stop_process_group(head, grace=5)  # `ray start --block` may sit out a SIGTERM for 30 s+ (seen at the session's end): then SIGKILL
    if previous is None:
        os.environ.pop("RAY_AUTH_MODE", None)
    else:
        os.environ["RAY_AUTH_MODE"] = previous


def _wait_for_line(proc: subprocess.Popen, marker: str, timeout: float) -> None:
    """Read ``proc``'s output until a line contains ``marker`` (then drain the rest in a thread)."""
    import threading

    lines: list[str] = []
    found = threading.Event()

    def pump() -> None:
        for line in proc.stdout:
            lines.append(line)
            if marker in line:
                found.set()

    threading.Thread(target=pump, daemon=True).start()
    deadline = time.monotonic() + timeout
    while not found.wait(0.2):
        if proc.poll() is not None or time.monotonic() > deadline:
            stop_process_group(proc)
            raise RuntimeError(f"{' '.join(proc.args[:3])} did not print {marker!r}:\n{''.join(lines)}")


def stop_process_group(proc: subprocess.Popen, grace: float = 30) -> None:
    """SIGTERM the process group ``proc`` leads; SIGKILL it if anything is left after ``grace`` s."""
    import signal

    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:
            proc.poll()  # reap the leader so an empty group reads as gone
            try:
                os.killpg(proc.pid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.2)


def cli_here(*args: str, cwd: Path, env: dict | None = None, check: bool = True) -> subprocess.CompletedProcess:
    """The `paretolab` command run in this process: ``paretolab.cli.main(args)`` in ``cwd`` with ``env`` set, its
    output captured. The installed command's code without a new interpreter's 3-8 s of imports; for the commands
    that read or manage the stores (frontier, report, studies, export, models, plugins), never for `run`, `submit` or
    `jobs` (Ray, signals). Each command is also run as the real `paretolab` (run_cli) in some test."""
    import contextlib
    import io

    from paretolab.cli import main

    out, err = io.StringIO(), io.StringIO()
    saved = {key: os.environ.get(key) for key in env or {}}
    here = os.getcwd()
    try:
        os.environ.update(env or {})
        os.chdir(cwd)
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main(list(args))
            except SystemExit as exc:  # argparse's usage errors and --help
                code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    finally:
        os.chdir(here)
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    proc = subprocess.CompletedProcess(["paretolab", *args], code, out.getvalue(), err.getvalue())
    if check and code != 0:
        raise AssertionError(f"paretolab {' '.join(args)} (in process) exited {code}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}")
    return proc


def run_cli(*args: str, cwd: Path, env: dict | None = None, timeout: float = 600, check: bool = True) -> subprocess.CompletedProcess:
    """Run the real `paretolab` command."""
    full_env = {**os.environ, **(env or {})}
    proc = subprocess.run([str(BIN / "paretolab"), *args], cwd=cwd, env=full_env, capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"paretolab {' '.join(args)} exited {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}")
    return proc


def wait_for(predicate, timeout: float, interval: float = 0.5):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise TimeoutError("condition not met in time")
