"""The Parallel-Probe controller and the self-consistency baseline, replayed over recorded branches.

Pure Python over answers, no model: a :class:`Branch` is what a recorded branch offers (its
length, the answer probed after every ``grid`` tokens before it ended, and its final answer),
and the controllers decide how many tokens each branch spends and which answer wins. Costs
follow the paper's simulator (zhengkid/Parallel-Probe, ``evaluation/data_loader.py``): a step
charges ``probe_every`` tokens to every live branch, a branch whose end comes first is charged
what it has left and votes with its final answer from then on; ``tokens_sequential`` is the
largest per-branch cost and ``tokens_total`` their sum. The probes' own tokens are not in
either (as in the paper); :attr:`Outcome.probes` counts them so they can be reported apart.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from paretolab.errors import ConfigError


@dataclass(frozen=True)
class Branch:
    """One recorded branch: ``probes[i]`` is the answer probed after ``grid * (i + 1)`` tokens."""

    length: int
    grid: int
    probes: tuple[str | None, ...]
    final: str | None

    def probes_every(self, every: int) -> tuple[str | None, ...]:
        """The probed answers after every ``every`` tokens (a multiple of the recording grid)."""
        if every < self.grid or every % self.grid:
            raise ConfigError(f"parallel_probe.probe_every must be a multiple of probe_grid={self.grid}, got {every}")
        step = every // self.grid
        return self.probes[step - 1 :: step]


@dataclass(frozen=True)
class ProbeParams:
    """The controller's knobs (N is the number of branches handed to it)."""

    probe_every: int = 16  # Δ: tokens between probes
    consensus: int = 3  # T: stop once the winner has stayed the same for T further probes
    patience: int = 3  # prune a branch that disagrees with the winner this many probes in a row
    warmup: int = 2  # probes before pruning may start

    def __post_init__(self) -> None:
        for name in ("probe_every", "consensus", "patience"):
            if getattr(self, name) < 1:
                raise ConfigError(f"parallel_probe.{name} must be >= 1, got {getattr(self, name)}")
        if self.warmup < 0:
            raise ConfigError(f"parallel_probe.warmup must be >= 0, got {self.warmup}")


@dataclass
class Outcome:
    """What a controller decided for one question."""

    answer: str | None
    costs: list[int]  # tokens each branch consumed
    current: list[str | None]  # per branch, its answer when the controller stopped
    holds: list[int | None]  # per branch, the index of that answer in its probes_every list; None: its final answer
    pruned: list[bool]
    probes_taken: list[int]  # per branch, how many probe answers the controller asked it for
    early_stop: bool = False

    @property
    def tokens_total(self) -> int:
        return sum(self.costs)

    @property
    def tokens_sequential(self) -> int:
        return max(self.costs, default=0)

    @property
    def probes(self) -> int:
        return sum(self.probes_taken)

    def chosen(self) -> int:
        """The first branch not pruned whose current answer is the winner (0 if none is)."""
        for i, (pruned, answer) in enumerate(zip(self.pruned, self.current)):
            if not pruned and answer == self.answer:
                return i
        return 0


def majority(answers: Sequence[str | None]) -> str | None:
    """The most common answer; ties go to the one seen first; None (no answer read) never wins."""
    counts = Counter(a for a in answers if a is not None)
    return counts.most_common(1)[0][0] if counts else None


def self_consistency(branches: Sequence[Branch]) -> Outcome:
    """Majority vote over every branch's final answer, each branch decoded to its end."""
    finals = [b.final for b in branches]
    n = len(branches)
    return Outcome(majority(finals), [b.length for b in branches], finals, [None] * n, [False] * n, [0] * n)


def parallel_probe(branches: Sequence[Branch], params: ProbeParams) -> Outcome:
    """Parallel-Probe: probe every Δ tokens, vote over live branches, prune deviants, stop on consensus.

    Follows the paper's controller (``ParallelESTPruningBurstMajorityOnActiveBranches``): every
    branch is probed once to start; then each step advances the live branches by Δ, votes over
    the branches not pruned (finished ones with their final answer), and — from step
    ``warmup`` on, while more than one branch is left — counts for each unfinished branch how
    many steps in a row it disagreed with the winner, pruning it at ``patience``; the winner
    is recomputed after pruning. It stops when the winner has been the same for ``consensus``
    consecutive steps, or when every branch finished or was pruned.
    """
    n = len(branches)
    if n == 0:
        raise ConfigError("parallel_probe needs at least one branch")
    lists = [b.probes_every(params.probe_every) for b in branches]
    costs = [0] * n
    taken = [0] * n  # probes consumed per branch
    finished = [False] * n
    pruned = [False] * n
    current: list[str | None] = [None] * n
    holds: list[int | None] = [None] * n
    off_track = [0] * n

    def advance(i: int) -> None:
        if taken[i] < len(lists[i]):
            current[i], holds[i] = lists[i][taken[i]], taken[i]
            taken[i] += 1
            costs[i] += params.probe_every
        else:
            current[i], holds[i] = branches[i].final, None
            costs[i] = branches[i].length
            finished[i] = True

    for i in range(n):
        advance(i)
    previous: str | None = None
    stable = 0
    step = 0
    while True:
        for i in range(n):
            if not pruned[i] and not finished[i]:
                advance(i)
        active = [i for i in range(n) if not pruned[i]]
        winner = majority([current[i] for i in active])
        if step >= params.warmup and len(active) > 1:
            for i in active:
                if finished[i]:
                    continue
                off_track[i] = off_track[i] + 1 if current[i] != winner else 0
                if off_track[i] >= params.patience:
                    pruned[i] = True
            active = [i for i in active if not pruned[i]]
            if not active:  # everyone deviated from a winner held by nobody live: keep the last winner
                return Outcome(previous, costs, current, holds, pruned, taken)
            winner = majority([current[i] for i in active])
        stable = stable + 1 if winner == previous else 0
        previous = winner
        if stable >= params.consensus:  # early only if some branch is cut short
            cut = not all(f or p for f, p in zip(finished, pruned))
            return Outcome(winner, costs, current, holds, pruned, taken, early_stop=cut)
        if all(f or p for f, p in zip(finished, pruned)):
            return Outcome(winner, costs, current, holds, pruned, taken)
        step += 1
