"""The learner the sequence task fits: one network (LTC or CoDA) trained with Adam, and its speed beside an LTC's.

Training: ``epochs`` passes over the train split in batches of ``batch`` (order from the seed alone),
cross-entropy or MSE, the weights of the epoch with the best validation loss kept, capped at
``max_s`` seconds of wall time. Speed, measured after the fit under the node's timing lock, in rounds
that alternate this network with a reference LTC of the ``ltc`` method's default size (order
flipped each round, :func:`paretolab.measure.timing.time_paired`): one training step on one batch and
one forward over the whole test split, both warm; the ratios are the reference's time over ours.
"""

from __future__ import annotations

import copy
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from torch.nn import functional as F

from paretolab.measure.timing import node_lock, time_paired
from paretolab.plugin_api.subject import synchronize
from paretolab.plugins.coda.cells import SequenceNet, build
from paretolab.tasks.tabular import Fit, TabularData

REFERENCE = {"arch": "ltc", "units": 32, "unfolds": 6, "latent": 0}  # the ltc method's defaults: what every speed-up is against


@dataclass(frozen=True)
class NetLearner:
    arch: str  # ltc | coda
    units: int = 32  # LTC neurons, or the GRU's hidden size
    unfolds: int = 6  # LTC: fused solver steps per observation
    latent: int = 8  # CoDA: dimensions of the linear ODE
    epochs: int = 20
    batch: int = 64
    lr: float = 0.01
    seed: int | None = None  # a pipeline's seed parameter (pairs trials across learners); None: the trial's seed
    max_s: float = 420.0  # wall-clock cap on training
    timing_s: float = 20.0  # cap on each paired timing (training step, test forward)

    def fit_predict(self, data: TabularData, *, seed: int, device: torch.device) -> Fit:
        seed = seed if self.seed is None else self.seed
        outputs = data.n_classes or 1
        net = build(self.arch, data.x["train"].shape[-1], outputs, units=self.units, unfolds=self.unfolds, latent=self.latent, seed=seed, device=device)
        xs = {k: torch.as_tensor(v, device=device) for k, v in data.x.items()}
        ys = {k: torch.as_tensor(v, device=device) for k, v in data.y.items()}
        loss_of = _loss(data.regression)
        opt = torch.optim.Adam(net.parameters(), lr=self.lr)
        g = torch.Generator(device="cpu").manual_seed(seed + 1)
        best, best_state, epochs_run, capped = float("inf"), copy.deepcopy(net.state_dict()), 0, False
        start = time.perf_counter()
        for _ in range(self.epochs):
            order = torch.randperm(len(xs["train"]), generator=g, device="cpu").to(device)
            for i in range(0, len(order), self.batch):
                idx = order[i : i + self.batch]
                opt.zero_grad(set_to_none=True)
                loss_of(net(xs["train"][idx]), ys["train"][idx]).backward()
                opt.step()
            epochs_run += 1
            with torch.no_grad():
                val = float(loss_of(net(xs["val"]), ys["val"]))
            if val < best:
                best, best_state = val, copy.deepcopy(net.state_dict())
            if time.perf_counter() - start > self.max_s:
                capped = True
                break
        net.load_state_dict(best_state)
        with torch.no_grad():
            out = net(xs["test"])
        pred = out.reshape(-1) if data.regression else torch.softmax(out, -1)
        speed = self.speed(net, xs, ys, loss_of, device)
        extra = {"epochs_run": float(epochs_run), "time_capped": float(capped), **speed}
        return Fit(pred.detach().cpu().numpy().astype(np.float64), None, 1, 1, extra)

    def speed(self, net: SequenceNet, xs: dict[str, torch.Tensor], ys: dict[str, torch.Tensor],
              loss_of: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], device: torch.device) -> dict[str, float]:
        """Median training-step and test-forward times, and the reference LTC's over ours, in paired rounds."""
        ref = build(REFERENCE["arch"], xs["train"].shape[-1], net.readout.out_features, units=REFERENCE["units"],
                    unfolds=REFERENCE["unfolds"], latent=REFERENCE["latent"], seed=0, device=device)
        batch_x, batch_y = xs["train"][: self.batch], ys["train"][: self.batch]

        def trainer(model: SequenceNet) -> Callable[[], None]:
            model = copy.deepcopy(model)
            opt = torch.optim.Adam(model.parameters(), lr=self.lr)

            def step() -> None:
                opt.zero_grad(set_to_none=True)
                loss_of(model(batch_x), batch_y).backward()
                opt.step()
            return step

        def forward(model: SequenceNet) -> Callable[[], None]:
            def run() -> None:
                with torch.no_grad():
                    model(xs["test"])
            return run

        out: dict[str, float] = {}
        with node_lock():
            for name, make in (("train", trainer), ("infer", forward)):
                ours, theirs = make(net), make(ref)
                ours(), theirs()  # warm-up
                paired = time_paired(ours, theirs, min_rounds=3, max_rounds=15, max_s=self.timing_s, target=0.05,
                                     sync=lambda: synchronize(device))
                out[f"{name}_{'step_ms' if name == 'train' else 'ms'}"] = 1000 * statistics.median(paired.method)
                out[f"{name}_speedup"] = statistics.median(paired.ratios)
        return out


def _loss(regression: bool) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    if regression:
        return lambda out, y: F.mse_loss(out.reshape(-1), y)
    return F.cross_entropy
