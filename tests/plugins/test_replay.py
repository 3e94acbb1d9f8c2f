"""replay: the method contract (it attaches the buffer settings a later rl stage reads)."""

from __future__ import annotations

import pytest

from paretolab.errors import ConfigError
from paretolab.plugins.replay import Replay
from paretolab.testing import MethodContract
from paretolab.training.hooks import training_of
from paretolab.training.replay import ReplayHook


class TestReplayContract(MethodContract):
    @pytest.fixture
    def method(self) -> Replay:
        return Replay()


def test_attaches_its_settings_and_refuses_bad_ones(tiny, tmp_path) -> None:
    from paretolab import TrialContext

    ctx = TrialContext(seed=0, workdir=tmp_path)
    out = Replay().transform(tiny, {"reuse": 4, "capacity": 16}, ctx)
    (hook,) = training_of(out).of_type(ReplayHook)
    assert (hook.reuse, hook.capacity, hook.method) == (4, 16, "replay")
    with pytest.raises(ConfigError, match="replay.reuse"):
        Replay().transform(tiny.copy(), {"reuse": 0}, ctx)
