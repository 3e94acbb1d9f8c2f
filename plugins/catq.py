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

The official recipe (configs/qwen3-1.7b/config.yaml): 60 epochs over 512 C4 samples (batch 9),
a sliding window of 4 decoder blocks moved by 2 (``num_layer``/``sliding_layer``), Huber loss,
a LoRA of rank 64 added to each weight before the ternarizer (``int_linear_lora.py``), lr 1.5e-3
for m, a, r and 3e-4 for LoRA, grad clip 1.0, soft phase 0.8 of training.

Ours: the groups are 128 consecutive weights of the row-major flattened matrix (as the released
quantizer's ``reshape(-1, group_size)``; SmolLM2's 576-wide rows are not a multiple of 128).
``window``/``stride`` give the sliding window: blocks [b, b+window) are fitted together, their
input taken from the already-quantized blocks before b and their target the full-precision
stream after block b+window; then the quantized stream moves on by ``stride`` blocks and the
next window refits the overlap (m, a, r and LoRA carry over). ``loss`` mse | huber;
``lora_rank`` > 0 adds W + (α/r)·B·A before ternarization (A random, B zero: the training init is a
guess, the training code is unreleased), merged into the ternary weights at the end (so storage
is unchanged). The softened ternarization φ_k(u) = σ(k(u − ½)) − σ(k(−u − ½)) (ours; the paper's
φ is not released) has sharpness k rising geometrically from ``k_start`` to ``k_end`` over the
first ``soft_fraction`` of the ``steps`` Adam steps per window, then hard rounding with a
straight-through gradient. The defaults (window 1, MSE, no LoRA) are the earlier block-by-block
fit; the recipe is set in pipelines/catq_fp32.yaml and catq_smollm2.yaml. The budget is far below the official one
(``steps`` × ``batch_samples`` sequences of 128 tokens per window vs 60 × 512 of 2048).
Everything is fake-quantized (``cost_is`` simulated).

``absmean_ternary`` is the baseline: per group of 128, q = clamp(round(w / mean|w|), −1, 1)·mean|w|
(BitNet b1.58's absmean rule, per group instead of per tensor so the bits match), no learning.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from optuna.distributions import IntDistribution

from paretolab import Method, Metric, Paper, TrialContext, hookimpl
from paretolab.errors import ConfigError
from paretolab.plugin_api.subject import Subject
from paretolab.plugins._layerwise import (
    CALIB_DEFAULTS,
    calibration_ids,
    decoder_layers,
    first_layer_inputs,
    layer_outputs,
    select_kwargs,
)
from paretolab.plugins.baselines import linear_weights

LOSSES = ("mse", "huber")
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


@dataclass
class _Linear:
    """One Linear's fit state: its full-precision weight, modulation (m, a, r) per group, optional LoRA (A, B)."""

    weight: torch.Tensor
    factors: list[torch.Tensor]
    lora: list[torch.Tensor]
    scaling: float

    def quantized(self, group_size: int, sharpness: float | None) -> torch.Tensor:
        w = self.weight + self.scaling * (self.lora[1] @ self.lora[0]) if self.lora else self.weight
        return catq_ternary(w, *self.factors, group_size=group_size, sharpness=sharpness)


def _fit_state(layer: torch.nn.Module, group_size: int, lora_rank: int, lora_alpha: float, generator: torch.Generator | None) -> dict[str, _Linear]:
    """Zero modulation (= absmean-like rounding) and, when ``lora_rank`` > 0, LoRA with B = 0 (so W is unchanged at the start)."""
    state = {}
    for n, mod in layer.named_modules():
        if not isinstance(mod, torch.nn.Linear):
            continue
        w = mod.weight.detach().clone()
        factors = [torch.zeros(w.numel() // group_size, 1, device=w.device, requires_grad=True) for _ in range(3)]
        lora: list[torch.Tensor] = []
        if lora_rank > 0:
            a = torch.randn(lora_rank, w.shape[1], generator=generator, device="cpu").to(w.device) / w.shape[1] ** 0.5
            lora = [a.requires_grad_(True), torch.zeros(w.shape[0], lora_rank, device=w.device, requires_grad=True)]
        state[n] = _Linear(w, factors, lora, lora_alpha / max(lora_rank, 1))
    return state


def _window_forward(blocks: list[torch.nn.Module], states: list[dict[str, _Linear]], hidden: torch.Tensor, kwargs: dict[str, Any], group_size: int, sharpness: float | None) -> torch.Tensor:
    for block, state in zip(blocks, states):
        weights = {f"{n}.weight": lin.quantized(group_size, sharpness) for n, lin in state.items()}
        out = torch.func.functional_call(block, weights, (hidden,), kwargs)
        hidden = out[0] if isinstance(out, tuple) else out
    return hidden


def fit_window(
    blocks: list[torch.nn.Module],
    states: list[dict[str, _Linear]],
    inputs: torch.Tensor,
    targets: torch.Tensor,
    kwargs: dict[str, Any],
    *,
    group_size: int = 128,
    steps: int = 100,
    lr: float = 1e-2,
    lora_lr: float = 3e-4,
    batch_samples: int = 2,
    soft_fraction: float = 0.8,
    k_start: float = 2.0,
    k_end: float = 50.0,
    loss: str = "mse",
    huber_delta: float = 1.0,
    grad_clip: float = 0.0,
    generator: torch.Generator | None = None,
) -> dict[str, float]:
    """Fit the modulation (and LoRA) of every Linear in ``blocks`` so the window maps ``inputs`` to ``targets``.

    Returns the window's output MSE with hard ternary weights before fitting and after.
    """
    flags = [p.requires_grad for b in blocks for p in b.parameters()]
    for b in blocks:
        for p in b.parameters():
            p.requires_grad_(False)
    factors = [t for st in states for lin in st.values() for t in lin.factors]
    loras = [t for st in states for lin in st.values() for t in lin.lora]
    optimizer = torch.optim.Adam([{"params": factors, "lr": lr}] + ([{"params": loras, "lr": lora_lr}] if loras else []))
    objective = torch.nn.functional.mse_loss if loss == "mse" else lambda out, tgt: torch.nn.functional.huber_loss(out, tgt, delta=huber_delta)
    n = inputs.shape[0]

    def hard_mse() -> float:
        with torch.no_grad():
            outs = [_window_forward(blocks, states, inputs[i : i + 4], select_kwargs(kwargs, slice(i, i + 4), n), group_size, None) for i in range(0, n, 4)]
            return float(torch.nn.functional.mse_loss(torch.cat(outs), targets))

    try:
        before = hard_mse()
        for step in range(steps):
            idx = torch.randperm(n, generator=generator, device="cpu")[: min(batch_samples, n)].to(inputs.device)
            sharp = sharpness_at(step, steps, soft_fraction=soft_fraction, k_start=k_start, k_end=k_end)
            value = objective(_window_forward(blocks, states, inputs[idx], select_kwargs(kwargs, idx, n), group_size, sharp), targets[idx])
            optimizer.zero_grad()
            value.backward()
            if grad_clip > 0:
                torch.nn.utils.clip_grad_norm_(factors + loras, grad_clip)
            optimizer.step()
        after = hard_mse()
    finally:
        for p, flag in zip((p for b in blocks for p in b.parameters()), flags):
            p.requires_grad_(flag)
    return {"mse_init": before, "mse": after}


def fit_layer(layer: torch.nn.Module, inputs: torch.Tensor, targets: torch.Tensor, kwargs: dict[str, Any], *, group_size: int = 128, **options: Any) -> dict[str, float]:
    """Fit one block on its own (a window of one, MSE, no LoRA) and bake its hard ternary weights in."""
    state = _fit_state(layer, group_size, 0, 1.0, None)
    result = fit_window([layer], [state], inputs, targets, kwargs, group_size=group_size, **options)
    _bake_state(layer, state, group_size)
    return result


def _bake_state(layer: torch.nn.Module, state: dict[str, _Linear], group_size: int) -> None:
    with torch.no_grad():
        for n, lin in state.items():
            layer.get_submodule(n).weight.copy_(lin.quantized(group_size, None).detach())


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
        return {"steps": IntDistribution(1, 2000, log=True)}

    def defaults(self) -> dict[str, Any]:
        return {
            "group_size": 128,
            "steps": 100,  # Adam steps per window (CPU time grows linearly)
            "lr": 1e-2,
            "batch_samples": 2,  # calibration sequences per step
            "soft_fraction": 0.8,  # share of steps with softened ternarization before hard rounding
            "k_start": 2.0,
            "k_end": 50.0,
            # the official recipe's shape (configs/*.yaml): window 4 sliding by 2, huber, LoRA r 64, clip 1.0;
            # the defaults keep the earlier block-by-block MSE fit so stored studies still mean what they meant
            "window": 1,  # decoder blocks fitted together
            "stride": 1,  # blocks the window moves by (window - stride blocks are refitted in the next window)
            "loss": "mse",  # mse | huber
            "huber_delta": 1.0,
            "lora_rank": 0,  # > 0: a LoRA (B A) added to each weight before ternarization, trained with it
            "lora_alpha": 1.0,  # LoRA scaling alpha / rank (the released wrapper's default alpha)
            "lora_lr": 3e-4,  # the configs' lora_lr
            "grad_clip": 0.0,  # 0 = none; the configs use 1.0
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
        window, stride, rank = int(p["window"]), int(p["stride"]), int(p["lora_rank"])
        if window < 1 or not 1 <= stride <= window:
            raise ConfigError(f"catq.window must be >= 1 and catq.stride in [1, window], got window={window}, stride={stride}")
        if p["loss"] not in LOSSES:
            raise ConfigError(f"catq.loss must be one of {', '.join(LOSSES)}, got {p['loss']!r}")
        if rank < 0:
            raise ConfigError(f"catq.lora_rank must be >= 0 (0 = no LoRA), got {rank}")
        model = subject.model
        ids = calibration_ids(subject, ctx, p, method=self.name)
        hidden_q, kwargs = first_layer_inputs(model, ids)
        layers = list(decoder_layers(model))
        fp_hidden = [hidden_q]  # the full-precision stream at every block boundary: the windows' targets
        for layer in layers:
            fp_hidden.append(layer_outputs(layer, fp_hidden[-1], kwargs))
        gen = ctx.generator(offset=29)
        states = [_fit_state(layer, group_size, rank, float(p["lora_alpha"]), gen) for layer in layers]
        options = {
            "group_size": group_size, "steps": steps, "lr": float(p["lr"]), "lora_lr": float(p["lora_lr"]),
            "batch_samples": int(p["batch_samples"]), "soft_fraction": float(p["soft_fraction"]), "k_start": float(p["k_start"]),
            "k_end": float(p["k_end"]), "loss": str(p["loss"]), "huber_delta": float(p["huber_delta"]), "grad_clip": float(p["grad_clip"]),
        }
        log = []
        begin = 0
        while True:
            end = min(begin + window, len(layers))
            result = fit_window(layers[begin:end], states[begin:end], hidden_q, fp_hidden[end], kwargs, generator=gen, **options)
            log.append({"blocks": [begin, end], **result})
            if end == len(layers):
                break
            for i in range(begin, begin + stride):  # the quantized stream moves on past the blocks this window leaves behind
                _bake_state(layers[i], states[i], group_size)
                hidden_q = layer_outputs(layers[i], hidden_q, kwargs)
            begin += stride
        for layer, state in zip(layers, states):
            _bake_state(layer, state, group_size)
        names = [name for name, _ in linear_weights(model)]
        bpw = _ternary_storage(subject, names, group_size)
        subject.info["bits_per_weight"] = bpw
        subject.info["catq"] = {"window_mse": log}
        return subject

    def evaluate(self, subject: Subject, ctx: TrialContext) -> dict[str, float]:
        return {"bits_per_weight": float(subject.info["bits_per_weight"])} if "bits_per_weight" in subject.info else {}


class AbsmeanTernary(Method):
    """BitNet-style absmean ternarization per group of 128, no calibration (the CAT-Q baseline)."""

    name = "absmean_ternary"
    metrics = ("bits_per_weight",)  # its evaluate is CAT-Q's
    kind = "weights"
    works_on = ("linear",)
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

