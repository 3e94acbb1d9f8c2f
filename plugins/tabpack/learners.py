"""The learners the tabular task fits: TabPack, a TPE-tuned MLP with a post-hoc greedy ensemble, HistGradientBoosting, TabM."""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import torch

from paretolab.plugins.tabpack.ensemble import average, greedy_ensemble
from paretolab.plugins.tabpack.pack import (
    MemberConfig,
    PackRun,
    sample_configs,
    train_pack,
)
from paretolab.tasks.tabular import Fit, TabularData


@dataclass(frozen=True)
class TabPackLearner:
    """``members`` MLPs with sampled hyperparameters in one pack, one run; the greedy ensemble is rebuilt at every evaluation."""

    members: int = 16
    seed: int | None = None  # a pipeline's seed parameter (pairs trials across learners); None: the trial's seed
    epochs: int = 40
    patience: int = 4
    batch: int = 512
    max_s: float = 420.0  # wall-clock cap on the fit (a trial must end within 10 min on a shared machine)

    def fit_predict(self, data: TabularData, *, seed: int, device: torch.device) -> Fit:
        seed = seed if self.seed is None else self.seed
        configs = sample_configs(self.members, np.random.default_rng(seed))
        chosen: list[int] = []

        def online(run: PackRun, epoch: int) -> None:  # the ensemble as it stands after this evaluation
            ready = [i for i, p in enumerate(run.val_pred) if p is not None]
            picks = greedy_ensemble([run.val_pred[i] for i in ready], data.y["val"], data.regression)  # type: ignore[misc]
            chosen[:] = [ready[i] for i in picks]

        run = train_pack(configs, data, seed=seed, device=device, epochs=self.epochs, patience=self.patience, batch=self.batch,
                         on_eval=online, deadline=time.monotonic() + self.max_s)
        test = average(run.test_pred, chosen)  # type: ignore[arg-type]
        return Fit(test, run.flops, self.members, len(set(chosen)), {"epochs_run": float(len(run.history)), "time_capped": float(run.capped)})


@dataclass(frozen=True)
class TunedMLPLearner:
    """Optuna TPE over the same MLP space, one model per trial (each early-stopped), then a greedy ensemble over all trials."""

    trials: int = 32
    seed: int | None = None
    epochs: int = 40
    patience: int = 4
    batch: int = 512
    max_s: float = 420.0  # wall-clock cap on the fit (a trial must end within 10 min on a shared machine)

    def fit_predict(self, data: TabularData, *, seed: int, device: torch.device) -> Fit:
        seed = seed if self.seed is None else self.seed
        import optuna

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        study = optuna.create_study(sampler=optuna.samplers.TPESampler(seed=seed))
        val_preds, test_preds, flops, deadline, capped = [], [], 0.0, time.monotonic() + self.max_s, False
        for number in range(self.trials):
            if time.monotonic() > deadline:  # the tuning budget is spent: ensemble the trials done
                capped = True
                break
            trial = study.ask()
            config = MemberConfig(
                width=trial.suggest_categorical("width", [32, 64, 128]),
                depth=trial.suggest_int("depth", 1, 3),
                dropout=trial.suggest_float("dropout", 0.0, 0.3),
                lr=trial.suggest_float("lr", 3e-4, 3e-3, log=True),
                weight_decay=trial.suggest_float("weight_decay", 1e-6, 1e-3, log=True),
            )
            run = train_pack([config], data, seed=seed * 1000 + number, device=device, epochs=self.epochs, patience=self.patience, batch=self.batch, deadline=deadline)
            capped = capped or run.capped
            study.tell(trial, float(run.best_val_loss[0]))
            val_preds.append(run.val_pred[0])
            test_preds.append(run.test_pred[0])
            flops += run.flops
        chosen = greedy_ensemble(val_preds, data.y["val"], data.regression)
        return Fit(average(test_preds, chosen), flops, len(val_preds), len(set(chosen)), {"time_capped": float(capped)})


@dataclass(frozen=True)
class HGBLearner:
    """scikit-learn HistGradientBoosting, early-stopped on the validation split (no FLOPs: CPU seconds only)."""

    max_iter: int = 500
    seed: int | None = None
    learning_rate: float = 0.1

    def fit_predict(self, data: TabularData, *, seed: int, device: torch.device) -> Fit:
        seed = seed if self.seed is None else self.seed
        from sklearn.ensemble import (
            HistGradientBoostingClassifier,
            HistGradientBoostingRegressor,
        )

        cls = HistGradientBoostingRegressor if data.regression else HistGradientBoostingClassifier
        model = cls(max_iter=self.max_iter, learning_rate=self.learning_rate, early_stopping=True, n_iter_no_change=20, random_state=seed)
        model.fit(data.x["train"], data.y["train"], X_val=data.x["val"], y_val=data.y["val"])
        pred = model.predict(data.x["test"]) if data.regression else model.predict_proba(data.x["test"])
        return Fit(np.asarray(pred), None, 1, 1, {"hgb_iters": float(model.n_iter_)})


@dataclass(frozen=True)
class TabMLearner:
    """TabM (Gorishniy et al., ICLR 2025; the ``tabm`` package): k weight-sharing MLP heads, mean of their predictions."""

    k: int = 16
    seed: int | None = None
    epochs: int = 40
    patience: int = 4
    batch: int = 512
    max_s: float = 420.0  # wall-clock cap on the fit (a trial must end within 10 min on a shared machine)
    lr: float = 2e-3
    weight_decay: float = 3e-4

    def fit_predict(self, data: TabularData, *, seed: int, device: torch.device) -> Fit:
        seed = seed if self.seed is None else self.seed
        import tabm

        d_out = 1 if data.regression else data.n_classes
        # tabm initialises from torch's global RNG and default device: seed a private fork, build on the subject's device
        with torch.random.fork_rng(devices=[]), torch.device(device):
            torch.manual_seed(seed)
            model = tabm.TabM.make(n_num_features=data.x["train"].shape[1], d_out=d_out, k=self.k, n_blocks=2, d_block=128)
        opt = torch.optim.AdamW(model.parameters(), lr=self.lr, weight_decay=self.weight_decay)
        x = {s: torch.tensor(v, device=device) for s, v in data.x.items()}
        y = {s: torch.tensor(v, device=device) for s, v in data.y.items()}
        # forward FLOPs per row: every one of the k heads runs the shared weights on its own copy of the row (adapters counted too: a slight over-count)
        per_row = 2.0 * sum(p.numel() for p in model.parameters()) * self.k
        gen = torch.Generator(device=device).manual_seed(seed)
        best, bad, best_test, flops, n = np.inf, 0, None, 0.0, x["train"].shape[0]
        deadline, capped = time.monotonic() + self.max_s, False
        for _epoch in range(self.epochs):
            model.train()
            for idx in torch.randperm(n, device=device, generator=gen).split(self.batch):
                out = model(x["train"][idx])  # (B, k, d_out)
                loss = _head_loss(out, y["train"][idx], data.regression)
                opt.zero_grad()
                loss.backward()
                opt.step()
                flops += 3 * per_row * len(idx)
            model.eval()
            with torch.no_grad():
                val = _head_mean(model(x["val"]), data.regression)
                val_loss = _mean_loss(val, y["val"], data.regression)
                flops += per_row * (len(y["val"]) + len(y["test"]))
                if val_loss < best:
                    best, bad, best_test = val_loss, 0, _head_mean(model(x["test"]), data.regression).cpu().numpy()
                else:
                    bad += 1
            if bad >= self.patience:
                break
            if time.monotonic() > deadline:
                capped = True
                break
        return Fit(best_test, flops, 1, 1, {"time_capped": float(capped)})  # type: ignore[arg-type]


def _head_loss(out: torch.Tensor, y: torch.Tensor, regression: bool) -> torch.Tensor:
    if regression:
        return ((out[..., 0] - y[:, None]) ** 2).mean()
    return torch.nn.functional.cross_entropy(out.flatten(0, 1), y.repeat_interleave(out.shape[1]))


def _head_mean(out: torch.Tensor, regression: bool) -> torch.Tensor:
    return out[..., 0].mean(1) if regression else torch.softmax(out, dim=-1).mean(1)


def _mean_loss(pred: torch.Tensor, y: torch.Tensor, regression: bool) -> float:
    if regression:
        return float(((pred - y) ** 2).mean())
    return float(-torch.log(pred[torch.arange(len(y), device=y.device), y].clamp_min(1e-12)).mean())
