"""A pack of MLPs trained as one network with one optimiser; each member stops on its own.

What is TabPack's (Gorishniy et al., yandex-research/tabpack; read, not copied): many base models
with randomly sampled hyperparameters (width, depth, dropout, learning rate, weight decay) packed
into one network and one optimiser, trained in parallel on the same batches; a member whose
validation score stops improving for ``patience`` evaluations is taken out of the pack (its best
state and predictions kept) while the others go on; the ensemble is built greedily on the fly.
What is ours: the packed layout (members padded to the widest width with a unit mask, shallower
members pass through the extra layers unchanged), each member's initial weights and dropout masks from its own
seed (it trains as it would alone, whatever else is in the pack), our own per-member AdamW, plain MLPs only (no
numerical embeddings), FLOPs counted analytically for the padded shapes that really run.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch

from paretolab.tasks.tabular import TabularData


@dataclass(frozen=True)
class MemberConfig:
    """One member's hyperparameters."""

    width: int
    depth: int
    dropout: float
    lr: float
    weight_decay: float


def sample_configs(n: int, rng: np.random.Generator, *, widths: tuple[int, ...] = (32, 64, 128), max_depth: int = 3) -> list[MemberConfig]:
    """``n`` members with hyperparameters drawn from TabPack-like ranges (narrowed for CPU)."""
    return [
        MemberConfig(
            width=int(rng.choice(widths)),
            depth=int(rng.integers(1, max_depth + 1)),
            dropout=float(rng.uniform(0.0, 0.3)),
            lr=float(np.exp(rng.uniform(np.log(3e-4), np.log(3e-3)))),
            weight_decay=float(np.exp(rng.uniform(np.log(1e-6), np.log(1e-3)))),
        )
        for _ in range(n)
    ]


def member_seeds(seed: int, k: int) -> list[int]:
    """Each member's own seed for its initial weights and dropout masks (a pack's ``seed`` orders the shared batches)."""
    return [int(np.random.SeedSequence([seed, i]).generate_state(1)[0]) for i in range(k)]


class PackedMLP(torch.nn.Module):
    """K MLPs as batched tensors (members on dim 0): x (B, d_in) -> (K, B, d_out).

    Member k is drawn from its own generator (``seeds[k]``) in its own shapes and fan-ins, then zero-padded to the pack's
    widest width and deepest depth: it starts with exactly the weights it would have alone, whatever else is in the pack.
    Its dropout masks come from the same generator, drawn only for its own units and layers.
    """

    def __init__(self, configs: list[MemberConfig], d_in: int, d_out: int, *, device: torch.device, seeds: list[int]) -> None:
        super().__init__()
        if len(seeds) != len(configs):
            raise ValueError(f"PackedMLP: {len(configs)} members but {len(seeds)} seeds")
        k, w, depth = len(configs), max(c.width for c in configs), max(c.depth for c in configs)
        self.d_in, self.d_out, self.width, self.layers = d_in, d_out, w, depth
        self.widths, self.depths, self.dropouts = [c.width for c in configs], [c.depth for c in configs], [c.dropout for c in configs]
        self.generators = [torch.Generator(device=device).manual_seed(s) for s in seeds]
        shapes = {"w_in": (k, d_in, w), "b_in": (k, 1, w), "w_hidden": (k, max(depth - 1, 0), w, w), "b_hidden": (k, max(depth - 1, 0), 1, w),
                  "w_out": (k, w, d_out), "b_out": (k, 1, d_out)}
        values = {name: torch.zeros(shape, device=device) for name, shape in shapes.items()}
        for m, (c, gen) in enumerate(zip(configs, self.generators)):
            def draw(shape: tuple[int, ...], fan_in: int, gen: torch.Generator = gen) -> torch.Tensor:
                return (torch.rand(shape, device=device, generator=gen) * 2 - 1) / math.sqrt(fan_in)  # nn.Linear's bound

            values["w_in"][m, :, : c.width], values["b_in"][m, :, : c.width] = draw((d_in, c.width), d_in), draw((1, c.width), d_in)
            for layer in range(c.depth - 1):
                values["w_hidden"][m, layer, : c.width, : c.width] = draw((c.width, c.width), c.width)
                values["b_hidden"][m, layer, :, : c.width] = draw((1, c.width), c.width)
            values["w_out"][m, : c.width], values["b_out"][m] = draw((c.width, d_out), c.width), draw((1, d_out), c.width)
        for name, value in values.items():
            setattr(self, name, torch.nn.Parameter(value))
        units = torch.arange(w, device=device)
        self.register_buffer("mask", (units[None, :] < torch.tensor(self.widths, device=device)[:, None]).float()[:, None, :])
        self.register_buffer("depth", torch.tensor(self.depths, device=device))
        self.register_buffer("dropout", torch.tensor(self.dropouts, device=device)[:, None, None])

    @property
    def members(self) -> int:
        return int(self.w_in.shape[0])

    def flops_per_row(self) -> float:
        """Multiply-adds x2 of one row through every member, padded shapes as they run."""
        per_member = self.d_in * self.width + (self.layers - 1) * self.width * self.width + self.width * self.d_out
        return 2.0 * per_member * self.members

    def forward(self, x: torch.Tensor, dropout: bool = False) -> torch.Tensor:
        """``dropout``: apply each member's dropout (in training mode), masks from each member's own generator."""
        drop = dropout and self.training
        h = self._act(torch.einsum("bi,kiw->kbw", x, self.w_in) + self.b_in, 0, drop)
        for layer in range(self.layers - 1):
            nh = self._act(torch.bmm(h, self.w_hidden[:, layer]) + self.b_hidden[:, layer], layer + 1, drop)
            h = torch.where((self.depth > layer + 1)[:, None, None], nh, h)  # a shallower member passes through
        return torch.bmm(h, self.w_out) + self.b_out

    def _act(self, z: torch.Tensor, layer: int, drop: bool) -> torch.Tensor:
        h = torch.relu(z) * self.mask
        if drop:
            keep = torch.ones_like(h)
            for m, (width, depth, p, gen) in enumerate(zip(self.widths, self.depths, self.dropouts, self.generators)):
                if depth > layer and p > 0:  # only the member's own layers and units draw
                    keep[m, :, :width] = (torch.rand((h.shape[1], width), device=h.device, generator=gen) >= p).float()
            h = h * keep / (1 - self.dropout)
        return h

    def keep(self, index: torch.Tensor) -> None:
        """Keep only the members at ``index`` (the others leave the pack: no more compute, no more updates)."""
        for name, param in list(self._parameters.items()):
            self._parameters[name] = torch.nn.Parameter(param.detach()[index].clone())
        for name, buf in list(self._buffers.items()):
            self._buffers[name] = buf[index].clone()
        kept = index.tolist()
        self.widths, self.depths, self.dropouts = [self.widths[i] for i in kept], [self.depths[i] for i in kept], [self.dropouts[i] for i in kept]
        self.generators = [self.generators[i] for i in kept]


class PackAdamW:
    """AdamW over packed parameters with a learning rate and weight decay per member (dim 0)."""

    def __init__(self, model: PackedMLP, lr: list[float], weight_decay: list[float], betas: tuple[float, float] = (0.9, 0.999)) -> None:
        device = model.w_in.device
        self.model, self.betas, self.t = model, betas, 0
        self.lr = torch.tensor(lr, device=device)
        self.wd = torch.tensor(weight_decay, device=device)
        self.state = {n: (torch.zeros_like(p), torch.zeros_like(p)) for n, p in model.named_parameters()}

    def step(self) -> None:
        self.t += 1
        b1, b2 = self.betas
        with torch.no_grad():
            for name, p in self.model.named_parameters():
                if p.grad is None:  # hidden layers of a pack whose members all have depth 1 (an empty tensor)
                    continue
                m, v = self.state[name]
                m.mul_(b1).add_(p.grad, alpha=1 - b1)
                v.mul_(b2).addcmul_(p.grad, p.grad, value=1 - b2)
                shape = (-1,) + (1,) * (p.dim() - 1)
                lr, wd = self.lr.view(shape), self.wd.view(shape)
                p.mul_(1 - lr * wd)
                p.sub_(lr * (m / (1 - b1**self.t)) / ((v / (1 - b2**self.t)).sqrt() + 1e-8))
                p.grad = None

    def keep(self, index: torch.Tensor) -> None:
        self.lr, self.wd = self.lr[index], self.wd[index]
        self.state = {n: (m[index].clone(), v[index].clone()) for n, (m, v) in self.state.items()}


@dataclass
class PackRun:
    """What training a pack leaves: each member's best validation loss and predictions, and how long it trained."""

    best_val_loss: np.ndarray
    val_pred: list[np.ndarray | None]
    test_pred: list[np.ndarray | None]
    updates: np.ndarray  # optimiser steps each member took before it left the pack (or the run ended)
    stopped_at: np.ndarray  # epoch after which a member left the pack (-1: still in at the end)
    flops: float = 0.0
    capped: bool = False  # the wall-clock cap ended training before every member stopped
    history: list[dict[str, float]] = field(default_factory=list)


def member_loss(out: torch.Tensor, y: torch.Tensor, regression: bool) -> torch.Tensor:
    """(K, B, d_out) outputs against targets -> (K,) mean loss per member."""
    if regression:
        return ((out[..., 0] - y[None]) ** 2).mean(1)
    logp = torch.log_softmax(out, dim=-1)
    return -logp.gather(-1, y[None, :, None].expand(out.shape[0], -1, 1))[..., 0].mean(1)


def predict(out: torch.Tensor, regression: bool) -> torch.Tensor:
    return out[..., 0] if regression else torch.softmax(out, dim=-1)


def train_pack(
    configs: list[MemberConfig],
    data: TabularData,
    *,
    seed: int,
    device: torch.device,
    epochs: int = 40,
    patience: int = 4,
    batch: int = 256,
    on_eval: Callable[[PackRun, int], None] | None = None,
    deadline: float | None = None,
    seeds: list[int] | None = None,
) -> PackRun:
    """Train every member on the same batches; a member leaves after ``patience`` evaluations without a better val loss.

    ``deadline`` (a time.monotonic() value) ends the run after the evaluation that passes it (``run.capped``).
    ``seed`` orders the batches; ``seeds`` (default :func:`member_seeds`) give each member its initial weights and dropout
    masks, so a member trains exactly as it would alone (``train_pack([config], ..., seeds=[its seed])``), up to rounding.
    """
    gen = torch.Generator(device=device).manual_seed(seed)
    x = {k: torch.tensor(v, device=device) for k, v in data.x.items()}
    y = {k: torch.tensor(v, device=device) for k, v in data.y.items()}
    d_out = 1 if data.regression else data.n_classes
    model = PackedMLP(configs, x["train"].shape[1], d_out, device=device, seeds=member_seeds(seed, len(configs)) if seeds is None else seeds)
    opt = PackAdamW(model, [c.lr for c in configs], [c.weight_decay for c in configs])
    k = len(configs)
    run = PackRun(np.full(k, np.inf), [None] * k, [None] * k, np.zeros(k, dtype=np.int64), np.full(k, -1))
    active = np.arange(k)  # member ids still in the pack, in pack order
    bad = np.zeros(k, dtype=np.int64)
    n = x["train"].shape[0]
    for epoch in range(epochs):
        model.train()
        order = torch.randperm(n, device=device, generator=gen)
        for start in range(0, n, batch):
            idx = order[start : start + batch]
            loss = member_loss(model(x["train"][idx], dropout=True), y["train"][idx], data.regression).sum()  # members' grads stay apart
            loss.backward()
            opt.step()
            run.updates[active] += 1
            run.flops += 3 * model.flops_per_row() * len(idx)  # forward + backward ~ 3x forward
        model.eval()
        with torch.no_grad():
            val_out, test_out = model(x["val"]), model(x["test"])
            val_loss = member_loss(val_out, y["val"], data.regression).cpu().numpy()
            run.flops += model.flops_per_row() * (len(y["val"]) + len(y["test"]))
            val_pred, test_pred = predict(val_out, data.regression).cpu().numpy(), predict(test_out, data.regression).cpu().numpy()
        for slot, member in enumerate(active):
            if val_loss[slot] < run.best_val_loss[member]:
                run.best_val_loss[member], bad[member] = val_loss[slot], 0
                run.val_pred[member], run.test_pred[member] = val_pred[slot], test_pred[slot]
            else:
                bad[member] += 1
        leaving = bad[active] >= patience
        run.stopped_at[active[leaving]] = epoch
        run.history.append({"epoch": float(epoch), "active": float(len(active)), "best_val_loss": float(np.min(run.best_val_loss))})
        if on_eval is not None:
            on_eval(run, epoch)
        if deadline is not None and time.monotonic() > deadline:
            run.capped = True
            break
        if leaving.any():
            stay = np.nonzero(~leaving)[0]
            if len(stay) == 0:
                break
            index = torch.tensor(stay, device=device)
            model.keep(index)
            opt.keep(index)
            active = active[stay]
    return run
