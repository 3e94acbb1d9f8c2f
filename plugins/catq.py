"""CAT-Q ternary post-training quantization, and the BitNet-style absmean ternary baseline.

Wang, Li, Kang, Fan, Yao, "CAT-Q: Cost-efficient and Accurate Ternary Quantization for LLMs",
ICML 2026, https://arxiv.org/abs/2606.26650 (github.com/IntelChina-AI/BitTern, projects/cat-q:
inference-time quantizer and configs released, training code not).

The paper's (read from the released quantizer and configs): groups of 128 weights; per group
μ = mean(w), s = absmean(w − μ); learnable modulation μ' = μ + (2σ(m)−1)·s, s' = 2σ(a)·s,
threshold thd = σ(r) (0.5 at init, so a fresh group ternarizes like absmean rounding);
q = clamp(round((w − μ')/s' · 0.5/thd), −1, 1) · s' (μ' shifts the thresholds only and is not
added back: ``drop_quant_mu``), so storage is 2-bit codes plus one fp16 scale per group:
2.125 bits per weight. m, a, r are fitted by layer-wise output reconstruction on calibration data,
going from a soft (differentiable) to hard ternarization.

Ours: the groups are 128 consecutive weights of the row-major flattened matrix (as the released
quantizer's ``reshape(-1, group_size)``; SmolLM2's 576-wide rows are not a multiple of 128);
one decoder block at a time (not the paper's sliding window of blocks, no LoRA refinement), its
input taken from the already-quantized blocks before it and its target from the full-precision
model; MSE loss (the configs say Huber); the softened ternarization
φ_k(u) = σ(k(u − ½)) − σ(k(−u − ½)) with sharpness k rising geometrically from ``k_start`` to
``k_end`` over the first ``soft_fraction`` of the ``steps`` Adam steps, then hard rounding with a
straight-through gradient. Everything is fake-quantized (``cost_is`` simulated).

``absmean_ternary`` is the baseline: per group of 128, q = clamp(round(w / mean|w|), −1, 1)·mean|w|
(BitNet b1.58's absmean rule, per group instead of per tensor so the bits match), no learning.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from optuna.distributions import IntDistribution

from paretolab import Method, Metric, Paper, TrialContext, hookimpl
from paretolab.errors import ConfigError
from paretolab.plugins._layerwise import CALIB_DEFAULTS, calibration_ids, decoder_layers, first_layer_inputs, layer_outputs, select_kwargs
from paretolab.plugins.baselines import linear_weights
from paretolab.subject import Subject

PAPER = Paper("CAT-Q: Cost-efficient and Accurate Ternary Quantization for LLMs", "ICML 2026", "https://arxiv.org/abs/2606.26650")
BITNET = Paper("The Era of 1-bit LLMs: All Large Language Models are in 1.58 Bits", "arXiv 2024", "https://arxiv.org/abs/2402.17764")


# --- quantizers ----------------------------------------------------------------------------------


def _groups(weight: torch.Tensor, group_size: int) -> torch.Tensor:
    if weight.numel() % group_size:
        raise ConfigError(f"group_size={group_size} does not divide a weight of shape {tuple(weight.shape)}")
    return weight.reshape(-1, group_size)


def absmean_ternary(weight: torch.Tensor, group_size: int = 128) -> torch.Tensor:
    """BitNet-style ternary: per group, clamp(round(w / mean|w|), -1, 1) · mean|w|."""
    g = _groups(weight, group_size)
    scale = g.abs().mean(dim=-1, keepdim=True).clamp_min(1e-8)
    return (torch.clamp(torch.round(g / scale), -1, 1) * scale).reshape(weight.shape)


def soft_ternary(u: torch.Tensor, sharpness: float) -> torch.Tensor:
    """A differentiable staircase in (-1, 1) that tends to clamp(round(u), -1, 1) as sharpness grows."""
    return torch.sigmoid(sharpness * (u - 0.5)) - torch.sigmoid(sharpness * (-u - 0.5))


def catq_ternary(weight: torch.Tensor, m: torch.Tensor, a: torch.Tensor, r: torch.Tensor, *, group_size: int = 128, sharpness: float | None = None) -> torch.Tensor:
    """CAT-Q ternarization with modulation params (n_groups, 1); ``sharpness`` None = hard (STE gradient)."""
    g = _groups(weight, group_size)
    mu = g.mean(dim=-1, keepdim=True)
    s = (g - mu).abs().mean(dim=-1, keepdim=True) + 1e-6
    mu_mod = mu + (2 * torch.sigmoid(m) - 1) * s
    s_mod = 2 * torch.sigmoid(a) * s
    u = (g - mu_mod) / s_mod * (0.5 / torch.sigmoid(r))
    if sharpness is None:
        q = torch.clamp(u + (torch.round(u) - u).detach(), -1, 1)
    else:
        q = soft_ternary(u, sharpness)
    return (q * s_mod).reshape(weight.shape)


def sharpness_at(step: int, steps: int, *, soft_fraction: float, k_start: float, k_end: float) -> float | None:
    """The soft-to-hard schedule: geometric k_start -> k_end over the soft phase, then None (hard)."""
    soft_steps = int(steps * soft_fraction)
    if step >= soft_steps:
        return None
    return k_start * (k_end / k_start) ** (step / max(soft_steps - 1, 1))


def fit_layer(
    layer: torch.nn.Module,
    inputs: torch.Tensor,
    targets: torch.Tensor,
    kwargs: dict[str, Any],
    *,
    group_size: int = 128,
    steps: int = 100,
    lr: float = 1e-2,
    batch_samples: int = 2,
    soft_fraction: float = 0.8,
    k_start: float = 2.0,
    k_end: float = 50.0,
    generator: torch.Generator | None = None,
) -> dict[str, float]:
    """Fit m, a, r of every Linear in ``layer`` to reproduce ``targets`` from ``inputs``; bake hard ternary weights in.

    Returns the output MSE before fitting (at the init, hard) and after (hard).
    """
    linears = {n: mod for n, mod in layer.named_modules() if isinstance(mod, torch.nn.Linear)}
    originals = {n: mod.weight.detach().clone() for n, mod in linears.items()}
    factors = {n: [torch.zeros(w.numel() // group_size, 1, device=w.device, requires_grad=True) for _ in range(3)] for n, w in originals.items()}
    flags = [p.requires_grad for p in layer.parameters()]
    for p in layer.parameters():
        p.requires_grad_(False)

    def weights(sharpness: float | None) -> dict[str, torch.Tensor]:
        return {f"{n}.weight": catq_ternary(w, *factors[n], group_size=group_size, sharpness=sharpness) for n, w in originals.items()}

    def hard_mse() -> float:
        with torch.no_grad():
            _bake(linears, weights(None))
            return float(torch.nn.functional.mse_loss(layer_outputs(layer, inputs, kwargs), targets))

    params = [t for trio in factors.values() for t in trio]
    optimizer = torch.optim.Adam(params, lr=lr)
    n = inputs.shape[0]
    try:
        before = hard_mse()
        for step in range(steps):
            idx = torch.randperm(n, generator=generator, device="cpu")[: min(batch_samples, n)].to(inputs.device)
            sharp = sharpness_at(step, steps, soft_fraction=soft_fraction, k_start=k_start, k_end=k_end)
            out = torch.func.functional_call(layer, weights(sharp), (inputs[idx],), select_kwargs(kwargs, idx, n))
            out = out[0] if isinstance(out, tuple) else out
            loss = torch.nn.functional.mse_loss(out, targets[idx])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        after = hard_mse()
    finally:
        for p, flag in zip(layer.parameters(), flags):
            p.requires_grad_(flag)
    return {"mse_init": before, "mse": after}


def _bake(linears: dict[str, torch.nn.Linear], weights: dict[str, torch.Tensor]) -> None:
    with torch.no_grad():
        for n, mod in linears.items():
            mod.weight.copy_(weights[f"{n}.weight"].detach())


def _ternary_storage(subject: Subject, names: list[str], group_size: int) -> float:
    """Set 2-bit + fp16-per-group storage on ``names``; return the resulting bits per weight."""
    bits = numel = 0
    for name in names:
        weight = subject.model.get_parameter(f"{name}.weight")
        subject.set_storage(f"{name}.weight", value_bits=2, group_size=group_size, scale_bits=16, flat_groups=True)
        bits += subject.storage_of(f"{name}.weight").nbytes(weight) * 8
        numel += weight.numel()
    return bits / max(numel, 1)


def _check_group(method: str, group_size: int, model: torch.nn.Module) -> None:
    if group_size < 2:
        raise ConfigError(f"{method}.group_size must be >= 2, got {group_size}")
    for name, layer in linear_weights(model):
        if layer.weight.numel() % group_size:
            raise ConfigError(f"{method}.group_size={group_size} does not divide the {layer.weight.numel()} weights of {name}")


# --- methods -------------------------------------------------------------------------------------


class CATQ(Method):
    """Ternary PTQ with learnable modulation (m, a, r per group of 128), fitted block by block."""

    name = "catq"
    metrics = ("bits_per_weight",)
    kind = "weights"
    paper = PAPER
    cost_is = "simulated"

    def search_space(self) -> dict[str, Any]:
        return {"steps": IntDistribution(20, 300, log=True)}

    def defaults(self) -> dict[str, Any]:
        return {
            "group_size": 128,
            "steps": 100,  # Adam steps per decoder block (CPU time grows linearly)
            "lr": 1e-2,
            "batch_samples": 2,  # calibration sequences per step
            "soft_fraction": 0.8,  # share of steps with softened ternarization before hard rounding
            "k_start": 2.0,
            "k_end": 50.0,
            **CALIB_DEFAULTS,
            "calib_seq_len": 128,
        }

    def transform(self, subject: Subject, params: dict[str, Any], ctx: TrialContext) -> Subject:
        p = {**self.defaults(), **params}
        group_size, steps = int(p["group_size"]), int(p["steps"])
        _check_group(self.name, group_size, subject.model)
        if steps < 1:
            raise ConfigError(f"catq.steps must be >= 1, got {steps}")
        if not 0.0 <= float(p["soft_fraction"]) <= 1.0:
            raise ConfigError(f"catq.soft_fraction must be in [0, 1], got {p['soft_fraction']}")
        model = subject.model
        ids = calibration_ids(subject, ctx, p, method=self.name)
        hidden_q, kwargs = first_layer_inputs(model, ids)
        hidden_fp = hidden_q
        gen = ctx.generator(offset=29)
        log = []
        for layer in decoder_layers(model):
            target = layer_outputs(layer, hidden_fp, kwargs)
            log.append(
                fit_layer(
                    layer, hidden_q, target, kwargs, group_size=group_size, steps=steps, lr=float(p["lr"]),
                    batch_samples=int(p["batch_samples"]), soft_fraction=float(p["soft_fraction"]),
                    k_start=float(p["k_start"]), k_end=float(p["k_end"]), generator=gen,
                )
            )
            hidden_q, hidden_fp = layer_outputs(layer, hidden_q, kwargs), target
        names = [name for name, _ in linear_weights(model)]
        bpw = _ternary_storage(subject, names, group_size)
        subject.info["bits_per_weight"] = bpw
        subject.info["catq"] = {"layer_mse": log}
        return subject

    def evaluate(self, subject: Subject, ctx: TrialContext) -> dict[str, float]:
        return {"bits_per_weight": float(subject.info["bits_per_weight"])} if "bits_per_weight" in subject.info else {}


class AbsmeanTernary(Method):
    """BitNet-style absmean ternarization per group of 128, no calibration (the CAT-Q baseline)."""

    name = "absmean_ternary"
    kind = "weights"
    paper = BITNET
    cost_is = "simulated"

    def defaults(self) -> dict[str, Any]:
        return {"group_size": 128}

    def transform(self, subject: Subject, params: dict[str, Any], ctx: TrialContext) -> Subject:
        group_size = int({**self.defaults(), **params}["group_size"])
        _check_group(self.name, group_size, subject.model)
        names = []
        for name, layer in linear_weights(subject.model):
            with torch.no_grad():
                layer.weight.copy_(absmean_ternary(layer.weight, group_size))
            names.append(name)
        subject.info["bits_per_weight"] = _ternary_storage(subject, names, group_size)
        return subject

    evaluate = CATQ.evaluate


@hookimpl
def register_methods(register: Callable[[Method], None]) -> None:
    register(CATQ())
    register(AbsmeanTernary())


@hookimpl
def register_metrics(register: Callable[[Metric], None]) -> None:
    register(Metric("bits_per_weight", "bits", "minimize", "stored bits per quantized weight, scales included", estimated=True))

