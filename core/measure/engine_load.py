"""A load generator for any OpenAI-compatible server: streaming completions at fixed concurrency levels.

Engine-agnostic: it speaks ``POST /v1/completions`` with ``"stream": true`` (server-sent events,
one ``data: {...}`` line per chunk, ``data: [DONE]`` at the end), which vLLM's and
llama-cpp-python's servers both answer. Standard library only (``http.client`` and threads), so
the load needs nothing the core does not already have.

What one run does (:func:`run_load`): for each concurrency level ``c`` (default 1, 4, 16) and each
repeat, ``c`` users each send their share of a fixed request list (the prompt set cycled to
``max(len(prompts), c)`` requests, rounded up to a multiple of ``c``) one after another, every
request asking for ``new_tokens`` tokens. Per request it records the send time, the arrival of every
chunk that carries text (the first is the time to first token), and the end.

Per level and repeat (:func:`level_figures`):

- ``ttft_p50_s`` / ``ttft_p99_s``: percentiles of the requests' times to first token;
- ``itl_p50_s`` / ``itl_p99_s``: percentiles of the gaps between successive text chunks, all requests pooled;
- ``tok_s``: output tokens of the repeat / its wall time (first send to last end): the server's aggregate rate;
- ``tok_s_per_user``: mean over requests of output tokens / (end - send): what one user sees;
- ``j_per_token``: joules of the repeat / its output tokens, where :func:`run_load` is given an energy counter.

Over repeats each figure is a mean with its 95 % Student-t interval (:func:`paretolab.stats.t_interval`).
Output tokens are the server's ``usage.completion_tokens`` where it sends one, else the text chunks
counted. Percentiles are numpy's linear ones (p99 of fewer than 100 values is close to the maximum).

Bounds: every request has ``request_timeout_s`` (connect, each read, and its whole duration); the
run sends at most ``max_requests`` requests and starts none after ``max_total_s`` (a request under
way is cut at that deadline too). A request that fails or is cut counts in ``errors`` and not in the
figures; a level where every request failed raises :class:`EngineLoadError` with the first error.
"""

from __future__ import annotations

import http.client
import json
import math
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import numpy as np

from paretolab.errors import ParetolabError
from paretolab.stats import t_interval

# A fixed prompt set: short, varied prose, the same for every trial and engine.
PROMPTS: tuple[str, ...] = (
    "The history of the printing press begins",
    "In a small village at the edge of the forest, there lived",
    "The main reasons why the Roman Empire declined were",
    "To bake a simple loaf of bread, you first need",
    "A computer program is a sequence of instructions that",
    "The weather in the mountains can change quickly, so hikers",
    "Photosynthesis is the process by which plants",
    "The first thing she noticed when she opened the door was",
)
LEVELS: tuple[int, ...] = (1, 4, 16)
FIGURES = ("ttft_p50_s", "ttft_p99_s", "itl_p50_s", "itl_p99_s", "tok_s", "tok_s_per_user", "j_per_token")


class EngineLoadError(ParetolabError, RuntimeError):
    """A load run that produced no figures: every request of a level failed, or a bound cut it before any finished."""


@dataclass(frozen=True)
class LoadSpec:
    """What to send: prompts, tokens per request, levels, repeats and the bounds."""

    prompts: tuple[str, ...] = PROMPTS
    new_tokens: int = 32
    concurrency: tuple[int, ...] = LEVELS
    repeats: int = 3
    warmup: int = 1  # requests sent one at a time before the first level, not measured
    request_timeout_s: float = 60.0
    max_requests: int = 2000
    max_total_s: float = 900.0
    extra: dict[str, Any] = field(default_factory=dict)  # more body fields (ignore_eos, logit_bias, ...)

    def requests_per_repeat(self, level: int) -> int:
        n = max(len(self.prompts), level)
        return -(-n // level) * level

    def planned(self) -> int:
        """Requests the whole run would send (warm-up included)."""
        return self.warmup + self.repeats * sum(self.requests_per_repeat(c) for c in self.concurrency)


@dataclass
class RequestResult:
    """One request's times (``time.perf_counter`` seconds) and outcome."""

    start: float
    chunks: list[float] = field(default_factory=list)  # arrival of each chunk that carried text
    end: float = float("nan")
    tokens: int = 0  # usage.completion_tokens where sent, else len(chunks)
    error: str = ""

    @property
    def ok(self) -> bool:
        return not self.error and bool(self.chunks)

    @property
    def ttft(self) -> float:
        return self.chunks[0] - self.start

    @property
    def gaps(self) -> list[float]:
        return [b - a for a, b in zip(self.chunks, self.chunks[1:])]


@dataclass
class LoadReport:
    """Per level: the figures of each repeat, their means and intervals, and the errors."""

    spec: LoadSpec
    repeats: dict[int, list[dict[str, float]]] = field(default_factory=dict)  # level -> one dict of FIGURES per repeat
    errors: dict[int, int] = field(default_factory=dict)
    first_error: dict[int, str] = field(default_factory=dict)
    sent: int = 0
    cut: str = ""  # which bound stopped the run early, if one did
    wall_s: float = 0.0

    def summary(self) -> dict[int, dict[str, tuple[float, float, float]]]:
        """level -> figure -> (mean, low, high) over repeats: the t-interval, its low end clipped at 0 (no figure is negative)."""
        def clipped(values: list[float]) -> tuple[float, float, float]:
            mean, low, high = t_interval(values)
            return mean, max(low, 0.0) if math.isfinite(low) else low, high  # every figure is >= 0: so is its interval

        return {c: {f: clipped([r[f] for r in reps if math.isfinite(r.get(f, float("nan")))]) for f in FIGURES}
                for c, reps in self.repeats.items()}

    def metrics(self, prefix: str = "engine") -> dict[str, float]:
        """Flat metrics: :func:`metric_name` with ``_ci_low`` / ``_ci_high``, and ``{prefix}_errors_c{level}``.

        A figure that is not finite (no energy counter; an interval from one repeat) is left out, never NaN.
        """
        out: dict[str, float] = {}
        for c, figures in self.summary().items():
            for f, (mean, low, high) in figures.items():
                name = metric_name(prefix, f, c)
                for key, value in ((name, mean), (f"{name}_ci_low", low), (f"{name}_ci_high", high)):
                    if math.isfinite(value):
                        out[key] = value
            out[f"{prefix}_errors_c{c}"] = float(self.errors.get(c, 0))
        return out


def metric_name(prefix: str, figure: str, level: int) -> str:
    """``{prefix}_{figure}_c{level}``; energy as ``{prefix}_c{level}_j_per_token``, the suffix paretolab marks as joules."""
    return f"{prefix}_c{level}_{figure}" if figure == "j_per_token" else f"{prefix}_{figure}_c{level}"


def _percentile(values: Sequence[float], q: float) -> float:
    return float(np.percentile(np.asarray(values, dtype=float), q)) if len(values) else float("nan")


def level_figures(results: Sequence[RequestResult]) -> dict[str, float]:
    """The figures of one repeat at one level, from its successful requests (NaN where none succeeded)."""
    done = [r for r in results if r.ok]
    if not done:
        return {f: float("nan") for f in FIGURES}
    gaps = [g for r in done for g in r.gaps]
    wall = max(r.end for r in done) - min(r.start for r in done)
    tokens = sum(r.tokens for r in done)
    return {
        "j_per_token": float("nan"),  # set by run_load where it is given an energy counter
        "ttft_p50_s": _percentile([r.ttft for r in done], 50),
        "ttft_p99_s": _percentile([r.ttft for r in done], 99),
        "itl_p50_s": _percentile(gaps, 50),
        "itl_p99_s": _percentile(gaps, 99),
        "tok_s": tokens / wall if wall > 0 else float("nan"),
        "tok_s_per_user": float(np.mean([r.tokens / (r.end - r.start) for r in done if r.end > r.start])),
    }


def stream_completion(url: str, body: dict[str, Any], *, timeout_s: float, deadline: float | None = None) -> RequestResult:
    """POST one streaming completion to ``url`` (``http://host:port/v1/completions``); never raises, never outlives its bounds.

    The request ends at ``timeout_s`` after it was sent or at ``deadline`` (``perf_counter``), whichever
    comes first: each socket read waits at most for what is left.
    """
    start = time.perf_counter()
    end_by = start + timeout_s if deadline is None else min(start + timeout_s, deadline)
    result = RequestResult(start=start)
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port or 80, timeout=max(0.01, end_by - start))
    try:
        payload = json.dumps({**body, "stream": True}).encode()
        conn.request("POST", parts.path or "/v1/completions", body=payload, headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        if resp.status != 200:
            result.error = f"HTTP {resp.status}: {resp.read(500).decode(errors='replace').strip()}"
            return result
        usage = None
        while True:
            left = end_by - time.perf_counter()
            if left <= 0:
                result.error = f"cut at {timeout_s:g} s (request bound) or the run's deadline"
                return result
            if conn.sock is not None:
                conn.sock.settimeout(left)
            line = resp.readline()
            if not line:
                break  # the server closed the stream
            line = line.strip()
            if not line.startswith(b"data:"):
                continue
            data = line[5:].strip()
            if data == b"[DONE]":
                break
            chunk = json.loads(data)
            choices = chunk.get("choices") or []
            if choices and choices[0].get("text"):
                result.chunks.append(time.perf_counter())
            if chunk.get("usage"):
                usage = chunk["usage"].get("completion_tokens")
        result.end = time.perf_counter()
        result.tokens = int(usage) if usage else len(result.chunks)
        if not result.chunks:
            result.error = "the stream carried no text"
    except (OSError, http.client.HTTPException, ValueError) as exc:  # timeouts are OSError
        result.error = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    finally:
        conn.close()
    return result


def run_load(base_url: str, model: str, spec: LoadSpec, joules: Callable[[], float] | None = None) -> LoadReport:
    """Drive the server at ``base_url`` (``http://127.0.0.1:PORT``) through every level and repeat of ``spec``.

    ``joules``: a cumulative energy counter (joules so far); read around each repeat, it gives that
    repeat's ``j_per_token`` (the counter's joules over the repeat / its output tokens).
    """
    url = base_url.rstrip("/") + "/v1/completions"
    report = LoadReport(spec=spec)
    t0 = time.perf_counter()
    deadline = t0 + spec.max_total_s
    lock = threading.Lock()
    budget = [spec.max_requests]

    def body(prompt: str) -> dict[str, Any]:
        return {"model": model, "prompt": prompt, "max_tokens": spec.new_tokens, "temperature": 0.0,
                "stream_options": {"include_usage": True}, **spec.extra}

    def take() -> bool:
        with lock:
            if budget[0] <= 0:
                report.cut = report.cut or f"max_requests ({spec.max_requests})"
                return False
            if time.perf_counter() >= deadline:
                report.cut = report.cut or f"max_total_s ({spec.max_total_s:g} s)"
                return False
            budget[0] -= 1
            report.sent += 1
            return True

    for i in range(spec.warmup):
        if take():
            stream_completion(url, body(spec.prompts[i % len(spec.prompts)]), timeout_s=spec.request_timeout_s, deadline=deadline)
    for level in spec.concurrency:
        report.repeats[level] = []
        for _ in range(spec.repeats):
            n = spec.requests_per_repeat(level)
            queue = [spec.prompts[i % len(spec.prompts)] for i in range(n)]
            results: list[RequestResult] = []

            def user(mine: list[str]) -> None:
                for prompt in mine:
                    if not take():
                        return
                    r = stream_completion(url, body(prompt), timeout_s=spec.request_timeout_s, deadline=deadline)
                    with lock:
                        results.append(r)

            j0 = joules() if joules is not None else float("nan")
            threads = [threading.Thread(target=user, args=(queue[u::level],), daemon=True) for u in range(level)]
            for t in threads:
                t.start()
            for t in threads:
                # every request inside is bounded by the deadline; the extra second covers the socket's own close
                t.join(max(0.0, deadline - time.perf_counter()) + spec.request_timeout_s + 1.0)
            with lock:
                failed = [r for r in results if not r.ok]
                report.errors[level] = report.errors.get(level, 0) + len(failed)
                if failed and level not in report.first_error:
                    report.first_error[level] = failed[0].error
                if any(r.ok for r in results):
                    figures = level_figures(results)
                    tokens = sum(r.tokens for r in results if r.ok)
                    if joules is not None and tokens:
                        figures["j_per_token"] = (joules() - j0) / tokens
                    report.repeats[level].append(figures)
            if report.cut:
                break
        if not report.repeats[level]:
            why = report.first_error.get(level) or report.cut or "no request was sent"
            raise EngineLoadError(f"concurrency {level}: no request finished ({report.errors.get(level, 0)} failed; first: {why})")
        if report.cut:
            break
    report.wall_s = time.perf_counter() - t0
    return report
