"""The replay buffer: no rollout served more than `reuse` times (evicted at its last use), on-policy at reuse 1, FIFO capacity."""

from __future__ import annotations

import itertools
from collections import Counter

import pytest

from paretolab.errors import ConfigError
from paretolab.training.replay import ReplayBuffer


def counter_source():
    """A generator of distinct items (ints), counting how many were made."""
    fresh = itertools.count()
    made: list[int] = []

    def generate(n: int) -> list[int]:
        items = [next(fresh) for _ in range(n)]
        made.extend(items)
        return items

    return generate, made


@pytest.mark.parametrize("reuse", [1, 2, 3, 4])
def test_never_serves_a_rollout_more_than_reuse_times_and_evicts_it_after(reuse: int) -> None:
    buffer = ReplayBuffer(reuse=reuse, capacity=32, seed=1)
    generate, made = counter_source()
    served: Counter[int] = Counter()
    for step in range(200):
        batch = buffer.take(8, step, generate)
        assert len(set(batch)) == 8  # no group twice in one update
        served.update(batch)
        held = {e.item for e in buffer.entries}
        assert not {item for item in batch if served[item] == reuse} & held  # used up: gone
    assert max(served.values()) == reuse
    assert len(made) < 200 * 8 / reuse * 1.25  # generation falls about 1/reuse
    assert buffer.stats()["rl_reuse"] == pytest.approx(sum(served.values()) / len(made))


def test_reuse_one_is_on_policy() -> None:
    buffer = ReplayBuffer(reuse=1, capacity=8)
    generate, made = counter_source()
    for step in range(5):
        batch = buffer.take(8, step, generate)
        assert batch == made[-8:]  # exactly this update's fresh rollouts
        assert not buffer.entries
    assert buffer.stats() == {"rl_reuse": 1.0, "rl_staleness": 0.0, "rl_evicted_unused": 0.0}


def test_fifo_capacity_evicts_the_oldest_even_unused() -> None:
    buffer = ReplayBuffer(reuse=4, capacity=3)
    buffer.push([1, 2, 3, 4, 5], step=0)
    assert [e.item for e in buffer.entries] == [3, 4, 5]
    assert buffer.evicted_unused == 2


def test_bad_settings_name_the_field() -> None:
    with pytest.raises(ConfigError, match="replay.reuse"):
        ReplayBuffer(reuse=0)
    with pytest.raises(ConfigError, match="replay.capacity"):
        ReplayBuffer(reuse=2, capacity=4).take(8, 0, lambda n: list(range(n)))
