"""Perplexity in the engine: the served model's own log-probabilities on the trial's windows, beside the trial's.

The perplexity task scores the first ``max_tokens`` tokens of its corpus in windows of ``context``
(``stride == context``: windows that do not overlap) and writes each window's mean NLL to the trial's
``per_example.json``. Here the same token ids, cut the same way, are sent to the engine as prompts,
asking for each prompt token's log-probability (vLLM: ``prompt_logprobs``; llama.cpp:
``echo`` + ``logprobs`` on the window's text, its echoed tokens checked against the window's ids), one
request per window.

Reported (:func:`compare`): the engine's ppl with its bootstrap interval over windows, and the
paired difference engine − trial over the same windows with its interval; ``gap`` is 1 where
that interval excludes 0 (a difference beyond the noise of the windows) and the difference is larger
than float rounding (:data:`ROUNDING`, relative to the trial's ppl), else 0. Without the floor, an
engine computing the very same weights in its own kernels (vLLM's dense twin: a ppl 4e-7 away, every
window off by a few 1e-7 nats the same way) read as a gap: rounding has no window-to-window noise,
so its bootstrap interval is tiny and excludes 0.
"""

from __future__ import annotations

import http.client
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import numpy as np

from paretolab.data import encode, load_corpus
from paretolab.stats import ARTIFACT, Samples, bootstrap_interval, paired_difference


ROUNDING = 1e-4
"""A relative ppl difference at or under this is float rounding between kernels, never a gap (0.01 %)."""


class EnginePplError(RuntimeError):
    """The engine's answer held no log-probabilities for a window's tokens."""


@dataclass(frozen=True)
class Windows:
    """The task's windows (token ids) and the trial's per-window mean NLL and token counts, in the same order."""

    ids: list[list[int]]
    trial_nll: list[float]
    weights: list[float]


def task_windows(tokenizer: Any, task: dict[str, Any], workdir: Path) -> Windows | str:
    """The trial's perplexity windows, or why there are none to compare (a one-line reason)."""
    if task.get("name") != "perplexity":
        return f"the task is {task.get('name')!r}, not perplexity"
    opts = task.get("options") or {k: v for k, v in task.items() if k != "name"}
    corpus, max_tokens = opts.get("corpus", "pydoc"), int(opts.get("max_tokens", 4096))
    context, stride = int(opts.get("context", 512)), int(opts.get("stride", opts.get("context", 512)))
    if stride != context:
        return f"stride {stride} != context {context}: overlapping windows are not compared in the engine"
    path = workdir / ARTIFACT
    if not path.is_file():
        return f"no {ARTIFACT} in the trial's workdir"
    scores = json.loads(path.read_text())
    trial = [float(v) for v in scores.get("scores", {}).get("nll", [])]
    weights = [float(w) for w in scores.get("weights", [1.0] * len(trial))]
    text, _ = load_corpus(corpus)
    chars = max_tokens * 6
    while True:  # the perplexity task's own prefix rule: tokenize a growing prefix
        ids = encode(tokenizer, text[:chars])
        if len(ids) > max_tokens or chars >= len(text):
            break
        chars *= 2
    ids = ids[:max_tokens]
    n = len(ids)
    starts = list(range(0, max(n - 1, 1), context))
    windows = [ids[s : s + context] for s in starts if s + context <= n] + [ids[s:] for s in starts if s + context > n and n - s > 1]
    if len(windows) != len(trial) or any(len(w) - 1 != int(t) for w, t in zip(windows, weights)):
        return f"the windows cut here ({len(windows)}) do not match the trial's ({len(trial)})"
    return Windows(ids=windows, trial_nll=trial, weights=weights)


def _post(url: str, body: dict[str, Any], timeout_s: float) -> dict[str, Any]:
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port or 80, timeout=timeout_s)
    try:
        conn.request("POST", parts.path, body=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        data = resp.read()
        if resp.status != 200:
            raise EnginePplError(f"HTTP {resp.status}: {data[:300].decode(errors='replace')}")
        return json.loads(data)
    finally:
        conn.close()


def window_nll(base_url: str, engine: str, ids: list[int], *, timeout_s: float = 300.0, tokenizer: Any = None) -> float:
    """Mean NLL of ``ids[1:]`` given what precedes each, from the engine's prompt log-probabilities.

    vLLM takes the token ids as the prompt. llama-cpp-python's server takes text only: the window is
    decoded and sent as text, and the tokens the server echoes back must be the window's own, one for
    one (else EnginePplError: the engine would be scoring other tokens).
    """
    url = base_url.rstrip("/") + "/v1/completions"
    if engine == "vllm":
        out = _post(url, {"model": "trial", "prompt": ids, "max_tokens": 1, "temperature": 0.0, "prompt_logprobs": 0}, timeout_s)
        rows = out["choices"][0].get("prompt_logprobs") or []
        lps = []
        for tok, row in zip(ids[1:], rows[1:]):
            entry = (row or {}).get(str(tok)) or (row or {}).get(tok)
            if entry is None:
                raise EnginePplError(f"vLLM gave no log-probability for prompt token {tok}")
            lps.append(float(entry["logprob"] if isinstance(entry, dict) else entry))
    else:
        if tokenizer is None:
            raise EnginePplError("llama.cpp's server takes text: a tokenizer is needed to send the window")
        text = tokenizer.decode(ids)
        out = _post(url, {"model": "trial", "prompt": text, "max_tokens": 1, "temperature": 0.0, "echo": True, "logprobs": 1}, timeout_s)
        got = out["choices"][0].get("logprobs") or {}
        pieces, lp = got.get("tokens") or [], got.get("token_logprobs") or []
        want = [tokenizer.decode([i]) for i in ids]
        echoed = pieces[: len(want)]
        if echoed != want:
            first = next((i for i, (a, b) in enumerate(zip(echoed, want)) if a != b), min(len(echoed), len(want)))
            raise EnginePplError(f"llama.cpp tokenized the window's text into other tokens ({len(echoed)} echoed for {len(want)}; "
                                 f"first difference at {first}: {echoed[first:first + 1]!r} for {want[first:first + 1]!r})")
        lps = [float(v) for v in lp[1 : len(ids)] if v is not None]
    if len(lps) != len(ids) - 1:
        raise EnginePplError(f"{engine} gave {len(lps)} log-probabilities for a window of {len(ids)} tokens")
    return -float(np.mean(lps))


def compare(engine_nll: list[float], windows: Windows, prefix: str) -> dict[str, float]:
    """``{prefix}_ppl`` (+ ``_ci_low/_ci_high``), ``{prefix}_ppl_diff`` (engine − trial, + interval), ``{prefix}_ppl_gap`` (0/1)."""
    w = np.asarray(windows.weights)
    mine = Samples(np.asarray(engine_nll), w, True, "window")
    theirs = Samples(np.asarray(windows.trial_nll), w, True, "window")
    ppl = float(mine.value())
    out = {f"{prefix}_ppl": ppl}
    if mine.n > 1:
        low, high = bootstrap_interval(mine)
        out.update({f"{prefix}_ppl_ci_low": low, f"{prefix}_ppl_ci_high": high})
    diff = paired_difference(mine, theirs)
    if diff is not None and mine.n > 1:
        out.update({f"{prefix}_ppl_diff": diff.diff, f"{prefix}_ppl_diff_ci_low": diff.low, f"{prefix}_ppl_diff_ci_high": diff.high,
                    f"{prefix}_ppl_gap": 0.0 if diff.within_noise or abs(diff.diff) <= ROUNDING * theirs.value() else 1.0})
    elif diff is not None:
        out[f"{prefix}_ppl_diff"] = diff.diff
    return {k: v for k, v in out.items() if math.isfinite(v)}
