"""Depth probe: per-layer cross-entropy of intermediate hidden states and its inverse-depth power-law fit.

Liu, Kangaslahti, Liu, Gore, "Inverse Depth Scaling From Most Layers Being Similar", ICML 2026,
https://arxiv.org/abs/2602.05970 (code: github.com/liuyz0/DepthScaling, LLMs/*-hid-*.py).

The paper's probe (read in their LLMs/qwen-hid-2-2.py): the residual stream h_l entering layer l
(h_0 = embeddings, l = 0..L−1) goes through the *last* transformer layer, then the final norm and
the LM head; the cross-entropy of the next token gives CE(l + 1), and the model's own output is
CE(L). Claim: CE(l) − CE∞ ∝ l^−α with α ≈ 1. ``through_last_layer: false`` gives the plain
logit lens instead (h_1..h_L straight into norm + head).

Ours: a fixed token budget (the first ``max_tokens`` tokens of ``corpus``, in windows of
``seq_len``); the fit is a grid over CE∞ in [0, min CE) with, for each candidate, a least-squares
line through (log l, log(CE(l) − CE∞)) over layers l ≥ ``fit_from_layer``; the candidate with the
smallest squared log residual wins (no scipy needed). Reports ``depth_alpha``, ``depth_ce_inf`` and
``depth_fit_r2`` (R² of that log-log line: the fit quality; with CE∞ free, a handful of depths fit
almost any decreasing curve, so read α beside R² and the number of layers);
the curve and the fit go to the artifact ``depth_probe.json``.

The interval of α: CE(l) is a token mean over ``depth_alpha_n_windows`` windows, and every window is
probed at every depth, so a 95 % percentile bootstrap resamples whole windows (the same resampled
windows for all depths, ``RESAMPLES`` times, seed ``SEED``: a report is reproducible) and refits α
on each resample (:func:`fit_alpha_batch`, the same grid fit vectorised) → ``depth_alpha_ci_low`` /
``depth_alpha_ci_high``. It says how much α would move on another stretch of the same kind of text,
not how well a power law describes the curve (that is R²). Resamples whose fit fails (a non-finite
CE or α) are dropped; ``depth_alpha_boot_failed`` is their fraction, and above 5 % the interval rests
on a biased subset (the windows that fail are the ones left out). A few windows give a rough interval.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from paretolab import Metric, TrialContext, hookimpl
from paretolab.errors import ConfigError
from paretolab.measure.measures import Measure
from paretolab.plugin_api.options import option, parse_options
from paretolab.plugin_api.subject import Subject
from paretolab.plugins._layerwise import decoder_layers, run_layer

RESAMPLES = 2000  # bootstrap resamples of the windows (as core/stats.py)
SEED = 0  # fixed: the same windows give the same interval
LEVEL = 0.95  # percentile interval
BOOT_FAILED_WARN = 0.05  # above this fraction of failed resamples the interval is suspect (see the module doc)


@dataclass(frozen=True)
class DepthProbeOptions:
    corpus: str = option("pydoc", data="corpus")  # pydoc (built in) | wikitext2 | a path
    max_tokens: int = option(1024, low=2)  # token budget (the probe costs about one LM-head pass per layer per token)
    seq_len: int = option(256, low=2, at_most="max_tokens")  # window length
    through_last_layer: bool = True  # the paper's probe; false = logit lens
    fit_from_layer: int = option(1, low=1)  # first depth l used in the power-law fit (1-based)


def fit_inverse_depth(ce: list[float], *, fit_from_layer: int = 1, grid: int = 400) -> dict[str, float]:
    """Fit CE(l) = CE∞ + A·l^−α (l = 1..L) by a grid over CE∞ and log-log least squares."""
    depths = torch.arange(1, len(ce) + 1, dtype=torch.float64, device="cpu")  # a small fit on the host
    values = torch.tensor(ce, dtype=torch.float64, device="cpu")
    keep = depths >= fit_from_layer
    depths, values = depths[keep], values[keep]
    if depths.numel() < 3:
        raise ConfigError(f"the depth fit needs at least 3 layers from fit_from_layer={fit_from_layer}, got {depths.numel()}")
    x = depths.log()
    best: dict[str, float] = {"sse": math.inf}
    top = float(values.min())
    for ce_inf in ce_inf_grid(top, grid):
        y = (values - ce_inf).clamp_min(1e-9).log()
        xm, ym = x.mean(), y.mean()
        slope = float(((x - xm) * (y - ym)).sum() / (x - xm).pow(2).sum())
        intercept = float(ym - slope * xm)
        sse = float((y - (intercept + slope * x)).pow(2).sum())
        if sse < best["sse"]:
            sst = float((y - ym).pow(2).sum())
            best = {"sse": sse, "alpha": -slope, "ce_inf": ce_inf, "amplitude": math.exp(intercept), "r2": 1 - sse / sst if sst > 0 else 1.0}
    return best


def ce_inf_grid(top: float, grid: int) -> list[float]:
    """The fit's CE∞ candidates below the smallest CE ``top`` (a float32 linspace, then just under ``top``)."""
    return torch.linspace(0.0, top, grid + 1, device="cpu")[:-1].tolist() + [top - 1e-3 * max(top, 1e-3)]


def fit_alpha_batch(ce: np.ndarray, *, fit_from_layer: int = 1, grid: int = 400, chunk: int = 64) -> np.ndarray:
    """α of :func:`fit_inverse_depth` for each row of ``ce`` (curves × depths), vectorised; NaN where the fit fails."""
    ce = np.atleast_2d(np.asarray(ce, dtype=np.float64))
    depths = np.arange(1, ce.shape[1] + 1, dtype=np.float64)
    keep = depths >= fit_from_layer
    if keep.sum() < 3:
        raise ConfigError(f"the depth fit needs at least 3 layers from fit_from_layer={fit_from_layer}, got {int(keep.sum())}")
    values, xc = ce[:, keep], np.log(depths[keep])
    xc = xc - xc.mean()
    sxx = float((xc**2).sum())
    alpha = np.full(len(ce), np.nan)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        for start in range(0, len(ce), chunk):
            v = values[start : start + chunk]  # (b, n)
            cand = np.array([ce_inf_grid(float(top), grid) if math.isfinite(top) else [math.nan] * (grid + 1) for top in v.min(axis=1)])
            y = np.log(np.clip(v[:, None, :] - cand[:, :, None], 1e-9, None))  # (b, g, n)
            y = y - y.mean(axis=2, keepdims=True)
            slope = (y * xc).sum(axis=2) / sxx
            sse = ((y - slope[..., None] * xc) ** 2).sum(axis=2)
            sse = np.where(np.isfinite(sse), sse, np.inf)
            best = sse.argmin(axis=1)  # the first minimum, as the loop's strict <
            rows = np.arange(len(v))
            a = -slope[rows, best]
            alpha[start : start + len(v)] = np.where(np.isfinite(sse[rows, best]) & np.isfinite(a), a, np.nan)
    return alpha


def bootstrap_alpha(
    window_nll: np.ndarray,
    window_tokens: np.ndarray | None = None,
    *,
    fit_from_layer: int = 1,
    resamples: int = RESAMPLES,
    level: float = LEVEL,
    seed: int = SEED,
) -> dict[str, float]:
    """Percentile bootstrap of α over windows: ``window_nll`` (windows × depths) is each window's summed CE
    (or its mean CE when ``window_tokens`` is None: every window weighs the same). One resample draws
    windows with replacement and takes CE(l) = Σ NLL / Σ tokens over them, the same windows at every depth."""
    nll = np.asarray(window_nll, dtype=np.float64)
    tokens = np.ones(len(nll)) if window_tokens is None else np.asarray(window_tokens, dtype=np.float64)
    n = len(nll)
    if n == 0:
        return {"low": math.nan, "high": math.nan, "n_windows": 0.0, "failed": 1.0}
    idx = np.random.default_rng(seed).integers(0, n, size=(resamples, n))
    counts = np.zeros((resamples, n))
    np.add.at(counts, (np.arange(resamples)[:, None], idx), 1.0)  # how often each window is drawn
    bad = ~np.isfinite(nll)  # 0 × NaN is NaN in the product: a bad entry spoils only the resamples that draw it
    with np.errstate(invalid="ignore", divide="ignore"):
        ce = (counts @ np.where(bad, 0.0, nll)) / (counts @ tokens)[:, None]  # (resamples, depths)
    ce[(counts @ bad) > 0] = np.nan
    alphas = fit_alpha_batch(ce, fit_from_layer=fit_from_layer)
    ok = alphas[np.isfinite(alphas)]
    tail = (1 - level) / 2
    low, high = (float(np.quantile(ok, tail)), float(np.quantile(ok, 1 - tail))) if ok.size else (math.nan, math.nan)
    return {"low": low, "high": high, "n_windows": float(n), "failed": 1 - ok.size / resamples}


class DepthProbe(Measure):
    """Per-layer CE of intermediate hidden states on a fixed token budget, fitted by CE∞ + A·l^−α."""

    name = "depth_probe"
    metrics = (
        "depth_alpha", "depth_ce_inf", "depth_fit_r2",
        "depth_alpha_ci_low", "depth_alpha_ci_high", "depth_alpha_n_windows", "depth_alpha_boot_failed",
    )
    options = DepthProbeOptions
    default = False

    def measure(self, subject: Subject, options: Any, ctx: TrialContext) -> dict[str, float]:
        if not isinstance(options, DepthProbeOptions):
            options = parse_options(DepthProbeOptions, options, where="depth_probe")
        window_nll, window_tokens = window_cross_entropy(subject, options)
        ce = mean_cross_entropy(window_nll, window_tokens)
        fit = fit_inverse_depth(ce, fit_from_layer=options.fit_from_layer)
        boot = bootstrap_alpha(window_nll, window_tokens, fit_from_layer=options.fit_from_layer)
        window_ce = (window_nll / np.maximum(window_tokens, 1)[:, None]).tolist()
        about = {**boot, "resamples": RESAMPLES, "seed": SEED, "level": LEVEL}
        if boot["failed"] > BOOT_FAILED_WARN:
            about["warning"] = f"{boot['failed']:.0%} of the resamples failed their fit and were dropped: the interval is suspect"
        artifact = {"ce": ce, "fit": fit, "bootstrap": about, "window_ce": window_ce}
        ctx.add_artifact("depth_probe.json", json.dumps({**artifact, "options": dataclasses.asdict(options)}, indent=1))
        return {
            "depth_alpha": fit["alpha"], "depth_ce_inf": fit["ce_inf"], "depth_fit_r2": fit["r2"],
            "depth_alpha_ci_low": boot["low"], "depth_alpha_ci_high": boot["high"],
            "depth_alpha_n_windows": boot["n_windows"], "depth_alpha_boot_failed": boot["failed"],
        }


def mean_cross_entropy(window_nll: np.ndarray, window_tokens: np.ndarray) -> list[float]:
    """CE(l) over all windows: Σ NLL / Σ tokens, summed window by window (in probe order)."""
    return (window_nll.sum(axis=0) / max(int(window_tokens.sum()), 1)).tolist()


def layer_cross_entropy(subject: Subject, options: DepthProbeOptions) -> list[float]:
    """Mean next-token CE (nats) for each probed depth l = 1..L."""
    return mean_cross_entropy(*window_cross_entropy(subject, options))


def window_cross_entropy(subject: Subject, options: DepthProbeOptions) -> tuple[np.ndarray, np.ndarray]:
    """Summed next-token CE (nats) of each window at each probed depth (windows × depths), and each window's token count."""
    from paretolab.tasks import corpus_ids

    if options.seq_len < 2 or options.max_tokens < options.seq_len:
        raise ConfigError(f"depth_probe needs 2 <= seq_len <= max_tokens, got seq_len={options.seq_len}, max_tokens={options.max_tokens}")
    model = subject.model
    layers = decoder_layers(model)
    norm, head = model.model.norm, model.get_output_embeddings()
    ids = corpus_ids(subject.tokenizer, options.corpus, options.max_tokens)  # on the CPU; windows move below
    n_windows = ids.numel() // options.seq_len
    windows = ids[: n_windows * options.seq_len].reshape(n_windows, options.seq_len).to(subject.device)
    nll = np.zeros((n_windows, len(layers)))  # host sums of Python floats, one row per window
    tokens = np.zeros(n_windows)
    seen: list[tuple[torch.Tensor, dict[str, Any]]] = []

    def grab(module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        hidden = args[0] if args else kwargs["hidden_states"]
        seen.append((hidden, {k: v for k, v in kwargs.items() if k not in ("hidden_states", "cache", "past_key_values", "use_cache")}))

    last_out: list[torch.Tensor] = []
    handles = [layer.register_forward_pre_hook(grab, with_kwargs=True) for layer in layers]
    handles.append(layers[-1].register_forward_hook(lambda m, a, out: last_out.append(out[0] if isinstance(out, tuple) else out)))
    try:
        with torch.no_grad():
            for w, window in enumerate(windows.split(1)):
                seen.clear()
                last_out.clear()
                model(input_ids=window, use_cache=False)
                targets = window[:, 1:].reshape(-1)
                if options.through_last_layer:
                    probes = [run_layer(layers[-1], hidden, seen[-1][1]) for hidden, _ in seen[:-1]] + [last_out[0]]
                else:
                    probes = [hidden for hidden, _ in seen[1:]] + [last_out[0]]
                for depth, hidden in enumerate(probes):
                    logits = head(norm(hidden))[:, :-1].float()
                    nll[w, depth] = float(torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets, reduction="sum"))
                tokens[w] = targets.numel()
    finally:
        for handle in handles:
            handle.remove()
    return nll, tokens


@hookimpl
def register_measures(register: Callable[[Measure], None]) -> None:
    register(DepthProbe())


@hookimpl
def register_metrics(register: Callable[[Metric], None]) -> None:
    register(Metric("depth_alpha", "", "maximize", "exponent α of the fit CE(l) − CE∞ ∝ l^−α over probed depths (descriptive; the claim is α ≈ 1)"))
    register(Metric("depth_fit_r2", "", "maximize", "R² of the depth probe's log-log fit log(CE(l) − CE∞) = log A − α·log l (fit quality of depth_alpha)"))
    register(Metric("depth_alpha_ci_low", "", "maximize", "lower end of the 95% bootstrap interval of depth_alpha over the probe's windows (same resampled windows at every depth)"))
    register(Metric("depth_alpha_ci_high", "", "maximize", "upper end of the 95% bootstrap interval of depth_alpha over the probe's windows (same resampled windows at every depth)"))
    register(Metric("depth_alpha_n_windows", "windows", "maximize", "windows behind depth_alpha: the units its interval resamples"))
    register(Metric("depth_alpha_boot_failed", "fraction", "minimize", "fraction of depth_alpha's bootstrap resamples whose fit failed (dropped); above 0.05 the interval is suspect"))
    register(Metric("depth_ce_inf", "nats/token", "minimize", "fitted infinite-depth cross-entropy CE∞ of the depth probe"))
