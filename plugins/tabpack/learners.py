"""The learners the tabular task fits: TabPack, a TPE-tuned MLP with a post-hoc greedy ensemble, HistGradientBoosting, TabM."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from paretolab.plugins.tabpack.ensemble import average, greedy_ensemble
from paretolab.plugins.tabpack.pack import MemberConfig, PackRun, sample_configs, train_pack
from paretolab.tasks.tabular import Fit, TabularData


@dataclass(frozen=True)
class TabPackLearner:
    """``members`` MLPs with sampled hyperparameters in one pack, one run; the greedy ensemble is rebuilt at every evaluation."""

    members: int = 16
    epochs: int = 40
    patience: int = 4
    batch: int = 256

    def fit_predict(self, data: TabularData, *, seed: int, device: torch.device) -> Fit:
        configs = sample_configs(self.members, np.random.default_rng(seed))
        chosen: list[int] = []

        def online(run: PackRun, epoch: int) -> None:  # the ensemble as it stands after this evaluation
            ready = [i for i, p in enumerate(run.val_pred) if p is not None]
            picks = greedy_ensemble([run.val_pred[i] for i in ready], data.y["val"], data.regression)  # type: ignore[misc]
            chosen[:] = [ready[i] for i in picks]

        run = train_pack(configs, data, seed=seed, device=device, epochs=self.epochs, patience=self.patience, batch=self.batch, on_eval=online)
        test = average(run.test_pred, chosen)  # type: ignore[arg-type]
        return Fit(test, run.flops, self.members, len(set(chosen)), {"epochs_run": float(len(run.history))})


@dataclass(frozen=True)
class TunedMLPLearner:
    """Optuna TPE over the same MLP space, one model per trial (each early-stopped), then a greedy ensemble over all trials."""

    trials: int = 32
    epochs: int = 40
    patience: int = 4
    batch: int = 256

    def fit_predict(self, data: TabularData, *, seed: int, device: torch.device) -> Fit:
        import optuna

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        study = optuna.create_study(sampler=optuna.samplers.TPESampler(seed=seed))
        val_preds, test_preds, flops = [], [], 0.0
        for number in range(self.trials):
            trial = study.ask()
            config = MemberConfig(
                width=trial.suggest_categorical("width", [32, 64, 128]),
                depth=trial.suggest_int("depth", 1, 3),
                dropout=trial.suggest_float("dropout", 0.0, 0.3),
                lr=trial.suggest_float("lr", 3e-4, 3e-3, log=True),
                weight_decay=trial.suggest_float("weight_decay", 1e-6, 1e-3, log=True),
            )
            run = train_pack([config], data, seed=seed * 1000 + number, device=device, epochs=self.epochs, patience=self.patience, batch=self.batch)
            study.tell(trial, float(run.best_val_loss[0]))
            val_preds.append(run.val_pred[0])
            test_preds.append(run.test_pred[0])
            flops += run.flops
        chosen = greedy_ensemble(val_preds, data.y["val"], data.regression)
        return Fit(average(test_preds, chosen), flops, self.trials, len(set(chosen)))


@dataclass(frozen=True)
class HGBLearner:
    """scikit-learn HistGradientBoosting, early-stopped on the validation split (no FLOPs: CPU seconds only)."""

    max_iter: int = 500
    learning_rate: float = 0.1

    def fit_predict(self, data: TabularData, *, seed: int, device: torch.device) -> Fit:
        from sklearn.ensemble import HistGradientBoostingClassifier, HistGradientBoostingRegressor

        cls = HistGradientBoostingRegressor if data.regression else HistGradientBoostingClassifier
        model = cls(max_iter=self.max_iter, learning_rate=self.learning_rate, early_stopping=True, n_iter_no_change=20, random_state=seed)
        model.fit(data.x["train"], data.y["train"], X_val=data.x["val"], y_val=data.y["val"])
        pred = model.predict(data.x["test"]) if data.regression else model.predict_proba(data.x["test"])
        return Fit(np.asarray(pred), None, 1, 1, {"hgb_iters": float(model.n_iter_)})


@dataclass(frozen=True)
class TabMLearner:
    """TabM (Gorishniy et al., ICLR 2025; the ``tabm`` package): k weight-sharing MLP heads, mean of their predictions."""

    k: int = 16
    epochs: int = 40
    patience: int = 4
    batch: int = 256
    lr: float = 2e-3
    weight_decay: float = 3e-4

    def fit_predict(self, data: TabularData, *, seed: int, device: torch.device) -> Fit:
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
        return Fit(best_test, flops, 1, 1)  # type: ignore[arg-type]


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
