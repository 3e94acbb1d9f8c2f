"""A task's examples split into a *search* part and a *confirm* part, fixed by a seed (a pipeline's ``confirm:`` block).

The search scores every trial on the search part only; ``paretolab pick`` re-measures its choice on the confirm part,
which no search-time metric read, so the choice's quality is not the winner's-curse estimate of the examples that
selected it. A task that splits its examples (``Task.splits``) asks the trial context which of its ``n`` examples
(windows, questions) belong to the trial's part: ``ctx.examples(n, "window")``.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from paretolab.errors import ConfigError

PARTS = ("search", "confirm")


@dataclass(frozen=True)
class ExampleSplit:
    """``share`` of the examples (rounded, at least one) form the confirm part, drawn by ``seed``; the rest the search part."""

    share: float
    seed: int = 0
    part: str = "search"

    def indices(self, n: int, unit: str = "example") -> list[int]:
        """The sorted indices of this part among ``n`` examples; refuses a split that leaves a part empty."""
        confirm = max(1, round(self.share * n))
        if n < 2 or confirm >= n:
            raise ConfigError(f"confirm: {n} {unit}(s) cannot be split into a search and a confirm part at share "
                              f"{self.share}; evaluate more {unit}s (the task's options) or lower confirm.share")
        order = list(range(n))
        random.Random(self.seed).shuffle(order)
        chosen = order[:confirm] if self.part == "confirm" else order[confirm:]
        return sorted(chosen)

    def describe(self, n: int, unit: str = "example") -> str:
        """``search part: 6 of 12 windows (confirm share 0.5, seed 0)``."""
        return f"{self.part} part: {len(self.indices(n, unit))} of {n} {unit}s (confirm share {self.share:g}, seed {self.seed})"

    def other(self, part: str) -> "ExampleSplit":
        if part not in PARTS:
            raise ConfigError(f"part must be one of {', '.join(PARTS)}, got {part!r}")
        return ExampleSplit(self.share, self.seed, part)
