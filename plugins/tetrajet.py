"""TetraJet-v2: NVFP4 fully-quantised training, simulated in PyTorch, with OsciReset and OutControl.

Chen et al., "TetraJet-v2: Accurate NVFP4 Training for Large Language Models with Oscillation
Suppression and Outlier Control", https://arxiv.org/abs/2510.27527, official code
github.com/thu-ml/TetraJet-v2-NVFP4Training (``olmo/quantization_real/``: ``linear.py``,
``linear_mix.py``, ``oscillation_reset.py``, ``calibrate.py``; read, not copied).

Cost is **simulated**: there is no FP4 hardware here; values are rounded exactly to what NVFP4 would
hold (:mod:`paretolab.plugins._nvfp4`) and multiplied in fp32. Training FLOPs, time and memory are
those of the fp32 simulation, not of an FP4 GEMM.

The paper's (as their code does it), in every Linear but the LM head:
- forward y = Q(x)·Q(W)ᵀ, Q = NVFP4 round-to-nearest along the input dimension (E2M1 values, E4M3
  scales per 16, an fp32 scale per 128 — their "double-block" quantisation);
- backward, both GEMMs in NVFP4 along their reduction dimension with stochastic rounding, after
  a 16-wide random Hadamard transform (random signs · H₁₆, one draw per GEMM applied to both
  operands): dX = Q(dY·R)·Q(Q(W)ᵀ·R)ᵀ (reduction over outputs), dW = Q(dYᵀ·R')·Q(Q(x)ᵀ·R')ᵀ
  (reduction over tokens);
- OsciReset: from ``osci_start`` on, every ``osci_period`` steps: snapshot W, then over the next
  ``osci_window`` steps accumulate Σ|ΔQ(W)| and Σ|ΔW| per weight; weights whose ratio reaches
  ``osci_threshold`` (their config: 8) oscillate between grid points while barely moving, and are
  reset to their quantised value Q(W) (official defaults: period 200, window 50, start at step 15000);
- OutControl: the ``outlier_ratio`` (10 %) input channels with the largest accumulated ‖x‖₂ over
  ``outlier_steps`` steps (theirs: 50 steps from step 501) are computed in MXFP8 from then on
  (x and W columns in the forward, dYᵀ and xᵀ for those columns of dW), the rest in NVFP4.
Ours: the code (PyTorch fake quantisation, no kernels); start points scaled to our short runs as
fractions of the stage's steps (``osci_start``, ``outlier_start``); the token dimension is not
padded to 128 (our blocks are zero-padded where a width is not a multiple). After training the
wrappers stay: the model evaluates (val_loss, tasks) with its NVFP4 forward, as an FP4-trained
model is used. The baselines: method ``none`` is fp32 training; ``recipe: naive`` is NVFP4 with
round-to-nearest everywhere (forward and backward), no Hadamard, no OsciReset, no OutControl.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from optuna.distributions import CategoricalDistribution, FloatDistribution

from paretolab import Method, Paper, TrialContext, hookimpl
from paretolab.errors import ConfigError
from paretolab.plugin_api.subject import Subject
from paretolab.plugins._nvfp4 import mxfp8, nvfp4, random_hadamard, rotate16
from paretolab.plugins._train_linears import WrappedLinear, wrap_linears, wrappers
from paretolab.training.hooks import TrainingHook, training_of

PAPER = Paper("TetraJet-v2: Accurate NVFP4 Training for Large Language Models with Oscillation Suppression and Outlier Control",
              "arXiv 2025", "https://arxiv.org/abs/2510.27527")
RECIPES = ("tetrajet", "naive")


@dataclass(frozen=True)
class Recipe:
    """How one NVFP4 Linear quantises: ``quantize`` off leaves every tensor exact (for checking the Hadamard path)."""

    quantize: bool = True
    hadamard: bool = True  # random Hadamard before the backward GEMMs' quantisation
    stochastic: bool = True  # stochastic rounding of the backward GEMMs' operands
    outer: int = 128  # fp32 scale per `outer` elements (0: per tensor)
    inner: int = 16  # E4M3 scale per `inner` elements

    def q(self, x: torch.Tensor, *, stochastic: bool = False, generator: torch.Generator | None = None) -> torch.Tensor:
        if not self.quantize:
            return x.float()
        return nvfp4(x, inner=self.inner, outer=self.outer, stochastic=stochastic, generator=generator)

    def q8(self, x: torch.Tensor) -> torch.Tensor:
        return mxfp8(x) if self.quantize else x.float()


def quantize_columns(t: torch.Tensor, recipe: Recipe, fp8_idx: torch.Tensor | None, fp4_idx: torch.Tensor | None) -> torch.Tensor:
    """Round-to-nearest fake quantisation along the last dim: NVFP4, with the ``fp8_idx`` columns in MXFP8 (OutControl)."""
    if fp8_idx is None or fp4_idx is None:
        return recipe.q(t)
    out = torch.empty(t.shape, dtype=torch.float32, device=t.device)
    out[..., fp4_idx] = recipe.q(t[..., fp4_idx])
    out[..., fp8_idx] = recipe.q8(t[..., fp8_idx])
    return out


class _NVFP4Linear(torch.autograd.Function):
    """Forward Q(x)Q(W)ᵀ + b; backward in NVFP4 (stochastic rounding and a random Hadamard as the recipe says)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, recipe: Recipe, seed: int,
                fp8_idx: torch.Tensor | None, fp4_idx: torch.Tensor | None) -> torch.Tensor:
        flat = x.reshape(-1, x.shape[-1])
        xq = quantize_columns(flat, recipe, fp8_idx, fp4_idx)
        wq = quantize_columns(weight, recipe, fp8_idx, fp4_idx)
        y = xq @ wq.T
        if bias is not None:
            y = y + bias
        ctx.save_for_backward(xq, wq, fp8_idx, fp4_idx)
        ctx.recipe, ctx.seed, ctx.x_shape, ctx.has_bias = recipe, seed, x.shape, bias is not None
        ctx.dtypes = (x.dtype, weight.dtype)
        return y.to(x.dtype).reshape(*x.shape[:-1], weight.shape[0])

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        xq, wq, fp8_idx, fp4_idx = ctx.saved_tensors
        recipe: Recipe = ctx.recipe
        g = grad_out.reshape(-1, grad_out.shape[-1]).float()  # (N, out)
        generator = torch.Generator(device=g.device).manual_seed(ctx.seed)
        rot_dx = random_hadamard(generator, g.device) if recipe.hadamard else None
        rot_dw = random_hadamard(generator, g.device) if recipe.hadamard else None

        def prep(t: torch.Tensor, rotation: torch.Tensor | None) -> torch.Tensor:
            """The rotated (along the reduction dim, the last) and quantised operand of a backward GEMM."""
            return recipe.q(rotate16(t, rotation) if rotation is not None else t, stochastic=recipe.stochastic, generator=generator)

        grad_x = grad_w = grad_b = None
        if ctx.needs_input_grad[0]:
            grad_x = (prep(g, rot_dx) @ prep(wq.T, rot_dx).T).to(ctx.dtypes[0]).reshape(ctx.x_shape)
        if ctx.needs_input_grad[1]:
            g_t = prep(g.T, rot_dw)  # (out, N)
            if fp8_idx is None:
                grad_w = g_t @ prep(xq.T, rot_dw).T
            else:
                grad_w = torch.empty(wq.shape, dtype=torch.float32, device=g.device)
                grad_w[:, fp4_idx] = g_t @ prep(xq[:, fp4_idx].T, rot_dw).T
                grad_w[:, fp8_idx] = recipe.q8(g.T) @ recipe.q8(xq[:, fp8_idx].T).T
            grad_w = grad_w.to(ctx.dtypes[1])
        if ctx.has_bias and ctx.needs_input_grad[2]:
            grad_b = g.sum(0).to(ctx.dtypes[1])
        return grad_x, grad_w, grad_b, None, None, None, None


class NVFP4Linear(WrappedLinear):
    """A Linear trained (and evaluated) through NVFP4 fake quantisation; holds its OsciReset and OutControl statistics."""

    def __init__(self, linear: torch.nn.Linear, *, recipe: Recipe, seed: int) -> None:
        super().__init__(linear)
        self.recipe, self.seed, self.calls = recipe, seed, 0
        self.fp8_idx: torch.Tensor | None = None  # OutControl's MXFP8 input channels, once chosen
        self.fp4_idx: torch.Tensor | None = None
        self.channel_norms: torch.Tensor | None = None  # Σ‖x_j‖₂ while OutControl records
        self.osci: dict[str, torch.Tensor] = {}  # OsciReset's snapshot and distance sums while it tracks

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.channel_norms is not None and self.training:
            self.channel_norms += x.detach().reshape(-1, self.in_features).float().norm(dim=0)
        seed = self.seed * 1_000_003 + self.calls
        if self.training and torch.is_grad_enabled():
            self.calls += 1
        return _NVFP4Linear.apply(x, self.weight, self.bias, self.recipe, seed, self.fp8_idx, self.fp4_idx)

    def quantized_weight(self) -> torch.Tensor:
        """Q(W) as the forward uses it."""
        return quantize_columns(self.weight.detach(), self.recipe, self.fp8_idx, self.fp4_idx)

    def choose_outliers(self, ratio: float) -> None:
        """Keep the ``ratio`` input channels of largest recorded norm in MXFP8 from now on."""
        assert self.channel_norms is not None
        n8 = min(self.in_features - 1, max(1, round(ratio * self.in_features)))
        order = torch.argsort(self.channel_norms, descending=True)
        self.fp8_idx, self.fp4_idx = order[:n8].sort().values, order[n8:].sort().values
        self.channel_norms = None

    def extra_repr(self) -> str:
        fp8 = 0 if self.fp8_idx is None else self.fp8_idx.numel()
        return f"{super().extra_repr()}, hadamard={self.recipe.hadamard}, stochastic={self.recipe.stochastic}, mxfp8_channels={fp8}"


@torch.no_grad()
def osci_track(module: NVFP4Linear) -> None:
    """Add this step's |ΔQ(W)| and |ΔW| to the sums (OsciReset's detection window)."""
    w, state = module.weight.detach().float(), module.osci
    q = module.quantized_weight()
    state["dist_q"] += (q - state["last_q"]).abs()
    state["dist_w"] += (w - state["last_w"]).abs()
    state["last_w"], state["last_q"] = w.clone(), q


@torch.no_grad()
def osci_reset(module: NVFP4Linear, threshold: float) -> int:
    """Reset to Q(W) the weights whose Σ|ΔQ(W)|/Σ|ΔW| reached ``threshold`` (MXFP8 columns excluded); returns how many."""
    state = module.osci
    ratio = torch.where(state["dist_w"] > 0, state["dist_q"] / state["dist_w"].clamp_min(1e-30), torch.zeros_like(state["dist_w"]))
    mask = ratio >= threshold
    if module.fp8_idx is not None:
        mask[:, module.fp8_idx] = False
    weight = module.weight
    weight.copy_(torch.where(mask, module.quantized_weight().to(weight.dtype), weight))
    module.osci = {}
    return int(mask.sum())


@torch.no_grad()
def osci_snapshot(module: NVFP4Linear) -> None:
    w = module.weight.detach().float()
    module.osci = {"last_w": w.clone(), "last_q": module.quantized_weight(), "dist_q": torch.zeros_like(w), "dist_w": torch.zeros_like(w)}


@dataclass
class TetraJetHook(TrainingHook):
    """Wraps the Linears in NVFP4 before training; runs OutControl's recording/selection and OsciReset's schedule."""

    recipe: Recipe
    osci: bool
    osci_start: float
    osci_period: int
    osci_window: int
    osci_threshold: float
    outliers: bool
    outlier_ratio: float
    outlier_start: float
    outlier_steps: int

    def convert_model(self, model: torch.nn.Module, state: Any) -> None:
        seed = int(getattr(state.params, "seed", 0))
        wrap_linears(model, lambda name, linear: NVFP4Linear(linear, recipe=self.recipe, seed=seed * 7919 + zlib.crc32(name.encode())))

    def before_step(self, state: Any) -> None:
        if not self.outliers:
            return
        start = round(self.outlier_start * state.max_steps) if state.max_steps else 0
        for module in wrappers(state.model, NVFP4Linear):
            if module.fp8_idx is not None:
                continue
            if module.channel_norms is None and state.step >= start:
                module.channel_norms = torch.zeros(module.in_features, device=module.weight.device)
                state.extra.setdefault("outcontrol_from", state.step)
            elif module.channel_norms is not None and state.step >= state.extra.get("outcontrol_from", 0) + self.outlier_steps:
                module.choose_outliers(self.outlier_ratio)

    def after_step(self, state: Any) -> None:
        if not self.osci or state.step < self.osci_start * state.max_steps:
            return
        phase = state.step % self.osci_period
        for module in wrappers(state.model, NVFP4Linear):
            if phase == 0:
                osci_snapshot(module)
            elif module.osci and phase <= self.osci_window:
                osci_track(module)
            elif module.osci and phase == self.osci_window + 1:
                resets = osci_reset(module, self.osci_threshold)
                state.subject.info["osci_resets"] = state.subject.info.get("osci_resets", 0) + resets

    def end_of_training(self, state: Any) -> None:
        for module in wrappers(state.model, NVFP4Linear):
            module.osci, module.channel_norms = {}, None


class TetraJet(Method):
    """NVFP4 training of every Linear (simulated exactly in fp32): TetraJet-v2's recipe, or naive round-to-nearest."""

    name = "tetrajet"
    kind = "training"
    paper = PAPER
    cost_is = "simulated"  # no FP4 hardware: exact NVFP4 values, fp32 arithmetic; time/memory are the simulation's

    def search_space(self) -> dict[str, Any]:
        return {"recipe": CategoricalDistribution(list(RECIPES)), "osci_threshold": FloatDistribution(2.0, 32.0, log=True),
                "outlier_ratio": FloatDistribution(0.0, 0.5)}

    def defaults(self) -> dict[str, Any]:
        return {"recipe": "tetrajet", "outer": 128, "osci_reset": True, "osci_start": 0.3, "osci_period": 20, "osci_window": 5,
                "osci_threshold": 8.0, "out_control": True, "outlier_ratio": 0.1, "outlier_start": 0.05, "outlier_steps": 5}

    def transform(self, subject: Subject, params: dict[str, Any], ctx: TrialContext) -> Subject:
        p = {**self.defaults(), **params}
        recipe = str(p["recipe"])
        if recipe not in RECIPES:
            raise ConfigError(f"tetrajet.recipe must be one of {', '.join(RECIPES)}, got {recipe!r}")
        outer, period, window = int(p["outer"]), int(p["osci_period"]), int(p["osci_window"])
        if outer < 0 or outer and outer % 16:
            raise ConfigError(f"tetrajet.outer must be 0 (one fp32 scale per tensor) or a multiple of 16, got {outer}")
        if not 1 <= window < period - 1:
            raise ConfigError(f"tetrajet.osci_window must be in [1, osci_period - 1), got {window} with osci_period {period}")
        ratio = float(p["outlier_ratio"])
        if not 0.0 <= ratio < 1.0:
            raise ConfigError(f"tetrajet.outlier_ratio must be in [0, 1) (share of input channels kept in MXFP8), got {ratio}")
        full = recipe == "tetrajet"
        hook = TetraJetHook(
            recipe=Recipe(hadamard=full, stochastic=full, outer=outer),
            osci=full and bool(p["osci_reset"]), osci_start=float(p["osci_start"]), osci_period=period, osci_window=window,
            osci_threshold=float(p["osci_threshold"]), outliers=full and bool(p["out_control"]) and ratio > 0,
            outlier_ratio=ratio, outlier_start=float(p["outlier_start"]), outlier_steps=int(p["outlier_steps"]),
        )
        training_of(subject).attach(hook, method=self.name)
        subject.info["tetrajet"] = {"recipe": recipe, "cost": "simulated (fp32 arithmetic on exact NVFP4 values)",
                                    "osci_reset": hook.osci, "out_control": hook.outliers}
        return subject


@hookimpl
def register_methods(register: Callable[[Method], None]) -> None:
    register(TetraJet())
