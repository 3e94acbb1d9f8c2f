"""The Parallel-Probe controller and self-consistency on hand-built traces: which branch is pruned, when it stops."""

from __future__ import annotations

import pytest

from paretolab.errors import ConfigError
from paretolab.plugins.parallel_probe.controller import (
    Branch,
    ProbeParams,
    majority,
    parallel_probe,
    self_consistency,
)

GRID = 4


def branch(probes: str, final: str | None = None, length: int | None = None) -> Branch:
    """A branch probed every GRID tokens: one character per probe ('.' = no answer read)."""
    answers = tuple(None if c == "." else c for c in probes)
    return Branch(length if length is not None else GRID * (len(probes) + 1), GRID, answers, final if final is not None else answers[-1])


def test_majority_ignores_unread_answers_and_breaks_ties_by_first_seen():
    assert majority(["b", None, "a", "a", "b"]) == "b"
    assert majority([None, None]) is None


def test_self_consistency_votes_final_answers_and_pays_every_token():
    branches = [branch("xxxx", "a", 20), branch("xx", "b", 12), branch("x", "a", 8)]
    out = self_consistency(branches)
    assert out.answer == "a"
    assert out.tokens_total == 40 and out.tokens_sequential == 20


def test_consensus_stops_once_the_winner_held_for_t_probes():
    branches = [branch("a" * 20, length=200) for _ in range(3)]
    for t in (1, 3):
        out = parallel_probe(branches, ProbeParams(probe_every=GRID, consensus=t, patience=9, warmup=0))
        # one opening probe, then the winner is first seen at step 0 and repeated t times
        assert out.early_stop and out.answer == "a"
        assert out.costs == [GRID * (t + 2)] * 3
        assert out.tokens_sequential == GRID * (t + 2) < 200


def test_a_changing_winner_resets_the_consensus_count():
    flip = [branch("aabbbbbbbb", length=100) for _ in range(2)]
    out = parallel_probe(flip, ProbeParams(probe_every=GRID, consensus=2, patience=9, warmup=0))
    assert out.answer == "b"
    assert out.costs == [GRID * 5] * 2  # a at probes 1-2, b from probe 3, held at 4 and 5


def test_deviant_is_pruned_after_patience_probes_once_warmup_is_over():
    agree = [branch("aaaaaaaaaaaa", length=100) for _ in range(2)]
    deviant = branch("cccccccccccc", length=100)
    params = ProbeParams(probe_every=GRID, consensus=50, patience=2, warmup=3)
    out = parallel_probe([*agree, deviant], params)
    assert out.pruned == [False, False, True]
    # steps 0-2 are warm-up; disagreements counted at steps 3 and 4 -> pruned after step 4 (6 probes taken)
    assert out.probes_taken[2] == 6 and out.costs[2] == 6 * GRID
    assert out.costs[0] == 100 and out.answer == "a"


def test_a_branch_that_returns_to_the_winner_is_not_pruned():
    agree = [branch("aaaaaaaa", length=40) for _ in range(2)]
    wobbly = branch("cacacaca", length=40)
    out = parallel_probe([*agree, wobbly], ProbeParams(probe_every=GRID, consensus=50, patience=2, warmup=0))
    assert out.pruned == [False, False, False]
    assert out.tokens_total == 120


def test_finished_branches_vote_with_their_final_answer_and_are_never_pruned():
    short = [branch("b", "b", 6), branch("b", "b", 7)]  # end before the second probe
    long = branch("aaaaaaaa", length=40)
    out = parallel_probe([*short, long], ProbeParams(probe_every=GRID, consensus=2, patience=1, warmup=0))
    assert out.answer == "b"
    assert out.costs[:2] == [6, 7]  # charged what they had left, not a full step
    assert out.pruned == [False, False, True] and out.costs[2] == 2 * GRID


def test_unread_probes_never_win_and_count_as_disagreement():
    branches = [branch("..........", length=60), branch("..........", length=60), branch("aaaaaaaaaa", length=60)]
    out = parallel_probe(branches, ProbeParams(probe_every=GRID, consensus=2, patience=1, warmup=0))
    assert out.answer == "a"
    assert out.pruned == [True, True, False]


def test_coarser_probe_every_reads_every_kth_recorded_probe():
    b = branch("abababab", "b", length=100)
    assert b.probes_every(2 * GRID) == ("b", "b", "b", "b")
    fine = parallel_probe([b], ProbeParams(probe_every=GRID, consensus=1, patience=9, warmup=0))
    coarse = parallel_probe([b], ProbeParams(probe_every=2 * GRID, consensus=1, patience=9, warmup=0))
    assert fine.costs == [100]  # a/b alternate: never stable, the branch runs to its end
    assert coarse.costs == [2 * GRID * 3] and coarse.answer == "b"
    with pytest.raises(ConfigError, match="probe_every"):
        b.probes_every(GRID + 1)


def test_chosen_branch_holds_the_winning_answer():
    branches = [branch("xxxx", length=100), branch("aaaa", length=100), branch("aaaa", length=100)]
    out = parallel_probe(branches, ProbeParams(probe_every=GRID, consensus=1, patience=9, warmup=0))
    assert out.answer == "a" and out.chosen() == 1 and out.holds[1] == 2


@pytest.mark.parametrize("bad", [{"probe_every": 0}, {"consensus": 0}, {"patience": 0}, {"warmup": -1}])
def test_bad_params_name_the_field(bad):
    with pytest.raises(ConfigError, match=next(iter(bad))):
        ProbeParams(**bad)
