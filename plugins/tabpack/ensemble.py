"""Greedy ensemble selection with replacement (Caruana et al., ICML 2004) on validation predictions."""

from __future__ import annotations

import numpy as np


def ensemble_loss(pred: np.ndarray, y: np.ndarray, regression: bool) -> float:
    """Validation loss of averaged predictions: MSE (regression) or log-loss of averaged probabilities."""
    if regression:
        return float(((pred.reshape(-1) - y) ** 2).mean())
    return float(-np.log(np.clip(pred[np.arange(len(y)), y], 1e-12, 1.0)).mean())


def greedy_ensemble(val_preds: list[np.ndarray], y_val: np.ndarray, regression: bool, rounds: int = 32) -> list[int]:
    """Indices chosen (with repeats) into ``val_preds``: start from the best single model, add whichever lowers the loss most, stop when none does."""
    losses = [ensemble_loss(p, y_val, regression) for p in val_preds]
    chosen = [int(np.argmin(losses))]
    total, best = val_preds[chosen[0]].astype(np.float64), losses[chosen[0]]
    for _ in range(rounds - 1):
        trial = [ensemble_loss((total + p) / (len(chosen) + 1), y_val, regression) for p in val_preds]
        pick = int(np.argmin(trial))
        if trial[pick] >= best:
            break
        chosen.append(pick)
        total, best = total + val_preds[pick], trial[pick]
    return chosen


def average(preds: list[np.ndarray], chosen: list[int]) -> np.ndarray:
    return np.mean([preds[i] for i in chosen], axis=0)
