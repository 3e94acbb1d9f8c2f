"""The engine load generator and server lifecycle, against a fake OpenAI-compatible server run as a real subprocess.

Checks the figures' arithmetic (exactly on made-up request times, roughly on a server with known
delays), the bounds (a stalled stream: the request timeout and the run's wall-clock bound hold; the
request count bound), and that no process is left: after a clean run, after a failed start (exits;
never answers) and after an exception in the middle of the load, by pid and by process group.
"""

from __future__ import annotations

import math
import os
import sys
import time
from pathlib import Path

import psutil
import pytest

from paretolab.measure.engine_load import FIGURES, EngineLoadError, LoadSpec, RequestResult, level_figures, run_load, stream_completion
from paretolab.measure.engine_server import EngineStartError, engine_message, free_port, group_alive, serve
from paretolab.stats import t_interval

FAKE = Path(__file__).with_name("fake_openai_server.py")


def fake(port: int, *args: str) -> list[str]:
    return [sys.executable, str(FAKE), "--port", str(port), *args]


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def assert_no_process(pid: int, child_file: Path | None = None) -> None:
    assert gone(pid), f"server pid {pid} still running"
    assert not group_alive(pid), f"process group {pid} still has a live process"
    if child_file is not None:
        child = int(child_file.read_text())
        assert gone(child), f"the server's child {child} still running"


# -- arithmetic on made-up times ---------------------------------------------------------------

def test_level_figures_exact() -> None:
    # two requests: sent at 0 and 1; first tokens at 0.5 and 1.2; tokens every 0.1 / 0.3 after
    a = RequestResult(start=0.0, chunks=[0.5, 0.6, 0.7, 0.8], end=0.8, tokens=4)
    b = RequestResult(start=1.0, chunks=[1.2, 1.5, 1.8], end=2.0, tokens=3)
    bad = RequestResult(start=0.0, error="HTTP 500")
    f = level_figures([a, b, bad])
    assert f["ttft_p50_s"] == pytest.approx((0.5 + 0.2) / 2)
    assert f["ttft_p99_s"] == pytest.approx(0.2 + 0.99 * (0.5 - 0.2))
    # gaps pooled: 0.1, 0.1, 0.1, 0.3, 0.3 -> median 0.1
    assert f["itl_p50_s"] == pytest.approx(0.1)
    assert f["tok_s"] == pytest.approx(7 / 2.0)  # 7 tokens over first send (0) .. last end (2)
    assert f["tok_s_per_user"] == pytest.approx((4 / 0.8 + 3 / 1.0) / 2)
    assert all(math.isnan(v) for v in level_figures([bad]).values())


def test_t_interval() -> None:
    mean, low, high = t_interval([1.0, 2.0, 3.0])
    assert mean == 2.0
    assert high - mean == pytest.approx(4.302653 * 1.0 / math.sqrt(3), rel=1e-5)  # t(0.975, 2) * sd / sqrt(n)
    assert mean - low == pytest.approx(high - mean)
    assert math.isnan(t_interval([5.0])[1])


def test_requests_per_repeat() -> None:
    spec = LoadSpec(prompts=("a",) * 8)
    assert [spec.requests_per_repeat(c) for c in (1, 4, 16, 3)] == [8, 8, 16, 9]


# -- a live fake server ------------------------------------------------------------------------

def test_known_delays_and_clean_stop(tmp_path: Path) -> None:
    port = free_port()
    spec = LoadSpec(prompts=("p1", "p2"), new_tokens=5, concurrency=(1, 2), repeats=2, warmup=1, request_timeout_s=10, max_total_s=60)
    with serve(fake(port, "--ttft", "0.2", "--itl", "0.05", "--child", "--child-pid-file", str(tmp_path / "child")),
               port=port, log=tmp_path / "log", ready_s=30, name="fake") as server:
        pid = server.pid
        report = run_load(server.url, "fake", spec)
        assert server.peak_rss_bytes > 1_000_000  # a Python process and its child
    assert_no_process(pid, tmp_path / "child")
    assert report.sent == 1 + 2 * (2 + 2)
    assert report.errors == {1: 0, 2: 0} and not report.cut
    summary = report.summary()
    for level in (1, 2):
        s = summary[level]
        assert s["ttft_p50_s"][0] == pytest.approx(0.2, abs=0.1)
        assert s["itl_p50_s"][0] == pytest.approx(0.05, abs=0.03)
        # one user sees 5 tokens in 0.2 + 4 * 0.05 = 0.4 s
        assert s["tok_s_per_user"][0] == pytest.approx(12.5, rel=0.35)
        assert s["tok_s_per_user"][1] <= s["tok_s_per_user"][0] <= s["tok_s_per_user"][2]
    # two users at once: about twice one user's aggregate rate
    assert summary[2]["tok_s"][0] == pytest.approx(2 * summary[1]["tok_s"][0], rel=0.35)
    metrics = report.metrics()
    assert set(metrics) == {f"engine_{f}_c{c}{s}" for f in FIGURES if f != "j_per_token" for c in (1, 2) for s in ("", "_ci_low", "_ci_high")} | {"engine_errors_c1", "engine_errors_c2"}
    assert all(math.isfinite(v) for v in metrics.values())


def test_stalled_stream_is_cut_by_request_timeout_and_total_bound(tmp_path: Path) -> None:
    port = free_port()
    with serve(fake(port, "--ttft", "0.01", "--itl", "0.01", "--stall-after", "2"), port=port, log=tmp_path / "log", ready_s=30) as server:
        pid = server.pid
        t = time.perf_counter()
        r = stream_completion(server.url + "/v1/completions", {"model": "m", "prompt": "x", "max_tokens": 8}, timeout_s=1.0)
        assert time.perf_counter() - t < 3.0
        assert r.error and len(r.chunks) == 2
        # the run's wall-clock bound: 2 users, each request would stall forever; the run ends at ~max_total_s
        spec = LoadSpec(prompts=("a",), new_tokens=8, concurrency=(2,), repeats=5, warmup=0, request_timeout_s=30, max_total_s=2.0)
        t = time.perf_counter()
        with pytest.raises(EngineLoadError, match="no request finished"):
            run_load(server.url, "m", spec)
        assert time.perf_counter() - t < 6.0
    assert_no_process(pid)


def test_request_count_bound(tmp_path: Path) -> None:
    port = free_port()
    with serve(fake(port, "--ttft", "0", "--itl", "0"), port=port, log=tmp_path / "log", ready_s=30) as server:
        spec = LoadSpec(prompts=("a", "b"), new_tokens=2, concurrency=(1, 4), repeats=3, warmup=0, max_requests=5)
        counter = iter(range(0, 1000, 7))  # 7 J between two reads
        report = run_load(server.url, "m", spec, joules=lambda: float(next(counter)))
    assert report.sent == 5 and report.cut.startswith("max_requests")
    assert [r["j_per_token"] for r in report.repeats[1]] == [7 / 4, 7 / 4, 7 / 2]  # 2 tokens a request
    assert 4 not in report.repeats  # the level after the cut never ran
    assert len(report.repeats[1]) == 3  # 2 + 2 + (1 of 2): the third repeat is figured from what it sent


@pytest.mark.parametrize(("mode", "message"), [("exit", r"exited with code 3 .*model file not found"),
                                                ("deaf", r"did not answer /v1/models .* within 2 s"),
                                                ("slow-ready", r"did not answer")])
def test_failed_start_leaves_nothing(tmp_path: Path, mode: str, message: str) -> None:
    port = free_port()
    seen: list[int] = []
    with pytest.raises(EngineStartError, match=message) as err:
        with serve(fake(port, "--mode", mode, "--child", "--child-pid-file", str(tmp_path / "child")),
                   port=port, log=tmp_path / "log", ready_s=2.0, grace_s=2.0):
            pytest.fail("the block must not run")
    assert "\n" not in str(err.value)
    for p in psutil.Process(os.getpid()).children(recursive=True):
        seen.append(p.pid)
    child = int((tmp_path / "child").read_text())
    assert gone(child), "the server's child survived a failed start"
    assert child not in seen


def test_exception_mid_load_stops_server(tmp_path: Path) -> None:
    port = free_port()
    pid = 0

    class Boom(Exception):
        pass

    with pytest.raises(Boom):
        with serve(fake(port, "--ttft", "0.01", "--itl", "0.01", "--child", "--child-pid-file", str(tmp_path / "child")),
                   port=port, log=tmp_path / "log", ready_s=30) as server:
            pid = server.pid
            stream_completion(server.url + "/v1/completions", {"model": "m", "prompt": "x", "max_tokens": 3}, timeout_s=5)
            raise Boom
    assert pid
    assert_no_process(pid, tmp_path / "child")


def test_sigterm_ignoring_server_is_killed(tmp_path: Path) -> None:
    port = free_port()
    script = tmp_path / "stubborn.py"
    script.write_text(f"import signal, runpy, sys\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
                      f"sys.argv = ['fake', '--port', '{port}']\nrunpy.run_path({str(FAKE)!r}, run_name='__main__')\n")
    t = time.perf_counter()
    with serve([sys.executable, str(script)], port=port, log=tmp_path / "log", ready_s=30, grace_s=1.0) as server:
        pid = server.pid
    assert time.perf_counter() - t < 30
    assert_no_process(pid)


@pytest.mark.parametrize(("log", "says"), [
    ("vllm_refuses_int8.log", "ValueError: Failed to find a kernel that can implement the WNA16 linear layer. Reasons: Dynamic4bitLinearKernel"),
    ("vllm_refuses_float32_int4.log", "NotImplementedError: \"cpu_gemm_wna16\" not implemented for 'Float'")])
def test_engine_message_is_the_root_cause_not_the_wrapper(log: str, says: str) -> None:
    """vLLM's real logs (trimmed) of two refused compressed-tensors checkpoints: the root exception, its continuation lines."""
    got = engine_message(Path(__file__).with_name("data") / log)
    assert got.startswith(says), got
    assert "initialization failed" not in got and "ulimit" not in got
    if "int8" in log:  # the reasons continue on the lines after the exception
        assert got.endswith("supported types are: (ScalarType.uint4, ScalarType.uint4b8)")
