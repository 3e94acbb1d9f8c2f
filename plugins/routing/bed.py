"""The routing test bed: every role model's recorded answers on one question list, split into calibration and test."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass
class Bed:
    """Per role (in the pipeline's order, the small model first): choice probabilities, predictions, hidden vectors, costs."""

    roles: list[str]
    data: dict[str, dict[str, Any]]  # role -> as_arrays(...) of paretolab.plugins.routing.answers
    gold: np.ndarray
    texts: list[str]
    cost_unit: str = "gflops"  # which recorded cost routes are judged by (gflops: estimated; seconds: replayed)
    index: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=int))  # rows of the full list this bed holds

    @property
    def small(self) -> str:
        return self.roles[0]

    def __len__(self) -> int:
        return len(self.gold)

    def cost(self, role: str) -> np.ndarray:
        return self.data[role][self.cost_unit]

    def correct(self, role: str) -> np.ndarray:
        return (self.data[role]["pred"] == self.gold).astype(float)

    def subset(self, rows: np.ndarray) -> Bed:
        data = {}
        for role, arrays in self.data.items():
            data[role] = {k: ([v[i] for i in rows] if isinstance(v, list) else v[rows]) for k, v in arrays.items()}
        return Bed(self.roles, data, self.gold[rows], [self.texts[i] for i in rows], self.cost_unit, rows)

    def split(self, calib_frac: float, seed: int) -> tuple[Bed, Bed]:
        """A seeded calibration/test split (stratified by nothing: a shuffle)."""
        order = np.random.default_rng(seed).permutation(len(self))
        cut = max(1, min(len(self) - 1, int(round(calib_frac * len(self)))))
        return self.subset(np.sort(order[:cut])), self.subset(np.sort(order[cut:]))


@dataclass
class Outcome:
    """What a router did on a bed: each question's answer and which roles' models ran."""

    answer: np.ndarray  # (n,) chosen choice index
    ran: np.ndarray  # (n, n_roles) bool

    def acc(self, bed: Bed) -> float:
        return float(np.mean(self.answer == bed.gold))

    def hits(self, bed: Bed) -> np.ndarray:
        return (self.answer == bed.gold).astype(float)

    def cost(self, bed: Bed, unit: str | None = None) -> float:
        """Mean cost per question: the sum over the roles that ran (in ``unit``, default the bed's)."""
        unit = unit or bed.cost_unit
        total = sum(self.ran[:, j] * bed.data[role][unit] for j, role in enumerate(bed.roles))
        return float(np.mean(total))
