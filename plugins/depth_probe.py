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
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from paretolab import Metric, TrialContext, hookimpl
from paretolab.errors import ConfigError
from paretolab.measure.measures import Measure
from paretolab.plugin_api.options import option, parse_options
from paretolab.plugin_api.subject import Subject
from paretolab.plugins._layerwise import decoder_layers, run_layer


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
    for ce_inf in torch.linspace(0.0, top, grid + 1, device="cpu")[:-1].tolist() + [top - 1e-3 * max(top, 1e-3)]:
        y = (values - ce_inf).clamp_min(1e-9).log()
        xm, ym = x.mean(), y.mean()
        slope = float(((x - xm) * (y - ym)).sum() / (x - xm).pow(2).sum())
        intercept = float(ym - slope * xm)
        sse = float((y - (intercept + slope * x)).pow(2).sum())
        if sse < best["sse"]:
            sst = float((y - ym).pow(2).sum())
            best = {"sse": sse, "alpha": -slope, "ce_inf": ce_inf, "amplitude": math.exp(intercept), "r2": 1 - sse / sst if sst > 0 else 1.0}
    return best


class DepthProbe(Measure):
    """Per-layer CE of intermediate hidden states on a fixed token budget, fitted by CE∞ + A·l^−α."""

    name = "depth_probe"
    metrics = ("depth_alpha", "depth_ce_inf", "depth_fit_r2")
    options = DepthProbeOptions
    default = False

    def measure(self, subject: Subject, options: Any, ctx: TrialContext) -> dict[str, float]:
        if not isinstance(options, DepthProbeOptions):
            options = parse_options(DepthProbeOptions, options, where="depth_probe")
        ce = layer_cross_entropy(subject, options)
        fit = fit_inverse_depth(ce, fit_from_layer=options.fit_from_layer)
        ctx.add_artifact("depth_probe.json", json.dumps({"ce": ce, "fit": fit, "options": dataclasses.asdict(options)}, indent=1))
        return {"depth_alpha": fit["alpha"], "depth_ce_inf": fit["ce_inf"], "depth_fit_r2": fit["r2"]}


def layer_cross_entropy(subject: Subject, options: DepthProbeOptions) -> list[float]:
    """Mean next-token CE (nats) for each probed depth l = 1..L."""
    from paretolab.tasks import corpus_ids

    if options.seq_len < 2 or options.max_tokens < options.seq_len:
        raise ConfigError(f"depth_probe needs 2 <= seq_len <= max_tokens, got seq_len={options.seq_len}, max_tokens={options.max_tokens}")
    model = subject.model
    layers = decoder_layers(model)
    norm, head = model.model.norm, model.get_output_embeddings()
    ids = corpus_ids(subject.tokenizer, options.corpus, options.max_tokens)  # on the CPU; windows move below
    n_windows = ids.numel() // options.seq_len
    windows = ids[: n_windows * options.seq_len].reshape(n_windows, options.seq_len).to(subject.device)
    totals = torch.zeros(len(layers), dtype=torch.float64, device="cpu")  # host sums of Python floats
    count = 0
    seen: list[tuple[torch.Tensor, dict[str, Any]]] = []

    def grab(module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        hidden = args[0] if args else kwargs["hidden_states"]
        seen.append((hidden, {k: v for k, v in kwargs.items() if k not in ("hidden_states", "cache", "past_key_values", "use_cache")}))

    last_out: list[torch.Tensor] = []
    handles = [layer.register_forward_pre_hook(grab, with_kwargs=True) for layer in layers]
    handles.append(layers[-1].register_forward_hook(lambda m, a, out: last_out.append(out[0] if isinstance(out, tuple) else out)))
    try:
        with torch.no_grad():
            for window in windows.split(1):
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
                    totals[depth] += float(torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets, reduction="sum"))
                count += targets.numel()
    finally:
        for handle in handles:
            handle.remove()
    return (totals / max(count, 1)).tolist()


@hookimpl
def register_measures(register: Callable[[Measure], None]) -> None:
    register(DepthProbe())


@hookimpl
def register_metrics(register: Callable[[Metric], None]) -> None:
    register(Metric("depth_alpha", "", "maximize", "exponent α of the fit CE(l) − CE∞ ∝ l^−α over probed depths (descriptive; the claim is α ≈ 1)"))
    register(Metric("depth_fit_r2", "", "maximize", "R² of the depth probe's log-log fit log(CE(l) − CE∞) = log A − α·log l (fit quality of depth_alpha)"))
    register(Metric("depth_ce_inf", "nats/token", "minimize", "fitted infinite-depth cross-entropy CE∞ of the depth probe"))
