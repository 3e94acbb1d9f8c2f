"""PRAC: each Linear saves a compressed copy of its input for backward (principal subspace + scaled random complement).

Li, Zhang, Fang, "PRAC: Principal-Random Subspace for LLM Activation Compression and Memory-Efficient
Training", ICML 2026, https://arxiv.org/abs/2602.23111 (no official code found; only the abstract was
readable here, so the details below marked *ours* are guesses consistent with it).

The paper's: a Linear's weight gradient ∇W = Gᵀ X needs its input X (N tokens × d) in backward;
instead of X, save its projection onto a principal subspace (top-r right singular vectors of the
activations, from a randomised SVD refreshed every m steps) plus its projection onto a random
subspace of the orthogonal complement, scaled so that the reconstruction X̂ is an unbiased estimate
of X — so ∇W (linear in X) stays unbiased — with the least variance for that budget.

Ours: the random part is a uniformly random k-dimensional subspace of the complement (orthonormal
Q = qr((I − UUᵀ)Ω), Ω Gaussian, drawn afresh at every forward), scaled by (d − r)/k, since
E[QQᵀ] = k/(d − r)·(I − UUᵀ); so X̂ = XUUᵀ + (d − r)/k · XQQᵀ and E[X̂] = X. Saved for backward:
XU (N × r), XQ (N × k) and the small bases U, Q — (r + k)/d of the input, counted by the train
stage's ``peak_act_mb`` (saved-tensor hooks) because the full X really is not kept; Linears that
read the same tensor (q/k/v, gate/up) share one compressed copy (and one random draw), as they
shared the one saved input before. grad_input is
exact (GW); only grad_weight uses X̂. The randomised SVD (range finder with 2 power iterations,
oversampling 8) runs on the current batch's input when a refresh is due, per Linear. Budget:
``keep`` = (r + k)/d; ``principal_share`` = r/(r + k). The baselines at the same bytes are params of
this method: ``mode: principal`` (r = keep·d, no random part: biased) and ``mode: random``
(r = 0, k = keep·d, scale d/k: unbiased, more variance). The LM head (the tied embedding) and
the other ops' saved tensors (norms, attention, the loss) are not compressed. Wrappers exist only
during training: at the end of the stage the plain Linears are back (nothing changes at inference).
"""

from __future__ import annotations

import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from optuna.distributions import (
    CategoricalDistribution,
    FloatDistribution,
    IntDistribution,
)

from paretolab import Method, Paper, TrialContext, hookimpl
from paretolab.errors import ConfigError
from paretolab.plugin_api.subject import Subject
from paretolab.plugins._train_linears import (
    WrappedLinear,
    unwrap_linears,
    wrap_linears,
    wrappers,
)
from paretolab.training.hooks import TrainingHook, training_of

PAPER = Paper("PRAC: Principal-Random Subspace for LLM Activation Compression and Memory-Efficient Training", "ICML 2026",
              "https://arxiv.org/abs/2602.23111")
MODES = ("prac", "principal", "random")
OVERSAMPLE, POWER_ITERS = 8, 2  # randomised SVD (ours: the usual Halko et al. choices)


def principal_basis(x: torch.Tensor, rank: int, generator: torch.Generator) -> torch.Tensor:
    """(d, rank) orthonormal top right singular vectors of x (N, d) by a randomised range finder with power iterations."""
    d = x.shape[1]
    width = min(d, rank + OVERSAMPLE)
    omega = torch.randn(d, width, generator=generator, device=x.device, dtype=x.dtype)
    basis = torch.linalg.qr(x.T @ (x @ omega)).Q
    for _ in range(POWER_ITERS):
        basis = torch.linalg.qr(x.T @ (x @ basis)).Q
    _, _, vh = torch.linalg.svd(x @ basis, full_matrices=False)  # (width, width)
    return basis @ vh[:rank].T


def complement_sample(basis: torch.Tensor | None, d: int, k: int, generator: torch.Generator, *, device: torch.device,
                      dtype: torch.dtype) -> torch.Tensor:
    """(d, k) orthonormal basis of a uniformly random k-dim subspace of the complement of ``basis`` (of all of R^d if None)."""
    omega = torch.randn(d, k, generator=generator, device=device, dtype=dtype)
    if basis is not None:
        omega = omega - basis @ (basis.T @ omega)
        omega = omega - basis @ (basis.T @ omega)  # twice: keeps it orthogonal to float precision
    return torch.linalg.qr(omega).Q


class _CompressedInputLinear(torch.autograd.Function):
    """y = x Wᵀ + b exactly; saves xU and xQ (not x); grad_weight from X̂ = xUUᵀ + scale·xQQᵀ, grad_input exact."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, compressed: Compressed) -> torch.Tensor:
        c = compressed
        ctx.save_for_backward(weight, c.xu, c.xq, c.u, c.q)
        ctx.scale, ctx.has_bias, ctx.x_shape = c.scale, bias is not None, x.shape
        return torch.nn.functional.linear(x, weight, bias)

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        weight, xu, xq, u, q = ctx.saved_tensors
        g = grad_out.reshape(-1, grad_out.shape[-1])  # (N, out)
        grad_x = (g @ weight).reshape(ctx.x_shape) if ctx.needs_input_grad[0] else None
        grad_w = None
        if ctx.needs_input_grad[1]:
            grad_w = torch.zeros_like(weight)
            if xu is not None:
                grad_w = grad_w + (g.T @ xu) @ u.T
            if xq is not None:
                grad_w = grad_w + ctx.scale * ((g.T @ xq) @ q.T)
        grad_b = g.sum(0) if ctx.has_bias and ctx.needs_input_grad[2] else None
        return grad_x, grad_w, grad_b, None


@dataclass
class Compressed:
    """One input's compressed copy: xU (N, r), xQ (N, k), the bases, the complement's scale; ``x`` only to recognise it."""

    x: torch.Tensor
    version: int
    xu: torch.Tensor | None
    xq: torch.Tensor | None
    u: torch.Tensor | None
    q: torch.Tensor | None
    scale: float


def budget(d: int, keep: float, principal_share: float, mode: str) -> tuple[int, int]:
    """(r, k): principal and random dimensions kept of a d-wide input."""
    total = min(d, max(1, round(keep * d)))
    if mode == "principal":
        return total, 0
    if mode == "random":
        return 0, total
    r = min(total - 1, max(1, round(principal_share * total))) if total > 1 else 0
    return r, total - r


class PracLinear(WrappedLinear):
    """A Linear that trains on a compressed saved input (``mode`` prac / principal / random); exact in eval and no-grad.

    Linears that read the same tensor (q/k/v, gate/up) share one compressed copy through ``shared``
    (one object per model): autograd then holds it once, as it held the uncompressed input once.
    """

    def __init__(self, linear: torch.nn.Linear, *, rank: int, k: int, seed: int, shared: dict[str, Compressed] | None = None) -> None:
        super().__init__(linear)
        self.rank, self.k, self.seed = rank, k, seed
        self.calls = 0  # compressions so far: with the seed, fixes this call's random draws
        self.basis: torch.Tensor | None = None  # (d, rank) principal subspace, refreshed when refresh_due
        self.refresh_due = True
        self.shared = {} if shared is None else shared  # "last": the last input compressed by any Linear of the model

    def scale(self) -> float:
        return (self.in_features - self.rank) / self.k if self.k else 0.0

    @torch.no_grad()
    def compress(self, x: torch.Tensor) -> Compressed:
        """Project x onto this Linear's principal basis (refreshed if due) and a fresh random subspace of its complement."""
        flat = x.detach().reshape(-1, self.in_features)
        generator = torch.Generator(device=x.device).manual_seed(self.seed * 1_000_003 + self.calls)
        self.calls += 1
        if self.rank and (self.basis is None or self.refresh_due):
            self.basis = principal_basis(flat, self.rank, generator)
            self.refresh_due = False
        u = self.basis if self.rank else None
        q = complement_sample(u, self.in_features, self.k, generator, device=x.device, dtype=x.dtype) if self.k else None
        return Compressed(x, x._version, None if u is None else flat @ u, None if q is None else flat @ q, u, q, self.scale())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not (self.training and torch.is_grad_enabled() and self.weight.requires_grad):
            return torch.nn.functional.linear(x, self.weight, self.bias)
        last = self.shared.get("last")
        if last is None or last.x is not x or last.version != x._version:  # `is`: an equal address may be a new tensor
            last = self.shared["last"] = self.compress(x)
        return _CompressedInputLinear.apply(x, self.weight, self.bias, last)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, rank={self.rank}, random={self.k}"


class PracHook(TrainingHook):
    """Wraps the Linears before training, asks for a new principal basis every ``refresh`` steps, unwraps at the end."""

    def __init__(self, *, mode: str, keep: float, principal_share: float, refresh: int) -> None:
        self.mode, self.keep, self.principal_share, self.refresh = mode, keep, principal_share, refresh

    def convert_model(self, model: torch.nn.Module, state: Any) -> None:
        seed = int(getattr(state.params, "seed", 0))

        def build(name: str, linear: torch.nn.Linear) -> PracLinear:
            rank, k = budget(linear.in_features, self.keep, self.principal_share, self.mode)
            return PracLinear(linear, rank=rank, k=k, seed=seed * 7919 + zlib.crc32(name.encode()), shared=shared)

        shared: dict[str, Compressed] = {}
        wrap_linears(model, build)

    def before_step(self, state: Any) -> None:
        if state.step % self.refresh == 0:
            for module in wrappers(state.model, PracLinear):
                module.refresh_due = True

    def after_backward(self, state: Any) -> None:
        for module in wrappers(state.model, PracLinear)[:1]:
            module.shared.clear()  # the last input is no longer needed: let it go before the optimizer step

    def end_of_training(self, state: Any) -> None:
        unwrap_linears(state.model, PracLinear)


class Prac(Method):
    """Compress what each Linear saves for backward to keep·d dims (principal + scaled random complement), unbiased ∇W."""

    name = "prac"
    kind = "training"
    paper = PAPER
    cost_is = "real"  # what autograd holds really is smaller (peak_act_mb counts the saved tensors)

    def search_space(self) -> dict[str, Any]:
        return {"mode": CategoricalDistribution(list(MODES)), "keep": FloatDistribution(0.05, 0.9),
                "principal_share": FloatDistribution(0.1, 0.9), "refresh": IntDistribution(1, 200, log=True)}

    def defaults(self) -> dict[str, Any]:
        return {"mode": "prac", "keep": 0.25, "principal_share": 0.5, "refresh": 20}

    def transform(self, subject: Subject, params: dict[str, Any], ctx: TrialContext) -> Subject:
        p = {**self.defaults(), **params}
        mode, keep, share, refresh = str(p["mode"]), float(p["keep"]), float(p["principal_share"]), int(p["refresh"])
        if mode not in MODES:
            raise ConfigError(f"prac.mode must be one of {', '.join(MODES)}, got {mode!r}")
        if not 0.0 < keep < 1.0:
            raise ConfigError(f"prac.keep must be in (0, 1) (the fraction of each Linear's input dims saved), got {keep}")
        if not 0.0 < share < 1.0:
            raise ConfigError(f"prac.principal_share must be in (0, 1) (the principal part of the kept dims), got {share}")
        if refresh < 1:
            raise ConfigError(f"prac.refresh must be >= 1 (steps between randomised SVDs), got {refresh}")
        training_of(subject).attach(PracHook(mode=mode, keep=keep, principal_share=share, refresh=refresh), method=self.name)
        subject.info["prac"] = {"mode": mode, "keep": keep, "principal_share": share, "refresh": refresh}
        return subject


@hookimpl
def register_methods(register: Callable[[Method], None]) -> None:
    register(Prac())
