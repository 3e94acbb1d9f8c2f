"""CAT: concentration–alignment transforms before W4A4 / W4A16 quantization, and its rotation baselines.

Federici, van Breugel, Whatmough, Nagel, "Dissecting Quantization Error: A Concentration-Alignment
Perspective", ICML 2026, https://arxiv.org/abs/2603.04359 (no code released; we read the abstract
and summaries only, so the construction of T below is ours).

The paper's: the SQNR of a quantized linear layer y = x Wᵀ factors into the *concentration* of
W and x (outliers: max over RMS) and the *alignment* of their dominant directions; a
function-preserving, block-diagonal transform y = (x T)(T⁻¹ Wᵀ) built from a calibration
covariance improves both; baselines are no transform and a Hadamard rotation.

Ours (derived here, not taken from the paper): with uniform quantizers whose step follows the
RMS of a concentrated (Hadamard-rotated) tensor, both the weight and the activation noise
terms scale as tr(Σx')·tr(Σw'), with Σx' = Tᵀ Σx T and Σw' = T⁻¹ Σw T⁻ᵀ (Σw = Wᵀ W), while
the signal tr(W Σx Wᵀ) does not depend on T. That product is smallest when Σx' ∝ Σw'
(alignment), i.e. when P = T Tᵀ solves P Σx P = Σw: P is the matrix geometric mean
P = Σx^{-1/2} (Σx^{1/2} Σw Σx^{1/2})^{1/2} Σx^{-1/2}. Any T = P^{1/2} Q with Q orthogonal has
the same alignment; Q = H (Hadamard) then restores concentration — the "mix of Σ^{±1/2} and a
Hadamard". We build it per diagonal block (``block`` channels, a power of two), interpolate with
``strength`` (T = P^{strength/2} H; 0 is the Hadamard baseline), regularise both covariances
with ``damp``·mean(diag)·I, and share one T across the Linears that read the same input
(q/k/v, gate/up: Σw summed over them, i.e. the fused projection), as a fused kernel would.

Quantizers (the same for all three ``transform`` values, so the comparison is fair):
weights symmetric RTN (``paretolab.plugins.baselines.quantize_rtn``, per output channel by
default); activations symmetric per token, absmax, ``a_bits`` (16 = not quantized, W4A16).
Everything is fake-quantized (``cost_is`` simulated). ``size_bytes`` counts the 4-bit weights,
their scales and, for ``cat``, each stored T in fp16 (once per shared input); Hadamard blocks
are computed on the fly and cost no storage.

Reports per-Linear SQNR on held-out tokens (corpus windows disjoint from the calibration ones; artifact ``cat_sqnr.json``) and
their mean as the ``sqnr_db`` metric.

Why one method with a ``transform`` param rather than separate ``hadamard`` and ``rtn_w4a4``
methods: the three variants must share calibration, quantizers and SQNR accounting to be
comparable, and a categorical param lets a study put all three on one frontier.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from typing import Any

import torch
from optuna.distributions import CategoricalDistribution, FloatDistribution

from paretolab import Method, Metric, Paper, TrialContext, hookimpl
from paretolab.errors import ConfigError
from paretolab.plugin_api.storage import TensorStorage
from paretolab.plugin_api.subject import Subject
from paretolab.plugins._layerwise import (
    CALIB_DEFAULTS,
    calibration_ids,
    heldout_ids,
    linear_inputs,
    run_model,
)
from paretolab.plugins.baselines import linear_weights, quantize_rtn

TRANSFORMS = ("none", "hadamard", "cat")
PAPER = Paper("Dissecting Quantization Error: A Concentration-Alignment Perspective", "ICML 2026", "https://arxiv.org/abs/2603.04359")


# --- building blocks ---------------------------------------------------------------------------


def hadamard(n: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """The orthonormal Sylvester Hadamard matrix of order ``n`` (a power of two), on ``device``."""
    if n < 1 or n & (n - 1):
        raise ConfigError(f"a Hadamard block needs a power-of-two size, got {n}")
    h = torch.ones(1, 1, dtype=torch.float64, device=device)
    while h.shape[0] < n:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return h / math.sqrt(n)


def block_size_for(features: int, block: int) -> int:
    """The largest power of two <= ``block`` that divides ``features`` (576 channels and block 128 -> 64)."""
    size = 1
    while size * 2 <= block and features % (size * 2) == 0:
        size *= 2
    return size


def apply_blocks(x: torch.Tensor, blocks: torch.Tensor) -> torch.Tensor:
    """x (..., d) times the block-diagonal matrix with ``blocks`` (nb, b, b) on its diagonal."""
    nb, b, _ = blocks.shape
    xb = x.reshape(*x.shape[:-1], nb, b)
    return torch.einsum("...ki,kij->...kj", xb, blocks.to(x.dtype)).reshape(x.shape)


def quantize_per_token(x: torch.Tensor, bits: int) -> torch.Tensor:
    """Symmetric absmax fake-quantization with one scale per row (token) of the last dimension."""
    if bits >= 16:
        return x
    qmax = 2 ** (bits - 1) - 1
    scale = x.abs().amax(dim=-1, keepdim=True).clamp_min(1e-8) / qmax
    return torch.clamp(torch.round(x / scale), -qmax - 1, qmax) * scale


def quantize_weight(weight: torch.Tensor, bits: int, group_size: int) -> torch.Tensor:
    """RTN per group of input channels (``group_size`` <= 0: one scale per output channel); 16 bits: unchanged."""
    if bits >= 16:
        return weight
    group = weight.shape[1] if group_size <= 0 else group_size
    return quantize_rtn(weight, bits, group)


def sym_power(a: torch.Tensor, power: float) -> torch.Tensor:
    """A^power for a batch of symmetric positive definite matrices (eigenvalues floored)."""
    vals, vecs = torch.linalg.eigh(a)
    vals = vals.clamp_min(vals.amax(dim=-1, keepdim=True) * 1e-10)
    return (vecs * vals.pow(power).unsqueeze(-2)) @ vecs.transpose(-1, -2)


def cat_blocks(sigma_x: torch.Tensor, sigma_w: torch.Tensor, *, strength: float = 1.0, damp: float = 0.01) -> torch.Tensor:
    """Per-block T = P^{strength/2}·H with P Σx P = Σw (both (nb, b, b)); see the module docstring."""
    sx, sw = (_damped(s.to(torch.float64), damp) for s in (sigma_x, sigma_w))
    sx_half, sx_ihalf = sym_power(sx, 0.5), sym_power(sx, -0.5)
    inner = sx_half @ sw @ sx_half
    p = sx_ihalf @ sym_power((inner + inner.transpose(-1, -2)) / 2, 0.5) @ sx_ihalf
    p = (p + p.transpose(-1, -2)) / 2
    p = p / torch.linalg.det(p).abs().pow(1.0 / p.shape[-1]).reshape(-1, 1, 1)  # unit determinant: scale is free
    return sym_power(p, strength / 2) @ hadamard(p.shape[-1], p.device)


def _damped(s: torch.Tensor, damp: float) -> torch.Tensor:
    mean_diag = torch.diagonal(s, dim1=-2, dim2=-1).mean(-1).clamp_min(1e-12)
    return s + damp * mean_diag.reshape(-1, 1, 1) * torch.eye(s.shape[-1], dtype=s.dtype, device=s.device)


def block_gram(x: torch.Tensor, block: int) -> torch.Tensor:
    """Σ_rows of the per-block outer products of ``x`` (rows, d): (d/block, block, block)."""
    xb = x.to(torch.float64).reshape(x.shape[0], -1, block)
    return torch.einsum("nki,nkj->kij", xb, xb)


def sqnr_db(reference: torch.Tensor, approx: torch.Tensor) -> float:
    """10·log10(‖y‖² / ‖y − ŷ‖²)."""
    noise = (reference - approx).double().pow(2).sum().clamp_min(1e-30)
    return float(10 * torch.log10(reference.double().pow(2).sum() / noise))


class CATLinear(torch.nn.Module):
    """y = Q_a(x T) Q_w(W T⁻ᵀ)ᵀ + b: a fake-quantized Linear behind an optional block-diagonal transform.

    ``weight`` keeps the Linear's parameter name, so storage accounting finds it. ``blocks`` may be
    shared with the other Linears that read the same input.
    """

    def __init__(self, linear: torch.nn.Linear, blocks: torch.Tensor | None, *, w_bits: int, group_size: int, a_bits: int) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.a_bits = a_bits
        weight = linear.weight.detach().to(torch.float64)
        if blocks is not None:
            inv_t = torch.linalg.inv(blocks.to(torch.float64)).transpose(-1, -2)  # T⁻ᵀ per block
            weight = apply_blocks(weight, inv_t)
        self.weight = torch.nn.Parameter(quantize_weight(weight, w_bits, group_size).to(linear.weight.dtype), requires_grad=False)
        self.bias = linear.bias
        self.register_buffer("blocks", None if blocks is None else blocks.to(linear.weight.dtype), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.blocks is not None:
            x = apply_blocks(x, self.blocks)
        return torch.nn.functional.linear(quantize_per_token(x, self.a_bits), self.weight, self.bias)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, a_bits={self.a_bits}, transformed={self.blocks is not None}"


# --- the method ----------------------------------------------------------------------------------


class CAT(Method):
    """Block concentration–alignment transform (or a Hadamard rotation, or none) before W/A fake quantization."""

    name = "cat"
    metrics = ("sqnr_db",)
    kind = "weights"
    works_on = ("linear",)
    replaces = ("linear",)  # CATLinear
    paper = PAPER
    cost_is = "simulated"

    def search_space(self) -> dict[str, Any]:
        return {
            "transform": CategoricalDistribution(list(TRANSFORMS)),
            "w_bits": CategoricalDistribution([3, 4, 8]),
            "a_bits": CategoricalDistribution([4, 8, 16]),
            "strength": FloatDistribution(0.0, 1.0),
        }

    def defaults(self) -> dict[str, Any]:
        return {
            "transform": "cat",
            "w_bits": 4,
            "a_bits": 4,  # 16 = activations not quantized (W4A16)
            "group_size": -1,  # weights: -1 = one scale per output channel
            "block": 64,  # transform block (largest power of two <= block dividing the layer width)
            "strength": 1.0,  # T = P^{strength/2} H; 0 = Hadamard only
            "damp": 0.01,
            "sqnr_tokens": 256,  # tokens per Linear for the SQNR report, from corpus windows the fit never saw
            **CALIB_DEFAULTS,
        }

    def transform(self, subject: Subject, params: dict[str, Any], ctx: TrialContext) -> Subject:
        p = {**self.defaults(), **params}
        kind, w_bits, a_bits = str(p["transform"]), int(p["w_bits"]), int(p["a_bits"])
        group_size, block, strength = int(p["group_size"]), int(p["block"]), float(p["strength"])
        _check(kind, w_bits, a_bits, block, strength)
        layers = dict(linear_weights(subject.model))
        stats = _calibrate(subject, ctx, p, layers, block, need_cov=kind == "cat")
        blocks = _transforms(kind, layers, stats, block, strength=strength, damp=float(p["damp"]))

        report: dict[str, float] = {}
        t_bytes_counted: set[int] = set()
        for name, linear in layers.items():
            storage = _weight_storage(linear, w_bits, group_size)
            wrapped = CATLinear(linear, blocks[name], w_bits=w_bits, group_size=group_size, a_bits=a_bits)
            x = stats["samples"][name]
            with torch.no_grad():
                report[name] = sqnr_db(torch.nn.functional.linear(x, linear.weight, linear.bias), wrapped(x))
            _replace(subject.model, name, wrapped)
            extra = 0
            if kind == "cat" and id(blocks[name]) not in t_bytes_counted:
                t_bytes_counted.add(id(blocks[name]))
                extra = blocks[name].numel() * 2  # T in fp16, once per shared input
            subject.set_storage(f"{name}.weight", stored_bytes=storage.nbytes(linear.weight) + extra)
        mean = sum(report.values()) / max(len(report), 1)
        subject.info["cat"] = {"transform": kind, "w_bits": w_bits, "a_bits": a_bits, "sqnr_db": mean}
        ctx.add_artifact("cat_sqnr.json", json.dumps({"transform": kind, "w_bits": w_bits, "a_bits": a_bits, "sqnr_db": report}, indent=1))
        return subject

    def evaluate(self, subject: Subject, ctx: TrialContext) -> dict[str, float]:
        info = subject.info.get("cat")
        return {"sqnr_db": float(info["sqnr_db"])} if info else {}


def _check(kind: str, w_bits: int, a_bits: int, block: int, strength: float) -> None:
    if kind not in TRANSFORMS:
        raise ConfigError(f"cat.transform must be one of {', '.join(TRANSFORMS)}; got {kind!r}")
    if not 2 <= w_bits <= 16:
        raise ConfigError(f"cat.w_bits must be between 2 and 16, got {w_bits}")
    if not 2 <= a_bits <= 16:
        raise ConfigError(f"cat.a_bits must be between 2 and 16, got {a_bits}")
    if block < 2:
        raise ConfigError(f"cat.block must be >= 2, got {block}")
    if not 0.0 <= strength <= 1.0:
        raise ConfigError(f"cat.strength must be in [0, 1], got {strength}")


def _calibrate(subject: Subject, ctx: TrialContext, p: dict[str, Any], layers: dict[str, torch.nn.Linear], block: int, *, need_cov: bool) -> dict[str, Any]:
    """Block input covariances and input-sharing groups from the calibration pass; SQNR samples from held-out tokens.

    The SQNR rows come from a second pass over windows of the corpus that share no token with
    the calibration windows the transforms were fitted on, so the score is a held-out one.
    """
    batch_size = 4
    cov: dict[str, torch.Tensor] = {}
    group_of: dict[str, tuple[str, int]] = {}

    def fit(name: str, x: torch.Tensor) -> None:
        if name not in group_of:  # Linears of one parent reading the very same tensor share a T
            group_of[name] = (name.rsplit(".", 1)[0], x.data_ptr())
        if need_cov:
            b = block_size_for(x.shape[1], block)
            gram = block_gram(x, b)
            cov[name] = cov[name] + gram if name in cov else gram

    with linear_inputs(dict(layers), fit):
        run_model(subject.model, calibration_ids(subject, ctx, p, method="cat"), batch_size=batch_size)

    heldout = heldout_ids(subject, ctx, p, tokens=int(p["sqnr_tokens"]))
    per_batch = max(1, int(p["sqnr_tokens"]) // math.ceil(heldout.shape[0] / batch_size))
    gen = ctx.generator(offset=17)
    samples: dict[str, list[torch.Tensor]] = {name: [] for name in layers}

    def keep(name: str, x: torch.Tensor) -> None:
        rows = torch.randperm(x.shape[0], generator=gen, device="cpu")[:per_batch].to(x.device)  # CPU stream: same rows on any device
        samples[name].append(x[rows].clone())

    with linear_inputs(dict(layers), keep):
        run_model(subject.model, heldout, batch_size=batch_size)
    return {"cov": cov, "groups": group_of, "samples": {k: torch.cat(v) for k, v in samples.items()}}


def _transforms(kind: str, layers: dict[str, torch.nn.Linear], stats: dict[str, Any], block: int, *, strength: float, damp: float) -> dict[str, torch.Tensor | None]:
    """Each Linear's block-diagonal T (None: no transform); Linears sharing an input share one tensor."""
    if kind == "none":
        return {name: None for name in layers}
    if kind == "hadamard":
        cache: dict[int, torch.Tensor] = {}
        out: dict[str, torch.Tensor | None] = {}
        for name, linear in layers.items():
            b = block_size_for(linear.in_features, block)
            if linear.in_features not in cache:
                cache[linear.in_features] = hadamard(b, linear.weight.device).unsqueeze(0).repeat(linear.in_features // b, 1, 1)
            out[name] = cache[linear.in_features]
        return out
    members: dict[tuple[str, int], list[str]] = {}
    for name in layers:
        members.setdefault(stats["groups"][name], []).append(name)
    result: dict[str, torch.Tensor | None] = {}
    for names in members.values():
        b = block_size_for(layers[names[0]].in_features, block)
        sigma_w = sum(block_gram(layers[n].weight.detach(), b) for n in names)
        blocks = cat_blocks(stats["cov"][names[0]], sigma_w, strength=strength, damp=damp).to(torch.float32)
        for n in names:
            result[n] = blocks
    return result


def _weight_storage(linear: torch.nn.Linear, w_bits: int, group_size: int) -> TensorStorage:
    if w_bits >= 16:
        return TensorStorage()
    group = linear.in_features if group_size <= 0 else group_size
    if linear.in_features % group:
        raise ConfigError(f"cat.group_size={group_size} does not divide the {linear.in_features} input channels of a Linear")
    return TensorStorage(value_bits=w_bits, group_size=group, scale_bits=16)


def _replace(model: torch.nn.Module, name: str, module: torch.nn.Module) -> None:
    parent_name, _, child = name.rpartition(".")
    setattr(model.get_submodule(parent_name) if parent_name else model, child, module)


@hookimpl
def register_methods(register: Callable[[Method], None]) -> None:
    register(CAT())


@hookimpl
def register_metrics(register: Callable[[Metric], None]) -> None:
    register(Metric("sqnr_db", "dB", "maximize", "mean per-Linear signal-to-quantization-noise ratio of the output on calibration tokens"))
