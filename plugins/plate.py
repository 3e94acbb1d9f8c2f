"""PLATE: per Linear, ΔW = B·A·Qᵀ with B (redundant output neurons) and Q (low-energy input subspace) frozen; only A trains.

"PLATE: Plasticity-Tunable Efficient Adapters" (Salesforce AI Research, 2026), official code
github.com/SalesforceAIResearch/PLATE (``plate/layer.py``, read; not copied).

The paper's: for a pretrained Linear W (out × in), pick the ``r`` output neurons (rows) with the
highest mean |cosine| to a set of anchor rows — the most redundant ones, whose function the rest of
the layer largely duplicates — as the only rows that change (B = the out × r one-hot selector of
those rows, frozen). From the *other* rows W_f (the frozen ones) take Q = the in × k orthonormal
basis of the input directions where W_f has the least energy (bottom right singular vectors),
k = in − (the number of top singular values holding ``col_tau`` of the energy of W_f), at most
``max_rank``; an update confined to it barely moves the outputs of the inputs the pretrained layer
responds to. A (r × k) starts at zero and is the only trainable tensor:
y = Wx + α·B·A·Qᵀx. At most 90 % of a layer's rows are made trainable (the official code's rule).
Knobs: ``r`` (plasticity: more rows, more capacity, more forgetting) and ``col_tau`` (higher: a
smaller, lower-energy Q, less forgetting). Targets: every Linear of the decoder layers (q, k, v, o,
gate, up, down), as in the official README; the embedding, norms and LM head stay frozen.

Ours: exact cosines and an exact decomposition of W_f in fp32 (eigh of W_fᵀW_f when W_f is tall; when wide, eigh of W_fW_fᵀ for its row space and a seeded
Gaussian projected onto the complement for the null-space part, an arbitrary basis there as an SVD's would be) (the official code sketches both — a
Gaussian random projection for the cosines, SRHT + Hutch++ screening and a polished eigenproblem
for Q — to scale to billions of parameters; at SmolLM2's sizes the exact computation takes seconds).
The full SVD's basis includes W_f's null space (when W_f has fewer rows than inputs, e.g. k_proj),
which is the lowest-energy part. Anchors: every ⌊N/256⌋-th row, 256 of them (the official default,
``anchor_strategy: stride``). B is kept as the one-hot matrix so that ΔW = B·A·Qᵀ is literal. B, Q and
the base weights are Parameters with ``requires_grad`` off (so ``size_bytes`` counts B and Q as the
weights they are), and the ``train`` stage's AdamW neither updates nor decays them (its groups hold
trainable tensors only).
Guessed: α = 1 (the README's example; the config's default is 0.5).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from optuna.distributions import FloatDistribution, IntDistribution

from paretolab import Method, Paper, TrialContext, hookimpl
from paretolab.errors import ConfigError
from paretolab.plugin_api.metrics import Metric
from paretolab.plugin_api.subject import Subject

PAPER = Paper("PLATE: Plasticity-Tunable Efficient Adapters", "Salesforce AI Research, 2026", "https://github.com/SalesforceAIResearch/PLATE")
MAX_TRAINABLE_FRACTION = 0.9  # the official code's cap on the rows made trainable per layer
ANCHORS = 256
TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
TRAINABLE_PARAMS = Metric("trainable_params", "params", "minimize",
                          "fine-tuning methods: parameters the train stage updates (requires_grad), counted after the transform")


def target_linears(model: torch.nn.Module, targets: tuple[str, ...] = TARGETS) -> Iterator[tuple[str, torch.nn.Linear]]:
    """(name, module) of every nn.Linear whose last name part is one of ``targets`` (the LM head is never one)."""
    for name, module in model.named_modules():
        if type(module) is torch.nn.Linear and name.rsplit(".", 1)[-1] in targets:
            yield name, module


@torch.no_grad()
def redundant_rows(weight: torch.Tensor, r: int) -> torch.Tensor:
    """Indices of the ``r`` rows with the highest mean |cosine| to the anchor rows (every ⌊N/256⌋-th row)."""
    n = weight.shape[0]
    unit = weight.float() / weight.float().norm(dim=1, keepdim=True).clamp_min(1e-8)
    anchors = unit if n <= ANCHORS else unit[torch.arange(0, (n // ANCHORS) * ANCHORS, n // ANCHORS, device=weight.device)]
    scores = (unit @ anchors.T).abs().mean(dim=1)
    return torch.topk(scores, r).indices.sort().values


@torch.no_grad()
def low_energy_basis(frozen: torch.Tensor, col_tau: float, max_rank: int) -> torch.Tensor:
    """(in, k) orthonormal bottom right singular vectors of the frozen rows: k = in − #top singular values holding col_tau of the energy."""
    rows, d_in = frozen.shape
    w = frozen.float()
    if rows >= d_in:  # tall: eigh of the in × in Gram matrix (several times faster than an SVD)
        energy, vectors = torch.linalg.eigh(w.T @ w)  # ascending
        energy, basis = energy.flip(0).clamp_min(0.0), vectors.flip(1)  # by falling energy
        return basis[:, -_low_rank(energy, d_in, col_tau, max_rank):].contiguous()
    # wide: the rows' own directions from the small rows × rows Gram matrix; the other in − rank directions
    # (the null space, energy 0, the lowest) are any orthonormal basis of the complement — a seeded Gaussian projected
    # onto it (a full SVD would return an arbitrary one there too, at several times the cost)
    energy, u = torch.linalg.eigh(w @ w.T)
    energy, u = energy.flip(0).clamp_min(0.0), u.flip(1)
    rank = int((energy > energy[0] * 1e-10).sum()) if float(energy[0]) > 0 else 0
    k = _low_rank(energy, d_in, col_tau, max_rank)
    v = w.T @ u[:, :rank] / energy[:rank].sqrt()  # (in, rank) right singular vectors, by falling energy
    v = torch.linalg.qr(v).Q if rank else v
    n_null = min(k, d_in - rank)
    gen = torch.Generator(device=w.device).manual_seed(0)
    g = torch.randn(d_in, n_null, generator=gen, device=w.device)
    for _ in range(2):  # twice: what rounding leaves in span(v) after one projection
        g = g - v @ (v.T @ g)
    null = torch.linalg.qr(g).Q
    return torch.cat([v[:, rank - (k - n_null):], null], dim=1).contiguous() if k > n_null else null.contiguous()


def _low_rank(energy: torch.Tensor, d_in: int, col_tau: float, max_rank: int) -> int:
    """k = in − the fewest top directions holding col_tau of the energy, within [1, max_rank]."""
    total = float(energy.sum())
    high = int(torch.searchsorted(torch.cumsum(energy, 0) / total, torch.tensor(col_tau, device=energy.device)).item()) + 1 if total > 0 else 0
    return max(1, min(d_in - min(high, d_in), max_rank))


_SHAPES: dict[tuple[Any, ...], tuple[torch.Tensor, torch.Tensor]] = {}  # per process: a weight's fingerprint and knobs -> (rows, Q)
_SHAPES_MAX = 1024  # entries (one per layer and setting: SmolLM2 has 210 targets)


def plate_shape(weight: torch.Tensor, r: int, col_tau: float, max_rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(selected row indices, Q) of one pretrained weight; remembered per process, since every trial of a worker
    (and lora's count matching) starts from copies of the same weights and the decompositions cost minutes on a busy CPU."""
    w = weight.detach()
    key = (tuple(w.shape), w.dtype, float(w.double().sum()), float(w.double().square().sum()), float(w.double()[0].sum()), r, col_tau, max_rank)
    if key not in _SHAPES:
        out = w.shape[0]
        rows = redundant_rows(w, max(1, min(r, int(MAX_TRAINABLE_FRACTION * out))))
        keep = torch.ones(out, dtype=torch.bool, device=w.device)
        keep[rows] = False
        if len(_SHAPES) >= _SHAPES_MAX:
            _SHAPES.clear()
        _SHAPES[key] = (rows, low_energy_basis(w[keep], col_tau, max_rank))
    rows, q = _SHAPES[key]
    return rows.to(w.device), q.to(w.device)


class PlateLinear(torch.nn.Module):
    """y = base(x) + α·B·A·Qᵀx: ``base``, B (one-hot, out × r) and Q (in × k) are frozen; A (r × k) trains."""

    def __init__(self, base: torch.nn.Linear, rows: torch.Tensor, q: torch.Tensor, alpha: float) -> None:
        super().__init__()
        self.base = base
        for p in base.parameters():
            p.requires_grad_(False)
        device, dtype = base.weight.device, base.weight.dtype
        # frozen Parameters rather than buffers: they are weights the adapted model keeps (size_bytes counts them)
        self.plate_B = torch.nn.Parameter(torch.eye(base.out_features, device=device, dtype=dtype)[:, rows].contiguous(), requires_grad=False)
        self.plate_Q = torch.nn.Parameter(q.to(device=device, dtype=dtype, copy=True), requires_grad=False)
        self.plate_A = torch.nn.Parameter(torch.zeros(rows.numel(), q.shape[1], device=device, dtype=dtype))
        self.alpha = alpha

    def delta_weight(self) -> torch.Tensor:
        """ΔW = α·B·A·Qᵀ (out × in)."""
        return self.alpha * self.plate_B @ self.plate_A @ self.plate_Q.T

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        update = torch.nn.functional.linear(torch.nn.functional.linear(x @ self.plate_Q, self.plate_A), self.plate_B)
        return self.base(x) + self.alpha * update

    def reset_parameters(self) -> None:
        raise ConfigError("plate: B and Q are computed from pretrained weights, so the model cannot be re-initialised after it; "
                          "set train.init: keep (or apply plate to a pretrained model)")


def trainable_count(model: torch.nn.Module) -> int:
    """Parameters with requires_grad (tied ones once)."""
    seen: dict[int, int] = {}
    for p in model.parameters():
        if p.requires_grad:
            seen[id(p)] = p.numel()
    return sum(seen.values())


@dataclass(frozen=True)
class PlateSettings:
    r: int
    col_tau: float
    max_rank: int
    alpha: float

    @classmethod
    def of(cls, params: dict[str, Any], where: str = "plate") -> PlateSettings:
        s = cls(int(params["r"]), float(params["col_tau"]), int(params["max_rank"]), float(params.get("alpha", 1.0)))
        if s.r < 1:
            raise ConfigError(f"{where}.r must be >= 1 (trainable output neurons per layer), got {s.r}")
        if not 0.0 < s.col_tau < 1.0:
            raise ConfigError(f"{where}.col_tau must be in (0, 1) (the energy share of W's input space kept out of Q), got {s.col_tau}")
        if s.max_rank < 1:
            raise ConfigError(f"{where}.max_rank must be >= 1 (the largest width of Q), got {s.max_rank}")
        return s


def plate_trainable_params(model: torch.nn.Module, settings: PlateSettings) -> int:
    """What ``plate`` with ``settings`` would train on ``model`` (Σ r·k over the targets), without changing it."""
    total = 0
    for _, linear in target_linears(model):
        rows, q = plate_shape(linear.weight.detach(), settings.r, settings.col_tau, settings.max_rank)
        total += rows.numel() * q.shape[1]
    return total


def apply_plate(model: torch.nn.Module, settings: PlateSettings) -> int:
    """Freeze every parameter, wrap each target Linear in a PlateLinear; returns the number of wrapped layers."""
    for p in model.parameters():
        p.requires_grad_(False)
    found = list(target_linears(model))
    for name, linear in found:
        rows, q = plate_shape(linear.weight.detach(), settings.r, settings.col_tau, settings.max_rank)
        parent_name, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent_name) if parent_name else model, child, PlateLinear(linear, rows, q, settings.alpha))
    return len(found)


class Plate(Method):
    """Fine-tune only A of ΔW = B·A·Qᵀ per Linear (B: redundant rows, Q: low-energy inputs, both frozen); a later train stage trains it."""

    name = "plate"
    kind = "training"
    paper = PAPER
    cost_is = "real"
    metrics = ("trainable_params",)

    def search_space(self) -> dict[str, Any]:
        return {"r": IntDistribution(1, 512, log=True), "col_tau": FloatDistribution(0.5, 0.99), "max_rank": IntDistribution(1, 2048, log=True),
                "alpha": FloatDistribution(0.1, 4.0, log=True)}

    def defaults(self) -> dict[str, Any]:
        return {"r": 32, "col_tau": 0.9, "max_rank": 512, "alpha": 1.0}

    def transform(self, subject: Subject, params: dict[str, Any], ctx: TrialContext) -> Subject:
        settings = PlateSettings.of({**self.defaults(), **params})
        if not apply_plate(subject.model, settings):
            raise ConfigError(f"plate: the model has no Linear named one of {', '.join(TARGETS)} to adapt")
        subject.info["trainable_params"] = trainable_count(subject.model)
        return subject

    def measure(self, subject: Subject, ctx: TrialContext) -> dict[str, float]:
        return {"trainable_params": float(trainable_count(subject.model))}


@hookimpl
def register_methods(register: Callable[[Method], None]) -> None:
    register(Plate())


@hookimpl
def register_metrics(register: Callable[[Metric], None]) -> None:
    register(TRAINABLE_PARAMS)
