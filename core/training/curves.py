"""Learning curves read back from a trial's MLflow run: the report and the dashboard share this.

The ``train`` stage stores a trial's curve twice: the ``learning_curve.json`` artifact
(``{"rows": [{"stage", "step", "tokens", "flops", "train_loss", "val_loss", "lr", "s"}, ...], "seed"}``,
cumulative tokens and FLOPs across train stages) and the MLflow metric histories
``curve.val_loss`` / ``curve.train_loss`` with step = cumulative tokens. The artifact is read
first (it has FLOPs); the histories are the fallback (tokens only). How the bytes are fetched is
the caller's: the report goes through its source (stores or bundles, ``results.source``), the dashboard reads its stores read-only.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

ARTIFACT = "learning_curve.json"
HISTORIES = ("curve.val_loss", "curve.train_loss")
AXES = ("tokens", "flops")
LOSSES = ("val_loss", "train_loss")


@dataclass(frozen=True)
class Curve:
    """One trial's eval points in training order; missing values are NaN."""

    rows: tuple[dict[str, float], ...]
    seed: int | None = None
    source: str = ARTIFACT  # or "metric history" (no FLOPs there)
    meta: dict[str, Any] = field(default_factory=dict, compare=False)

    def has(self, column: str) -> bool:
        return any(_finite(r.get(column)) for r in self.rows)

    def series(self, x: str, y: str) -> tuple[list[float], list[float]]:
        """The points (x, y) where both are known, in training order."""
        points = [(float(r[x]), float(r[y])) for r in self.rows if _finite(r.get(x)) and _finite(r.get(y))]
        return [p[0] for p in points], [p[1] for p in points]

    def at(self, x: str, value: float, y: str = "val_loss") -> float | None:
        """``y`` linearly interpolated at ``x = value``; None outside the curve's range (no extrapolation)."""
        xs, ys = self.series(x, y)
        if not xs or not xs[0] <= value <= xs[-1] * (1 + 1e-9):
            return None
        for (x0, y0), (x1, y1) in zip(zip(xs, ys), zip(xs[1:], ys[1:])):
            if x0 <= value <= x1:
                return y0 if x1 == x0 else y0 + (y1 - y0) * (value - x0) / (x1 - x0)
        return ys[-1]


def parse_curve(payload: Any) -> Curve | None:
    """A :class:`Curve` from the artifact's JSON (text, bytes or parsed); None when it holds no rows."""
    if isinstance(payload, (bytes, str)):
        try:
            payload = json.loads(payload)
        except ValueError:
            return None
    if not isinstance(payload, dict) or not isinstance(payload.get("rows"), list):
        return None
    rows = tuple({k: _number(v) for k, v in r.items() if k != "stage"} | {"stage": r.get("stage", "")}
                 for r in payload["rows"] if isinstance(r, dict))
    if not rows:
        return None
    seed = payload.get("seed")
    return Curve(rows, int(seed) if isinstance(seed, (int, float)) and not isinstance(seed, bool) else None, ARTIFACT)


def from_histories(histories: dict[str, list[tuple[int, float]]]) -> Curve | None:
    """A tokens-only :class:`Curve` from the ``curve.*`` metric histories (step = cumulative tokens)."""
    by_tokens: dict[int, dict[str, float]] = {}
    for key, points in histories.items():
        column = key.removeprefix("curve.")
        for step, value in points:
            by_tokens.setdefault(int(step), {"tokens": float(step)})[column] = float(value)
    if not by_tokens:
        return None
    return Curve(tuple(by_tokens[t] for t in sorted(by_tokens)), None, "metric history")


def read_curve(artifact: Callable[[], bytes | None], histories: Callable[[], dict[str, list[tuple[int, float]]]]) -> Curve | None:
    """The trial's curve: the artifact if it parses, else the metric histories, else None (a study without training)."""
    try:
        payload = artifact()
    except Exception:  # no artifact: an older train stage, or not a training trial
        payload = None
    curve = parse_curve(payload) if payload else None
    if curve is not None:
        return curve
    try:
        return from_histories(histories())
    except Exception:
        return None


def _number(value: Any) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)
